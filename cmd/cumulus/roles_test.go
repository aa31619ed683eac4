package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/shard"
)

// TestRolesInCertificates: with cumulus dev --tls, every endpoint that
// checks roles against a certificate of every role, one of the CA with
// no role, none at all, and one of another CA with the right role. Each
// cell is asserted: the right roles are answered, every other is
// refused, and the refusals are logged with the role seen and wanted.
func TestRolesInCertificates(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "2000", "--partitions", "4").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	dev := startProcess(t, []string{"tls: ", "etcd: ", "shard: ", "admin: https://", "push: https://", "model: ctr version ", "ready"}, "dev", "--tls", "--repo", repo,
		"--shards", "2", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--admin-token", "t",
		"--push-addr", "127.0.0.1:0", "--push-token", "pt", "--log-level", "warn")
	tlsArgs := strings.Fields(dev.out["tls: "])
	pki := filepath.Dir(tlsArgs[1])
	files := func(name string) tlsconf.Files {
		return tlsconf.Files{Cert: filepath.Join(pki, name+".pem"), Key: filepath.Join(pki, name+"-key.pem"), CA: filepath.Join(pki, "ca.pem")}
	}
	adminAddr, _, _ := strings.Cut(dev.out["admin: https://"], " ")
	pushAddr, _, _ := strings.Cut(dev.out["push: https://"], " ")
	shardAddr := strings.Fields(dev.out["shard: "])[1]
	version, err := strconv.ParseUint(strings.Fields(dev.out["model: ctr version "])[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}

	// A shard process of its own, for its HTTP surface (dev serves
	// none): the fault API and the probes, on HTTPS.
	flags := func(prefix string, f tlsconf.Files) []string {
		return []string{prefix + "-cert", f.Cert, prefix + "-key", f.Key, prefix + "-ca", f.CA}
	}
	sh := startProcess(t, []string{"shard s9 serving on ", "http: https://"}, append(append([]string{"shard", "--id", "s9", "--repo", repo,
		"--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-token", "t", "--data-dir", filepath.Join(dir, "s9"),
		"--etcd", dev.out["etcd: "], "--log-level", "warn"}, flags("--etcd", files("etcd"))...), flags("--tls", files("shard"))...)...)

	// Another CA, trusting the cluster's, with certificates of the right
	// roles.
	other, err := tlsconf.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	strangers := map[tlsconf.Role]tlsconf.Files{}
	for _, r := range []tlsconf.Role{tlsconf.RoleRouter, tlsconf.RoleOperator, tlsconf.RoleTrainer} {
		d := filepath.Join(dir, "other-"+string(r))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		f, err := other.WriteIssued(d, string(r), "127.0.0.1", tlsconf.Identity{Cluster: "default", Role: r}.String())
		if err != nil {
			t.Fatal(err)
		}
		f.CA = files("shard").CA
		strangers[r] = f
	}
	client := func(f tlsconf.Files) *tls.Config {
		src, err := tlsconf.Load(t.Context(), f)
		if err != nil {
			t.Fatal(err)
		}
		return src.Client("127.0.0.1")
	}

	// The endpoints: each says how a call fared: "answered", "refused"
	// (the connection: its TLS handshake failed), "403" (the role
	// checked per call), or what else happened, which no cell wants.
	lookup := func(cfg *tls.Config) string {
		conn, err := grpc.NewClient(shardAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return err.Error()
		}
		defer conn.Close()
		// The shard holds some of the 4 partitions: one answer is enough.
		var errs []string
		for p := range uint32(4) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := shard.NewClient(conn).Lookup(ctx, codec.AppendLookupRequest(nil, "ctr", version, []codec.Section{{Partition: p, Keys: []uint64{1, 7}}}))
			cancel()
			switch {
			case err == nil:
				return "answered"
			case status.Code(err) == codes.Unavailable:
				return "refused: " + err.Error()
			}
			errs = append(errs, err.Error())
		}
		return fmt.Sprintf("no partition answered: %v", errs)
	}
	call := func(method, url, token, body string) func(*tls.Config) string {
		return func(cfg *tls.Config) string {
			req, err := http.NewRequest(method, url, strings.NewReader(body))
			if err != nil {
				return err.Error()
			}
			req.Header.Set("Authorization", "Bearer "+token)
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
			defer c.CloseIdleConnections()
			resp, err := c.Do(req)
			if err != nil {
				return "refused: " + err.Error()
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK:
				return "answered"
			case resp.StatusCode == http.StatusForbidden && strings.Contains(string(b), "operator's certificate"):
				return "403"
			}
			return fmt.Sprintf("%s: %s", resp.Status, b)
		}
	}
	get := func(url string) func(*tls.Config) string { return call("GET", url, "t", "") }
	rows := []string{"shard", "router", "manager", "operator", "trainer", "no role", "no certificate", "another CA"}
	endpoints := []struct {
		name string
		call func(*tls.Config) string
		want map[string]string // by row; unlisted: "refused"
		role tlsconf.Role      // another CA's certificate has this role
	}{
		{"shard lookups (gRPC)", lookup, map[string]string{"router": "answered", "manager": "answered"}, tlsconf.RoleRouter},
		{"admin API", get("https://" + adminAddr + "/admin/v1/models"), map[string]string{"operator": "answered"}, tlsconf.RoleOperator},
		{"push API", call("POST", "https://"+pushAddr+"/push/v1/models/ctr", "pt", `{"parameters":{"producer":"roles","sequence":1}}`),
			map[string]string{"trainer": "answered"}, tlsconf.RoleTrainer},
		// A certificate of the CA gets in; the call checks the role.
		{"shard fault API (HTTPS)", get("https://" + sh.out["http: https://"] + "/admin/v1/fault"), map[string]string{"operator": "answered",
			"shard": "403", "router": "403", "manager": "403", "trainer": "403", "no role": "403", "no certificate": "403"}, tlsconf.RoleOperator},
		{"shard probe (HTTPS)", get("https://" + sh.out["http: https://"] + "/healthz"), map[string]string{"shard": "answered", "router": "answered",
			"manager": "answered", "operator": "answered", "trainer": "answered", "no role": "answered", "no certificate": "answered"}, tlsconf.RoleOperator},
	}
	for _, e := range endpoints {
		for _, row := range rows {
			var cfg *tls.Config
			switch row {
			case "no role":
				cfg = client(files("etcd")) // the CA's, with no SPIFFE ID
			case "no certificate":
				cfg = client(tlsconf.Files{CA: files("shard").CA})
			case "another CA":
				cfg = client(strangers[e.role])
			default:
				cfg = client(files(row))
			}
			got := e.call(cfg)
			t.Logf("%s, %s: %.160s", e.name, row, got)
			want := e.want[row]
			if want == "" {
				want = "refused"
			}
			if kind, _, _ := strings.Cut(got, ":"); kind != want {
				t.Errorf("%s, %s: %s; want %s", e.name, row, got, want)
			}
		}
	}

	// cumulus push, gRPC over mutual TLS: a trainer's certificate
	// pushes, an operator's does not.
	tsv := filepath.Join(dir, "rows.tsv")
	os.WriteFile(tsv, []byte("type lr\n3\t0.5\n"), 0o644)
	for _, c := range []struct {
		role string
		ok   bool
	}{{"trainer", true}, {"operator", false}} {
		args := append([]string{"push", "--addr", pushAddr, "--push-token", "pt", "--model", "ctr", "--retry-for", "0s", tsv}, flags("--tls", files(c.role))...)
		out, err := cumulus(args...).CombinedOutput()
		if (err == nil) != c.ok {
			t.Errorf("cumulus push with the %s's certificate: %v\n%s", c.role, err, out)
		}
	}

	// Refusals are logged with the role seen and the role wanted.
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, l := range []struct {
			p    *process
			want string
		}{
			{dev, "has role operator; wanted the role [router manager]"},
			{dev, "has role router; wanted the role [operator]"},
			{sh, "has role trainer; wanted the role [operator]"},
		} {
			if !strings.Contains(l.p.stderr.String(), l.want) {
				return fmt.Errorf("not logged: %q", l.want)
			}
		}
		return nil
	})
}
