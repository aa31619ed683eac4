package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// unit is a systemd unit file's settings, by key (a key may repeat).
type unit map[string][]string

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not KEY=VALUE", path, line)
		}
		u[k] = append(u[k], v)
	}
	return u
}

// addrFlags are the flags whose value is a listen or advertised address.
var addrFlags = map[string]bool{"--addr": true, "--advertise": true, "--grpc-addr": true, "--http-addr": true, "--admin-addr": true, "--probe-addr": true, "--push-addr": true,
	"--raft-addr": true, "--raft-advertise": true}

// advertiseFlags are the address flags that name where peers dial, not
// where the process listens.
var advertiseFlags = map[string]bool{"--advertise": true, "--raft-advertise": true}

// TestSystemdUnits checks deploy/systemd as a user would meet it: every
// flag a unit passes exists in that command's --help, every address has
// a port that exists once systemd fills in the instance (a shard unit's
// instance is its port), the network is waited for and wanted, nothing
// runs as root, shards get a data directory and a memory budget, stops
// wait for the drain; and systemd-analyze verify accepts each unit.
func TestSystemdUnits(t *testing.T) {
	units, err := filepath.Glob("../../deploy/systemd/*.service")
	if err != nil || len(units) != 3 {
		t.Fatalf("units: %v %v", units, err)
	}
	help := helpText{}
	for _, path := range units {
		name := filepath.Base(path)
		u := readUnit(t, path)
		if len(u["ExecStart"]) != 1 {
			t.Fatalf("%s: %d ExecStart lines", name, len(u["ExecStart"]))
		}
		if strings.Contains(u["ExecStart"][0], "$CREDENTIALS_DIRECTORY") || strings.Contains(u["ExecStart"][0], "$STATE_DIRECTORY") {
			t.Errorf("%s: systemd expands $VAR only as a word of its own: write ${VAR}", name)
		}
		// The values systemd gives: %i the instance (a port), %H the
		// host, and the directories it makes.
		exec := strings.NewReplacer("%i", "7100", "%H", "host-a", "${STATE_DIRECTORY}", "/var/lib/cumulus/shard-7100",
			"${CREDENTIALS_DIRECTORY}", "/run/credentials/x").Replace(u["ExecStart"][0])
		args := strings.Fields(exec)
		if args[0] != "/usr/local/bin/cumulus" || len(args) < 2 {
			t.Fatalf("%s: ExecStart %q", name, exec)
		}
		cmd := args[1]
		flags := checkFlags(t, name, cmd, args[2:], help)
		if !strings.Contains(strings.Join(u["Wants"], " "), "network-online.target") || !strings.Contains(strings.Join(u["After"], " "), "network-online.target") {
			t.Errorf("%s: wants and waits for network-online.target? Wants=%v After=%v", name, u["Wants"], u["After"])
		}
		if (len(u["DynamicUser"]) == 0 || u["DynamicUser"][0] != "yes") && (len(u["User"]) == 0 || u["User"][0] == "root") {
			t.Errorf("%s: runs as root", name)
		}
		if len(u["TimeoutStopSec"]) == 0 {
			t.Errorf("%s: no TimeoutStopSec: the drain needs a bound time before SIGKILL", name)
		}
		if flags["--tls-cert"] == "" || flags["--etcd-cert"] == "" || !strings.HasPrefix(flags["--etcd"], "https://") {
			t.Errorf("%s: not mutual TLS between the processes and with etcd", name)
		}
		// Each credential a flag names is one the unit loads.
		loaded := map[string]bool{}
		for _, c := range u["LoadCredential"] {
			id, _, _ := strings.Cut(c, ":")
			loaded[id] = true
		}
		for f, v := range flags {
			if id, ok := strings.CutPrefix(v, "/run/credentials/x/"); ok && !loaded[id] {
				t.Errorf("%s: %s %s: no LoadCredential=%s", name, f, v, id)
			}
		}
		// Its certificate is its role's (deploy/issue-cert.sh).
		for _, c := range u["LoadCredential"] {
			if id, file, _ := strings.Cut(c, ":"); id == "tls-cert" && filepath.Base(file) != cmd+".crt" {
				t.Errorf("%s: LoadCredential=%s: want the %s's certificate, %s.crt", name, c, cmd, cmd)
			}
		}
		if cmd == "shard" && (flags["--data-dir"] == "" || flags["--memory-budget"] == "") {
			t.Errorf("%s: a shard needs --data-dir (else its copies go to /tmp) and --memory-budget", name)
		}
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed: the units were checked by the reading above only")
		return
	}
	// verify checks the executable exists: point the units at this
	// test binary; a template needs an instance.
	dir := t.TempDir()
	for _, path := range units {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.Replace(filepath.Base(path), "@.", "@7100.", 1)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.ReplaceAll(string(b), "/usr/local/bin/cumulus", os.Args[0])), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", filepath.Join(dir, name)).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
	}
}

