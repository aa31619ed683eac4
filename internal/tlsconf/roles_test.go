package tlsconf_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// certOf parses the certificate of certPEM.
func certOf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(certPEM)
	if blk == nil {
		t.Fatal("no PEM block")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func spiffe(cluster string, r tlsconf.Role) string {
	return tlsconf.Identity{Cluster: cluster, Role: r}.String()
}

func TestIdentityOf(t *testing.T) {
	ca := newCA(t, "cluster CA")
	for _, c := range []struct {
		sans []string
		want string // the identity, "" for none, or "error: ..." naming the problem
	}{
		{nil, ""},
		{[]string{"https://example.com/x"}, ""}, // a URI, but no SPIFFE ID
		{[]string{"spiffe://prod/shard"}, "spiffe://prod/shard"},
		{[]string{"spiffe://prod/shard/shard-7"}, "spiffe://prod/shard/shard-7"},
		{[]string{"SPIFFE://prod/router"}, "spiffe://prod/router"}, // a scheme is any case
		{[]string{"spiffe://Prod/router"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://prod/%6Fperator"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://prod/shard/.."}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://prod/shard/a b"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://prod/shard/Shard-7.a_b"}, "spiffe://prod/shard/Shard-7.a_b"},
		{[]string{"spiffe://prod/router", "https://example.com/x"}, "error: no other"},
		{[]string{"spiffe://prod/shard", "spiffe://prod/operator"}, "error: no other"},
		{[]string{"spiffe://prod/admin"}, `error: role "admin"`},
		{[]string{"spiffe://prod/"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://prod/shard/a/b"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://prod/shard/"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://prod:8443/shard"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://prod/shard?x=1"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe://u@prod/shard"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
		{[]string{"spiffe:///shard"}, "error: not spiffe://CLUSTER/ROLE[/ID]"},
	} {
		certPEM, _, err := ca.Issue("x", c.sans...)
		if err != nil {
			t.Fatal(err)
		}
		id, ok, err := tlsconf.IdentityOf(certOf(t, certPEM))
		var got string
		switch {
		case err != nil:
			got = "error: " + err.Error()
		case ok:
			got = id.String()
		}
		if want, isErr := strings.CutPrefix(c.want, "error: "); isErr {
			if err == nil || !strings.Contains(got, want) {
				t.Errorf("%v: %q, want an error saying %q", c.sans, got, want)
			}
		} else if got != c.want {
			t.Errorf("%v: %q, want %q", c.sans, got, c.want)
		}
	}
}

func TestParseRoleMode(t *testing.T) {
	for _, m := range []tlsconf.RoleMode{tlsconf.RolesEnforce, tlsconf.RolesWarn, tlsconf.RolesOff} {
		if got, err := tlsconf.ParseRoleMode(m.String()); err != nil || got != m {
			t.Errorf("ParseRoleMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := tlsconf.ParseRoleMode("strict"); err == nil || !strings.Contains(err.Error(), "enforce, warn or off") {
		t.Errorf("ParseRoleMode(strict): %v", err)
	}
}

// logs collects what slog writes while a test runs.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func captureLogs(t *testing.T) *logs {
	l := &logs{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(l, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return l
}

// TestServerRoles: a server taking routers and managers, in each mode,
// against a client of every role, one without a role, one of another
// cluster and one of another CA.
func TestServerRoles(t *testing.T) {
	ca, other := newCA(t, "cluster CA"), newCA(t, "another CA")
	clients := map[string]*tlsconf.Source{
		"no role":         issued(t, ca, "old"),
		"another cluster": issued(t, ca, "staging router", spiffe("staging", tlsconf.RoleRouter)),
		"another CA":      issued(t, other, "stranger", spiffe("prod", tlsconf.RoleRouter)),
	}
	for _, r := range tlsconf.Roles {
		clients[string(r)] = issued(t, ca, string(r), spiffe("prod", r))
	}
	accept := []tlsconf.Role{tlsconf.RoleRouter, tlsconf.RoleManager}
	want := map[tlsconf.RoleMode]map[string]string{ // "" answered, else in the server's error
		tlsconf.RolesEnforce: {"router": "", "manager": "", "shard": "has role shard; wanted the role [router manager]",
			"operator": "has role operator", "trainer": "has role trainer", "no role": "names no role (a URI SAN spiffe://prod/ROLE)",
			"another cluster": `of cluster "staging", not of "prod"`, "another CA": "not one this process trusts"},
		tlsconf.RolesWarn: {"router": "", "manager": "", "shard": "", "operator": "", "trainer": "", "no role": "", "another cluster": "",
			"another CA": "not one this process trusts"},
		tlsconf.RolesOff: {"router": "", "manager": "", "shard": "", "operator": "", "trainer": "", "no role": "", "another cluster": "",
			"another CA": "not one this process trusts"},
	}
	// What warn logs of each client enforce refuses for its role.
	warned := map[string]string{"shard": "has role shard", "operator": "has role operator", "trainer": "has role trainer",
		"no role": "names no role", "another cluster": "staging"}
	for mode, cells := range want {
		srv := issued(t, ca, "shard", spiffe("prod", tlsconf.RoleShard))
		srv.SetRoles("prod", mode)
		addr, outcomes := server(t, srv.Server(accept...))
		l := captureLogs(t)
		for name, wantErr := range cells {
			cfg := clients["router"].Client("127.0.0.1") // trusts the server
			cfg.GetClientCertificate = clients[name].Client("127.0.0.1").GetClientCertificate
			got, err := dial(addr, cfg)
			serr := <-outcomes
			switch {
			case wantErr == "" && (err != nil || serr != nil || got != "model weights\n"):
				t.Errorf("%s, a %s client: %q, %v (server: %v); want an answer", mode, name, got, err, serr)
			case wantErr != "" && (err == nil || serr == nil || !strings.Contains(serr.Error(), wantErr)):
				t.Errorf("%s, a %s client: %q, %v; server %v, want a refusal saying %q", mode, name, got, err, serr, wantErr)
			}
			if w, ok := warned[name]; ok && mode == tlsconf.RolesWarn && !strings.Contains(l.String(), w) {
				t.Errorf("warn, a %s client: not logged as one enforce would refuse (%q):\n%s", name, w, l)
			}
		}
		if mode == tlsconf.RolesWarn && strings.Contains(l.String(), "has role router;") {
			t.Errorf("warn: a router was logged:\n%s", l)
		}
	}

	// A server whose process never said its cluster refuses every role,
	// saying so: roles cannot be checked without one.
	srv := issued(t, ca, "shard")
	addr, outcomes := server(t, srv.Server(accept...))
	if _, err := dial(addr, clients["router"].Client("127.0.0.1")); err == nil {
		t.Error("a server with no cluster answered")
	}
	if serr := <-outcomes; serr == nil || !strings.Contains(serr.Error(), "knows no cluster") {
		t.Errorf("a server with no cluster: %v", serr)
	}
}

// TestServerAsking: a server that asks for a certificate answers a
// client without one, refuses one of another CA, and Allow tells its
// handlers each connection's role.
func TestServerAsking(t *testing.T) {
	ca, other := newCA(t, "cluster CA"), newCA(t, "another CA")
	srv := issued(t, ca, "shard", spiffe("prod", tlsconf.RoleShard))
	srv.SetRoles("prod", tlsconf.RolesEnforce)
	lis, err := tls.Listen("tcp", "127.0.0.1:0", srv.ServerAsking())
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	type outcome struct {
		allow error
		hs    error
	}
	out := make(chan outcome, 1)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			if err := tc.Handshake(); err != nil {
				out <- outcome{hs: err}
			} else {
				cs := tc.ConnectionState()
				out <- outcome{allow: srv.Allow(&cs, tlsconf.RoleOperator)}
			}
			c.Close()
		}
	}()
	router := issued(t, ca, "router", spiffe("prod", tlsconf.RoleRouter))
	for name, c := range map[string]struct {
		cert *tlsconf.Source // nil: none
		want string          // "" allowed, else in Allow's error; "handshake: X" in the server's handshake error
	}{
		"operator":       {issued(t, ca, "op", spiffe("prod", tlsconf.RoleOperator)), ""},
		"router":         {router, "has role router; wanted the role [operator]"},
		"no certificate": {nil, "presented no certificate"},
		"another CA":     {issued(t, other, "op", spiffe("prod", tlsconf.RoleOperator)), "handshake: not one this process trusts"},
	} {
		cfg := router.Client("127.0.0.1")
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
		if c.cert != nil {
			cfg.GetClientCertificate = c.cert.Client("127.0.0.1").GetClientCertificate
		}
		conn, err := tls.Dial("tcp", lis.Addr().String(), cfg)
		if err == nil {
			conn.Read(make([]byte, 1)) // a TLS 1.3 client learns of a refusal here
			conn.Close()
		}
		o := <-out
		got := fmt.Sprint(o.allow)
		if o.hs != nil {
			got = "handshake: " + o.hs.Error()
		}
		switch want, hs := strings.CutPrefix(c.want, "handshake: "); {
		case c.want == "" && (o.allow != nil || o.hs != nil):
			t.Errorf("%s: %s, want allowed", name, got)
		case c.want != "" && hs && (o.hs == nil || !strings.Contains(o.hs.Error(), want)):
			t.Errorf("%s: %s, want the handshake refused saying %q", name, got, want)
		case c.want != "" && !hs && (o.allow == nil || !strings.Contains(o.allow.Error(), c.want)):
			t.Errorf("%s: %s, want Allow refusing with %q", name, got, c.want)
		}
	}
	if err := srv.Allow(nil, tlsconf.RoleOperator); err == nil {
		t.Error("Allow took a call without TLS")
	}
}

// TestIssueURI: Issue puts a URI SAN in the certificate, and refuses one
// that does not parse.
func TestIssueURI(t *testing.T) {
	ca := newCA(t, "cluster CA")
	certPEM, _, err := ca.Issue("s", "127.0.0.1", "shard-0.example", "spiffe://prod/shard/s0")
	if err != nil {
		t.Fatal(err)
	}
	cert := certOf(t, certPEM)
	if len(cert.URIs) != 1 || cert.URIs[0].String() != "spiffe://prod/shard/s0" || len(cert.DNSNames) != 1 || len(cert.IPAddresses) != 1 {
		t.Errorf("SANs: URIs %v, DNS %v, IPs %v", cert.URIs, cert.DNSNames, cert.IPAddresses)
	}
	if _, _, err := ca.Issue("s", "spiffe://prod/%zz"); err == nil {
		t.Error("a URI that does not parse was issued")
	}
}

// TestClientWantsRole: a client that wants a shard takes a server whose
// certificate names the host it dialled only if its role is shard.
func TestClientWantsRole(t *testing.T) {
	ca := newCA(t, "cluster CA")
	router := issued(t, ca, "router", spiffe("prod", tlsconf.RoleRouter))
	router.SetRoles("prod", tlsconf.RolesEnforce)
	for _, c := range []struct {
		server string
		role   tlsconf.Role
		want   string // "" answered, else in the client's error
	}{
		{"shard", tlsconf.RoleShard, ""},
		{"impostor", tlsconf.RoleTrainer, "has role trainer; wanted the role [shard]"},
		{"old", "", "names no role"},
	} {
		var sans []string
		if c.role != "" {
			sans = append(sans, spiffe("prod", c.role))
		}
		srv := issued(t, ca, c.server, sans...)
		addr, outcomes := server(t, srv.Server()) // takes any client of the CA
		got, err := dial(addr, router.Client("127.0.0.1", tlsconf.RoleShard))
		<-outcomes
		switch {
		case c.want == "" && (err != nil || got != "model weights\n"):
			t.Errorf("a %s server: %q, %v; want an answer", c.server, got, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("a %s server: %q, %v; want refused with %q", c.server, got, err, c.want)
		}
	}
}

// TestServerRolesWithoutCA: a server told to take roles but given no CA
// to check certificates with takes no one.
func TestServerRolesWithoutCA(t *testing.T) {
	ca := newCA(t, "cluster CA")
	f, err := ca.WriteIssued(t.TempDir(), "shard", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	f.CA = ""
	srv, err := tlsconf.Load(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetRoles("prod", tlsconf.RolesEnforce)
	addr, outcomes := server(t, srv.Server(tlsconf.RoleRouter))
	if got, err := dial(addr, issued(t, ca, "router", spiffe("prod", tlsconf.RoleRouter)).Client("127.0.0.1")); err == nil {
		t.Errorf("answered %q", got)
	}
	if serr := <-outcomes; serr == nil || !strings.Contains(serr.Error(), "no CA") {
		t.Errorf("server: %v, want a refusal naming the missing CA", serr)
	}
}
