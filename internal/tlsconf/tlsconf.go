// Package tlsconf gives Cumulus's processes their TLS configurations
// from PEM files (--tls-cert, --tls-key, --tls-ca) that may change while
// they run: a certificate renewed by cert-manager, a Secret volume
// swapped by the kubelet (its ..data link replaced), a CA rotated. The
// files are read again when their directory changes, and every minute
// in case a change went unseen; a read that fails (a file half written)
// keeps what was loaded and is logged, and the next change tries again.
//
// Connections made after a reload use what it loaded; connections open
// stay as they are. Both sides check the peer against the CA as loaded
// now: a server asks every client for a certificate its CA signed, a
// client checks the server's against its CA and the name it dialled.
// Go's crypto/tls does the handshakes; this package only keeps the
// material current, because tls.Config fixes its CA pool when built.
package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Files names the PEM files: the process's certificate chain and key,
// and the CA that signs its peers.
type Files struct {
	Cert, Key, CA string
}

// Set reports whether any file is named.
func (f Files) Set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Source holds the material last loaded from Files.
type Source struct {
	files Files
	cur   atomic.Pointer[material]
	// What SetRoles set: the cluster whose roles servers check, and how.
	cluster string
	mode    RoleMode
}

type material struct {
	cert *tls.Certificate
	pool *x509.CertPool
}

// Mutual checks that files name all three: between Cumulus's own
// processes, each proves who it is and checks its peer.
func (f Files) Mutual() error {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return errors.New("tls: --tls-cert, --tls-key and --tls-ca go together: each process proves who it is and checks its peers")
	}
	return nil
}

// Load reads files and keeps them current until ctx ends. Cert and Key
// go together; CA alone makes a client that checks servers and presents
// no certificate.
func Load(ctx context.Context, files Files) (*Source, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, errors.New("tls: --tls-cert and --tls-key go together")
	}
	if !files.Set() {
		return nil, errors.New("tls: no certificate file named")
	}
	s := &Source{files: files}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	go s.watch(ctx)
	return s, nil
}

// Reload reads the files again; on an error, what was loaded stays.
// A file must be whole PEM: a bundle or chain cut short (a file caught
// half written) is an error, not the certificates before the cut.
func (s *Source) Reload() error {
	var m material
	if s.files.Cert != "" {
		certPEM, err := readPEM(s.files.Cert)
		if err != nil {
			return err
		}
		keyPEM, err := readPEM(s.files.Key)
		if err != nil {
			return err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return fmt.Errorf("tls: loading %s and %s: %w", s.files.Cert, s.files.Key, err)
		}
		m.cert = &cert
	}
	if s.files.CA != "" {
		ca, err := readPEM(s.files.CA)
		if err != nil {
			return err
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(ca) {
			return fmt.Errorf("tls: %s holds no PEM certificate", s.files.CA)
		}
	}
	s.cur.Store(&m)
	return nil
}

// readPEM reads a file of PEM blocks and checks that nothing but
// whitespace is outside them, and that every certificate parses.
func readPEM(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	rest := b
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type == "CERTIFICATE" {
			if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
				return nil, fmt.Errorf("tls: %s: %w", path, err)
			}
		}
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, fmt.Errorf("tls: %s: %d bytes that are not whole PEM blocks (a file cut short?)", path, len(bytes.TrimSpace(rest)))
	}
	return b, nil
}

// reloadDelay is how long the watcher waits after a change before
// reading: a swap of several files is read once, whole.
const reloadDelay = 200 * time.Millisecond

// watch reloads when a file's directory changes (once things are quiet
// for reloadDelay), and every minute.
func (s *Source) watch(ctx context.Context) {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w, err := fsnotify.NewWatcher(); err != nil {
		slog.Warn("tls: cannot watch the certificate files; reading them every minute", "err", err)
	} else {
		defer w.Close()
		var dirs []string
		for _, f := range []string{s.files.Cert, s.files.Key, s.files.CA} {
			if f == "" {
				continue
			}
			if d := filepath.Dir(f); !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
				if err := w.Add(d); err != nil {
					slog.Warn("tls: cannot watch a certificate directory; reading it every minute", "dir", d, "err", err)
				}
			}
		}
		events, errs = w.Events, w.Errors
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
			settle.Reset(reloadDelay)
			continue
		case err := <-errs:
			// An overflow, say: changes may have been missed.
			slog.Warn("tls: watching the certificate files", "err", err)
			settle.Reset(reloadDelay)
			continue
		case <-settle.C:
		case <-tick.C:
		}
		if err := s.Reload(); err != nil {
			slog.Warn("tls: reloading failed; keeping the certificates loaded before", "err", err)
		}
	}
}