// TestIssueCert: deploy/issue-cert.sh issues, with openssl, certificates
// the processes take: each role's SPIFFE ID in the cluster given, the
// SANs asked for, signed by the CA it made on first use; and refuses a
// role it does not know.
func TestIssueCert(t *testing.T) {
	testenv.Tool(t, "openssl")
	dir := t.TempDir()
	issue := func(args ...string) ([]byte, error) {
		return exec.Command("bash", append([]string{"../../deploy/issue-cert.sh", dir}, args...)...).CombinedOutput()
	}
	for _, r := range tlsconf.Roles {
		if out, err := issue("prod", string(r), "host-"+string(r), "IP:10.0.0.10", "DNS:host-a.example"); err != nil {
			t.Fatalf("issue-cert %s: %v\n%s", r, err, out)
		}
	}
	if out, err := issue("prod", "none", "etcd", "IP:10.0.0.2"); err != nil {
		t.Fatalf("issue-cert none: %v\n%s", err, out)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	read := func(name string) *x509.Certificate {
		c := readCert(t, filepath.Join(dir, name+".crt"))
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s.crt: as a client: %v", name, err)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: "10.0.0.10", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil && name != "etcd" {
			t.Errorf("%s.crt: as a server for 10.0.0.10: %v", name, err)
		}
		if _, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")); err != nil {
			t.Errorf("%s: certificate and key: %v", name, err)
		}
		return c
	}
	for _, r := range tlsconf.Roles {
		c := read("host-" + string(r))
		id, ok, err := tlsconf.IdentityOf(c)
		if err != nil || !ok || id != (tlsconf.Identity{Cluster: "prod", Role: r, ID: "host-" + string(r)}) {
			t.Errorf("host-%s.crt: %v %v %v, want spiffe://prod/%s/host-%s", r, id, ok, err, r, r)
		}
		if len(c.DNSNames) != 1 || c.DNSNames[0] != "host-a.example" {
			t.Errorf("host-%s.crt: DNS names %v", r, c.DNSNames)
		}
	}
	if _, ok, err := tlsconf.IdentityOf(read("etcd")); ok || err != nil {
		t.Errorf("etcd.crt: a role (%v, %v), want none", ok, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"prod", "admin", "x", "IP:10.0.0.1"}, "role admin"},
		{[]string{"prod", "shard", "ca", "IP:10.0.0.1"}, "not ca"},
		{[]string{"prod", "none", "x", "IP:10.0.0.1,URI:spiffe://prod/operator"}, "use IP:ADDRESS or DNS:NAME"},
		{[]string{"prod", "none", "x", "DNS:a\nbasicConstraints=CA:TRUE"}, "use IP:ADDRESS or DNS:NAME"},
		{[]string{"prod/x", "shard", "x", "IP:10.0.0.1"}, "letters, digits or '-'"},
	} {
		if out, err := issue(c.args...); err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("issue-cert %q: %v\n%s; want refused with %q", c.args, err, out, c.want)
		}
	}
	// The trust domain is the cluster's name in lowercase, as the
	// processes check it.
	if out, err := issue("Prod", "router", "upper", "IP:10.0.0.10"); err != nil {
		t.Fatalf("issue-cert Prod: %v\n%s", err, out)
	}
	if id, ok, err := tlsconf.IdentityOf(read("upper")); err != nil || !ok || id.Cluster != "prod" {
		t.Errorf("cluster Prod: %v %v %v, want spiffe://prod/router/upper", id, ok, err)
	}
}

// readCert reads the first certificate of a PEM file.
func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}
