package tlsconf_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// issued writes a certificate of ca for 127.0.0.1 and sans (SPIFFE IDs,
// say) into a new directory and loads it.
func issued(t *testing.T, ca *tlsconf.CA, name string, sans ...string) *tlsconf.Source {
	t.Helper()
	f, err := ca.WriteIssued(t.TempDir(), name, append([]string{"127.0.0.1"}, sans...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := tlsconf.Load(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newCA(t *testing.T, name string) *tlsconf.CA {
	t.Helper()
	ca, err := tlsconf.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// server accepts TLS connections with cfg on loopback; each accepted
// connection's handshake outcome and the peer's name go to the channel.
func server(t *testing.T, cfg *tls.Config) (addr string, outcomes <-chan error) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	out := make(chan error, 16)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			err = c.(*tls.Conn).Handshake()
			if err == nil {
				_, err = c.Write([]byte("model weights\n"))
			}
			c.Close()
			out <- err
		}
	}()
	return lis.Addr().String(), out
}

// dial connects with cfg and reads what the server sends: the server's
// answer, or the error that refused it.
func dial(addr string, cfg *tls.Config) (string, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 64)
	n, err := c.Read(b)
	return string(b[:n]), err
}

// TestMutual: a client and a server whose certificates one CA signed
// talk; every other client gets nothing, and the server says why.
func TestMutual(t *testing.T) {
	ca, other := newCA(t, "cluster CA"), newCA(t, "another CA")
	srv := issued(t, ca, "shard")
	addr, outcomes := server(t, srv.Server())

	if got, err := dial(addr, issued(t, ca, "router").Client("127.0.0.1")); err != nil || got != "model weights\n" {
		t.Fatalf("a client of the cluster's CA: %q, %v", got, err)
	}
	if err := <-outcomes; err != nil {
		t.Fatalf("server side of a good handshake: %v", err)
	}

	cases := []struct {
		name   string
		client func() (string, error)
		server string // in the server's handshake error
	}{
		{"plaintext", func() (string, error) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return "", err
			}
			defer c.Close()
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			c.SetDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 256)
			n, _ := c.Read(b) // the server closes the connection
			if strings.Contains(string(b[:n]), "model weights") {
				return string(b[:n]), nil
			}
			return "", errors.New("refused")
		}, "first record does not look like a TLS handshake"},
		{"no certificate", func() (string, error) {
			cfg := issued(t, ca, "anyone").Client("127.0.0.1")
			cfg.GetClientCertificate = nil
			return dial(addr, cfg)
		}, "certificate"},
		{"another CA's certificate", func() (string, error) {
			// It trusts the server (it has the cluster's CA) but holds
			// a certificate another CA signed.
			mine := issued(t, other, "stranger")
			cfg := issued(t, ca, "x").Client("127.0.0.1")
			cfg.GetClientCertificate = mine.Client("127.0.0.1").GetClientCertificate
			return dial(addr, cfg)
		}, "not one this process trusts"},
	}
	for _, c := range cases {
		got, err := c.client()
		if err == nil {
			t.Errorf("%s: got %q, want a refusal", c.name, got)
		}
		select {
		case serr := <-outcomes:
			if serr == nil || !strings.Contains(serr.Error(), c.server) {
				t.Errorf("%s: server's handshake error %v, want one saying %q", c.name, serr, c.server)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the server never finished the handshake", c.name)
		}
	}
}

// TestClientChecksServer: a client refuses a server another CA signed,
// and one whose certificate does not name the address dialled.
func TestClientChecksServer(t *testing.T) {
	ca, other := newCA(t, "cluster CA"), newCA(t, "another CA")
	addr, _ := server(t, issued(t, other, "impostor").Server())
	if _, err := dial(addr, issued(t, ca, "router").Client("127.0.0.1")); err == nil || !strings.Contains(err.Error(), "not one this process trusts") {
		t.Fatalf("a server another CA signed: %v", err)
	}
	addr, _ = server(t, issued(t, ca, "shard").Server()) // for 127.0.0.1 only
	cfg := issued(t, ca, "router").Client("shard-0.example")
	if _, err := dial(addr, cfg); err == nil || !strings.Contains(err.Error(), "shard-0.example") {
		t.Fatalf("a server certificate for another name: %v", err)
	}
}