// Server is a server's configuration: it presents the current
// certificate and, with a CA, requires a client certificate the current
// CA signed, whose role is one of accept (none: any role; see SetRoles).
func (s *Source) Server(accept ...Role) *tls.Config {
	c := s.serving()
	if s.files.CA == "" && len(accept) > 0 {
		// Roles without a CA to check certificates against: refuse
		// every handshake rather than take anyone.
		c.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return nil, fmt.Errorf("tls: roles %v wanted, but no CA (--tls-ca) to check certificates against", accept)
		}
	}
	if s.files.CA != "" {
		// Asked for, then checked against the CA as loaded now (a pool
		// in ClientCAs would be the one loaded at start for ever).
		c.ClientAuth = tls.RequireAnyClientCert
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if err := s.verify(cs.PeerCertificates, "", x509.ExtKeyUsageClientAuth); err != nil {
				return err
			}
			return s.checkRole(cs.PeerCertificates[0], accept)
		}
	}
	return c
}

// ServerAsking is a server's configuration that asks for a client
// certificate and answers without one: a certificate presented must be
// one the current CA signed, and handlers check its role with Allow.
// Probes and scrapers, which present none, share a port with calls that
// need a role.
func (s *Source) ServerAsking() *tls.Config {
	c := s.serving()
	if s.files.CA != "" {
		c.ClientAuth = tls.RequestClientCert
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return nil
			}
			return s.verify(cs.PeerCertificates, "", x509.ExtKeyUsageClientAuth)
		}
	}
	return c
}

// serving is a configuration presenting the current certificate.
func (s *Source) serving() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := s.cur.Load().cert; c != nil {
				return c, nil
			}
			return nil, errors.New("tls: this process has no certificate to serve with")
		},
	}
}

// Client is a client's configuration for a server named server (the
// host of the address dialled: a DNS name or an IP address): it checks
// the server's certificate against the current CA and that name, and
// that its role is one of want (none: any role; see SetRoles), and
// presents the current certificate when asked.
func (s *Source) Client(server string, want ...Role) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: server,
		// Not skipped: VerifyConnection checks the chain and the name,
		// against the CA as loaded now (RootCAs would fix it at start).
		// The name is server's: the connection's own is empty for an IP
		// address, which TLS does not send.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if server == "" {
				return errors.New("tls: no server name to check the server's certificate against")
			}
			if err := s.verify(cs.PeerCertificates, server, x509.ExtKeyUsageServerAuth); err != nil {
				return err
			}
			return s.checkRole(cs.PeerCertificates[0], want)
		},
		GetClientCertificate: s.clientCert,
	}
}

// clientCert is the certificate a client presents: the current one, or
// none (the server decides).
func (s *Source) clientCert(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if c := s.cur.Load().cert; c != nil {
		return c, nil
	}
	return &tls.Certificate{}, nil
}

// verify checks a peer's chain against the current CA: for a server, its
// name too.
func (s *Source) verify(chain []*x509.Certificate, name string, usage x509.ExtKeyUsage) error {
	if len(chain) == 0 {
		return errNoCert
	}
	pool := s.cur.Load().pool
	if pool == nil {
		return errors.New("tls: no CA (--tls-ca) to check the peer's certificate against")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: name,
		KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return fmt.Errorf("tls: the peer's certificate (%q) is not one this process trusts: %w", chain[0].Subject.CommonName, err)
	}
	return nil
}

// ClientAnyName is a client's configuration for dialling several servers
// with one configuration (etcd's client): Go checks each server's
// certificate against the CA as loaded when this is called, for the
// name it dials. The client certificate is the current one.
func (s *Source) ClientAnyName() (*tls.Config, error) {
	pool := s.cur.Load().pool
	if pool == nil {
		return nil, errors.New("tls: no CA (--etcd-ca) to check the servers' certificates against")
	}
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		RootCAs:              pool,
		GetClientCertificate: s.clientCert,
	}, nil
}
