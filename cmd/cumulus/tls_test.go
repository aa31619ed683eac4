package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cumulus-serving/cumulus/internal/lograte"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/manager"
)

// TestMutualTLSEndToEnd runs a shard, a manager and a router as separate
// processes with certificates one CA signed. Predict calls over TLS are
// answered; a shard and the admin API give nothing to a plaintext
// client, a client without a certificate, or one whose certificate
// another CA signed, and the shard logs why it refused.
func TestMutualTLSEndToEnd(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "2000", "--partitions", "4").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	ca, err := tlsconf.NewCA("cluster CA")
	if err != nil {
		t.Fatal(err)
	}
	other, err := tlsconf.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *tlsconf.CA, name string, role tlsconf.Role) tlsconf.Files {
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		f, err := ca.WriteIssued(d, name, "127.0.0.1", tlsconf.Identity{Cluster: "default", Role: role}.String())
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	shardCert, mgrCert, rtCert := issue(ca, "shard", tlsconf.RoleShard), issue(ca, "manager", tlsconf.RoleManager), issue(ca, "router", tlsconf.RoleRouter)
	clientCert := issue(ca, "client", tlsconf.RoleOperator)
	stranger := issue(other, "stranger", tlsconf.RoleRouter)
	stranger.CA = clientCert.CA // it trusts the cluster, but the cluster does not trust it
	flags := func(f tlsconf.Files) []string {
		var a []string
		for _, kv := range [][2]string{{"--tls-cert", f.Cert}, {"--tls-key", f.Key}, {"--tls-ca", f.CA}} {
			if kv[1] != "" {
				a = append(a, kv[0], kv[1])
			}
		}
		return a
	}

	cli := testenv.Etcd(t)
	common := []string{"--etcd", cli.Endpoints()[0], "--log-level", "warn"}
	sh := startProcess(t, []string{"shard s0 serving on "}, append(append([]string{"shard", "--id", "s0", "--repo", repo, "--addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "s0")}, flags(shardCert)...), common...)...)
	mgr := startProcess(t, []string{"admin: https://", "probes: http://"}, append(append([]string{"manager", "--repo", repo, "--admin-addr", "127.0.0.1:0",
		"--admin-token", "t", "--probe-addr", "127.0.0.1:0"}, flags(mgrCert)...), common...)...)
	rt := startProcess(t, []string{"http: https://", "grpc: ", "probes: http://"}, append(append([]string{"router", "--http-addr", "127.0.0.1:0",
		"--grpc-addr", "127.0.0.1:0", "--probe-addr", "127.0.0.1:0"}, flags(rtCert)...), common...)...)
	shardAddr, adminAddr, frontAddr := sh.out["shard s0 serving on "], mgr.out["admin: https://"], rt.out["grpc: "]

	// Served over TLS end to end: the front checked against the CA alone
	// (it asks no client certificate without --client-ca).
	rows := filepath.Join(dir, "rows.svm")
	if err := os.WriteFile(rows, []byte("1 1:1 7:1 99:1\n0 3:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	predict := func(f tlsconf.Files) (string, error) {
		out, err := cumulus(append([]string{"predict", rows, "--addr", frontAddr, "--model", "ctr"}, flags(f)...)...).CombinedOutput()
		return string(out), err
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		out, err := predict(tlsconf.Files{CA: clientCert.CA})
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if n := len(strings.Fields(out)); n != 2 {
			return fmt.Errorf("%d scores: %s", n, out)
		}
		return nil
	})
	if out, err := predict(tlsconf.Files{}); err == nil {
		t.Errorf("a plaintext predict call to a TLS front was answered: %s", out)
	}
	// Probes and scrapers need no certificate, on their own address.
	for _, p := range []*process{mgr, rt} {
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := http.Get("http://" + p.out["probes: http://"] + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || path == "/metrics" && !strings.Contains(string(b), "\ngo_goroutines ") {
				t.Errorf("%s%s: %s\n%.300s", p.out["probes: http://"], path, resp.Status, b)
			}
		}
	}
	// A front with --client-ca answers only clients with a certificate it
	// signed.
	rt2 := startProcess(t, []string{"http: https://", "grpc: "}, append(append([]string{"router", "--http-addr", "127.0.0.1:0",
		"--grpc-addr", "127.0.0.1:0", "--client-ca", clientCert.CA}, flags(rtCert)...), common...)...)
	frontAddr = rt2.out["grpc: "]
	testenv.Eventually(t, 30*time.Second, func() error {
		if out, err := predict(clientCert); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	for name, f := range map[string]tlsconf.Files{"no client certificate": {CA: clientCert.CA}, "another CA's certificate": stranger} {
		if out, err := predict(f); err == nil {
			t.Errorf("front with --client-ca: a client with %s was answered: %s", name, out)
		}
	}

	// The shard: only the cluster's routers and managers get an answer.
	health := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(shardAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	clientTLS := func(f tlsconf.Files) credentials.TransportCredentials {
		src, err := tlsconf.Load(t.Context(), f)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(src.Client("127.0.0.1"))
	}
	if err := health(clientTLS(rtCert)); err != nil {
		t.Fatalf("a router of the cluster's CA: %v", err)
	}
	refused := map[string]credentials.TransportCredentials{
		"plaintext":                insecure.NewCredentials(),
		"operator's certificate":   clientTLS(clientCert),
		"no client certificate":    clientTLS(tlsconf.Files{CA: clientCert.CA}),
		"another CA's certificate": clientTLS(stranger),
	}
	for name, creds := range refused {
		if err := health(creds); err == nil {
			t.Errorf("shard: a %s client was answered", name)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(sh.stderr.String(), "shard s0: refused a connection") {
			return fmt.Errorf("the shard logged no refusal:\n%s", sh.stderr)
		}
		return nil
	})
	// A router whose certificate another CA signed gets nothing from the
	// shard, and says why in its log.
	otherCA := filepath.Join(dir, "other-ca.pem")
	if err := os.WriteFile(otherCA, other.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	intruder := startProcess(t, []string{"grpc: "}, append(append([]string{"router", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"},
		flags(stranger)...), common...)...)
	frontAddr = intruder.out["grpc: "]
	var answer string
	testenv.Eventually(t, 30*time.Second, func() error {
		out, err := predict(tlsconf.Files{CA: otherCA})
		if err == nil {
			t.Fatalf("a router of another CA got scores from the shard: %s", out)
		}
		answer = out
		if log := intruder.stderr.String(); !strings.Contains(log, "router: shard call failed") || !strings.Contains(log, "certificate") {
			return fmt.Errorf("the router logged no failed shard call naming the certificate:\n%s", log)
		}
		if m := answerID.FindStringSubmatch(out); m == nil || !strings.Contains(logOf(intruder), "id="+m[1]+" ") {
			return fmt.Errorf("no request id in the answer, or not logged yet: %s", out)
		}
		return nil
	})
	// Its client is told no TLS message, shard or address; the router's
	// log has them under the request id.
	checkFailure(t, answer, answerID.FindStringSubmatch(answer)[1], logOf(intruder),
		[]string{"certificate", "tls", "x509", "s0", shardAddr, "127.0.0.1"}, []string{"certificate"})
	frontAddr = rt.out["grpc: "]

	// The admin API: likewise.
	admin := func(f tlsconf.Files) (string, error) {
		out, err := cumulus(append([]string{"admin", "models", "--addr", adminAddr, "--admin-token", "t"}, flags(f)...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := admin(clientCert); err != nil || !strings.Contains(out, "ctr") {
		t.Fatalf("admin models with the cluster's certificate: %v\n%s", err, out)
	}
	for name, f := range map[string]tlsconf.Files{"no client certificate": {CA: clientCert.CA}, "another CA's certificate": stranger, "a router's certificate": rtCert} {
		if out, err := admin(f); err == nil {
			t.Errorf("admin API: a client with %s was answered: %s", name, out)
		}
	}
	if out, err := cumulus("admin", "models", "--addr", "http://"+adminAddr, "--admin-token", "t").CombinedOutput(); err == nil {
		t.Errorf("admin API: a plaintext client was answered: %s", out)
	}
}

// TestDevTLS: cumulus dev --tls serves with a throwaway CA, and prints
// the flags its clients need; without them a client gets nothing.
func TestDevTLS(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "2000", "--partitions", "4").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	dev := startProcess(t, []string{"tls: ", "etcd: ", "grpc: ", "admin: https://", "ready"}, "dev", "--tls", "--repo", repo, "--shards", "2",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--admin-token", "t", "--log-level", "warn")
	tlsArgs := strings.Fields(dev.out["tls: "])
	admin, _, _ := strings.Cut(dev.out["admin: https://"], " ")
	rows := filepath.Join(dir, "rows.svm")
	if err := os.WriteFile(rows, []byte("1 1:1 7:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := cumulus(append([]string{"predict", rows, "--addr", dev.out["grpc: "], "--model", "ctr"}, tlsArgs...)...).CombinedOutput(); err != nil || len(strings.Fields(string(out))) != 1 {
		t.Fatalf("predict with dev's TLS flags: %v\n%s", err, out)
	}
	if out, err := cumulus(append([]string{"admin", "models", "--addr", admin, "--admin-token", "t"}, tlsArgs...)...).CombinedOutput(); err != nil || !strings.Contains(string(out), "ctr") {
		t.Fatalf("admin with dev's TLS flags: %v\n%s", err, out)
	}
	if out, err := cumulus("predict", rows, "--addr", dev.out["grpc: "], "--model", "ctr").CombinedOutput(); err == nil {
		t.Errorf("a plaintext predict call was answered: %s", out)
	}
	// --tls-server-name: the certificate is checked against that name,
	// not the address's host (dev's names 127.0.0.1 and localhost).
	if out, err := cumulus(append([]string{"admin", "models", "--addr", admin, "--admin-token", "t", "--tls-server-name", "localhost"}, tlsArgs...)...).CombinedOutput(); err != nil || !strings.Contains(string(out), "ctr") {
		t.Errorf("admin with --tls-server-name localhost: %v\n%s", err, out)
	}
	if out, err := cumulus("admin", "models", "--addr", admin, "--admin-token", "t", "--tls-server-name", "localhost").CombinedOutput(); err == nil || !strings.Contains(string(out), "give --tls-ca") {
		t.Errorf("--tls-server-name without --tls-ca: %v\n%s", err, out)
	}
	for _, c := range [][]string{{"admin", "models", "--addr", admin, "--admin-token", "t"}, {"predict", rows, "--addr", dev.out["grpc: "], "--model", "ctr"}} {
		out, err := cumulus(append(append(c, "--tls-server-name", "cumulus-manager.cumulus.svc"), tlsArgs...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "cumulus-manager.cumulus.svc") {
			t.Errorf("%s with a --tls-server-name the certificate lacks: %v\n%s", c[0], err, out)
		}
	}
	if out, err := cumulus("admin", "models", "--addr", admin, "--admin-token", "t").CombinedOutput(); err == nil {
		t.Errorf("a plaintext admin call was answered: %s", out)
	}

	// The console is served under the admin API's mutual TLS: to a client
	// presenting an operator's certificate (as a browser does, once the
	// certificate is installed), not to one presenting none. Its traffic
	// figures come from the router's metrics, read over TLS.
	op, err := tlsconf.Load(t.Context(), tlsconf.Files{CA: tlsArgs[1], Cert: tlsArgs[3], Key: tlsArgs[5]})
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(admin)
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: op.Client(host)}}
	resp, err := withCert.Get("https://" + admin + "/console/")
	if err != nil || resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("the console to an operator's certificate: %v %v", resp, err)
	}
	resp.Body.Close()
	testenv.Eventually(t, 20*time.Second, func() error {
		req, _ := http.NewRequest(http.MethodGet, "https://"+admin+"/admin/v1/console", nil)
		req.Header.Set("Authorization", "Bearer t")
		resp, err := withCert.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var v manager.ConsoleView
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			return err
		}
		if len(v.Routers) != 1 || !strings.HasPrefix(v.Routers[0].Metrics, "https://") || v.Routers[0].MetricsError != "" || len(v.Traffic) == 0 {
			return fmt.Errorf("routers %+v, traffic %+v", v.Routers, v.Traffic)
		}
		return nil
	})
	noCert, err := tlsconf.Load(t.Context(), tlsconf.Files{CA: tlsArgs[1]})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: noCert.Client(host)}}).Get("https://" + admin + "/console/"); err == nil {
		resp.Body.Close()
		t.Errorf("the console answered a client without a certificate: %s", resp.Status)
	}

	// etcd too: a shard process with dev's files for etcd (etcd.pem) and
	// for a shard (shard.pem), beside the operator's, joins; a client
	// without a certificate gets nothing.
	etcd := dev.out["etcd: "]
	if !strings.HasPrefix(etcd, "https://") {
		t.Fatalf("dev --tls serves etcd at %s", etcd)
	}
	pki := filepath.Dir(tlsArgs[1])
	role := func(prefix, name string) []string {
		return []string{prefix + "-cert", filepath.Join(pki, name+".pem"), prefix + "-key", filepath.Join(pki, name+"-key.pem"), prefix + "-ca", filepath.Join(pki, "ca.pem")}
	}
	startProcess(t, []string{"shard s9 serving on "}, append(append([]string{"shard", "--id", "s9", "--repo", repo, "--addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "s9"), "--etcd", etcd, "--log-level", "warn"}, role("--etcd", "etcd")...), role("--tls", "shard")...)...)
	testenv.Eventually(t, 30*time.Second, func() error {
		out, err := cumulus(append([]string{"admin", "shards", "--addr", admin, "--admin-token", "t"}, tlsArgs...)...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "s9") {
			return fmt.Errorf("s9 not listed: %v\n%s", err, out)
		}
		return nil
	})
	files := tlsconf.Files{CA: tlsArgs[1]}
	src, err := tlsconf.Load(t.Context(), files)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := src.ClientAnyName()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, TLS: cfg, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "/cumulus/", clientv3.WithPrefix()); err == nil {
		t.Error("etcd answered a client without a certificate")
	}
}

// TestRefusalsDoNotFloodTheLog: 60 admin calls with a wrong token are
// all refused, and the warning is logged lograte.Burst times, not 60.
func TestRefusalsDoNotFloodTheLog(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	dev := startProcess(t, []string{"admin: http://"}, "dev", "--repo", repo, "--shards", "1", "--http-addr", "127.0.0.1:0",
		"--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--admin-token", "right", "--log-level", "warn")
	admin, _, _ := strings.Cut(dev.out["admin: http://"], " ")
	for range 60 {
		req, err := http.NewRequest("GET", "http://"+admin+"/admin/v1/models", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer wrong")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a wrong token: %s", resp.Status)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := strings.Count(dev.stderr.String(), "admin call refused"); n != lograte.Burst {
			return fmt.Errorf("%d refusals logged, want %d", n, lograte.Burst)
		}
		return nil
	})
}

// TestTLSFlagsRefusePlaintext: TLS flags with an http:// address are
// refused before anything is sent (etcd's client, and the admin client
// with its token, would otherwise go in plaintext).
func TestTLSFlagsRefusePlaintext(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconf.NewCA("CA")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ca.WriteIssued(dir, "c", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cumulus("shard", "--id", "x", "--repo", dir, "--etcd", "http://127.0.0.1:9", "--etcd-cert", f.Cert, "--etcd-key", f.Key,
		"--etcd-ca", f.CA).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "need https:// endpoints") {
		t.Errorf("--etcd-* with an http:// endpoint: %v\n%s", err, out)
	}
	out, err = cumulus("admin", "models", "--addr", "http://127.0.0.1:9", "--admin-token", "secret", "--tls-ca", f.CA).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "would go in plaintext") {
		t.Errorf("admin --tls-* with an http:// address: %v\n%s", err, out)
	}
}