// TestReload: files swapped the way the kubelet updates a Secret volume
// (a new directory, then the ..data link renamed over) are taken up by
// new connections: the server presents the new certificate, and a client
// of the CA rotated out is refused.
func TestReload(t *testing.T) {
	vol := t.TempDir()
	oldCA, newCAx := newCA(t, "old CA"), newCA(t, "new CA")
	swap := func(ca *tlsconf.CA, gen string) {
		dir := filepath.Join(vol, gen)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := ca.WriteIssued(dir, "tls", "127.0.0.1"); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(vol, "..data_tmp")
		if err := os.Symlink(gen, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(vol, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	swap(oldCA, "..gen1")
	for _, name := range []string{"tls.pem", "tls-key.pem", "ca.pem"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := tlsconf.Load(ctx, tlsconf.Files{Cert: filepath.Join(vol, "tls.pem"), Key: filepath.Join(vol, "tls-key.pem"), CA: filepath.Join(vol, "ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := server(t, srv.Server())
	oldClient, newClient := issued(t, oldCA, "old client"), issued(t, newCAx, "new client")
	if _, err := dial(addr, oldClient.Client("127.0.0.1")); err != nil {
		t.Fatalf("before the swap: %v", err)
	}
	swap(newCAx, "..gen2")
	testenv.Eventually(t, 10*time.Second, func() error {
		_, err := dial(addr, newClient.Client("127.0.0.1"))
		return err
	})
	if _, err := dial(addr, oldClient.Client("127.0.0.1")); err == nil {
		t.Fatal("a client of the CA rotated out still connects")
	}
}

// TestLoadNeedsAll: mutual TLS needs the three files, a certificate its
// key; a damaged file is an error naming it.
func TestLoadNeedsAll(t *testing.T) {
	ca := newCA(t, "CA")
	f, err := ca.WriteIssued(t.TempDir(), "x", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := (tlsconf.Files{Cert: f.Cert, Key: f.Key}).Mutual(); err == nil || !strings.Contains(err.Error(), "--tls-ca") {
		t.Fatalf("no CA for mutual TLS: %v", err)
	}
	if _, err := tlsconf.Load(context.Background(), tlsconf.Files{Cert: f.Cert, CA: f.CA}); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Fatalf("a certificate without its key: %v", err)
	}
	if err := os.WriteFile(f.CA, []byte("not PEM"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsconf.Load(context.Background(), f); err == nil || !strings.Contains(err.Error(), f.CA) {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
}

// TestOneWay: a server without a CA asks no client certificate (the
// front, without --client-ca); a client with only the CA checks it and
// presents nothing.
func TestOneWay(t *testing.T) {
	ca := newCA(t, "CA")
	f, err := ca.WriteIssued(t.TempDir(), "front", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := tlsconf.Load(ctx, tlsconf.Files{Cert: f.Cert, Key: f.Key})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := tlsconf.Load(ctx, tlsconf.Files{CA: f.CA})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := server(t, srv.Server())
	if got, err := dial(addr, cli.Client("127.0.0.1")); err != nil || got != "model weights\n" {
		t.Fatalf("one-way TLS: %q, %v", got, err)
	}
	// A client with no CA cannot check the server: it refuses.
	if _, err := dial(addr, srv.Client("127.0.0.1")); err == nil || !strings.Contains(err.Error(), "no CA") {
		t.Fatalf("a client without a CA: %v", err)
	}
}

// TestCutShort: a CA bundle or a certificate chain caught half written
// is a failed reload, and what was loaded stays: the peers of the CA the
// cut dropped are still trusted.
func TestCutShort(t *testing.T) {
	ca, second := newCA(t, "CA"), newCA(t, "second CA")
	dir := t.TempDir()
	f, err := ca.WriteIssued(dir, "srv", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	bundle := append(append([]byte{}, ca.PEM...), second.PEM...)
	if err := os.WriteFile(f.CA, bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := tlsconf.Load(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := server(t, srv.Server())
	client := issued(t, second, "client of the second CA")
	cfg := client.Client("127.0.0.1")
	// It trusts the server through its own CA file; give it the bundle.
	cf := tlsconf.Files{CA: f.CA}
	src, err := tlsconf.Load(ctx, cf)
	if err != nil {
		t.Fatal(err)
	}
	cfg.VerifyConnection = src.Client("127.0.0.1").VerifyConnection
	if _, err := dial(addr, cfg); err != nil {
		t.Fatalf("a client of the bundle's second CA: %v", err)
	}
	for name, b := range map[string][]byte{
		"CA bundle": append(append([]byte{}, ca.PEM...), second.PEM[:len(second.PEM)/2]...),
	} {
		if err := os.WriteFile(f.CA, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), "cut short") {
			t.Fatalf("%s cut short: reload %v", name, err)
		}
	}
	certPEM, err := os.ReadFile(f.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Cert, append(certPEM, second.PEM[:len(second.PEM)-30]...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), "cut short") {
		t.Fatalf("a chain cut short: reload %v", err)
	}
	if _, err := dial(addr, cfg); err != nil {
		t.Fatalf("after failed reloads, a client of the second CA: %v", err)
	}
}
