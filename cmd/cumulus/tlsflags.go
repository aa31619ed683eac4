package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/credentials"

	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// tlsFlags are --tls-cert, --tls-key and --tls-ca: a process's
// certificate and the CA that signs its peers' (see tlsconf); and, for
// the clients, --tls-server-name.
type tlsFlags struct {
	files tlsconf.Files
	// serverName, when set, is the name the server's certificate is
	// checked against instead of the address's host (a port-forward to
	// localhost, an address by IP).
	serverName string
}

func (t *tlsFlags) register(fs *pflag.FlagSet, what string) {
	fs.StringVar(&t.files.Cert, "tls-cert", "", "PEM certificate (chain) "+what+" presents; reloaded when the file changes")
	fs.StringVar(&t.files.Key, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&t.files.CA, "tls-ca", "", "PEM CA certificate(s) the peers' certificates must be signed by")
}

// registerClient is register and --tls-server-name, for the clients.
func (t *tlsFlags) registerClient(fs *pflag.FlagSet, what string) {
	t.register(fs, what)
	fs.StringVar(&t.serverName, "tls-server-name", "", "the name the server's certificate must carry (default: the host of --addr); for an address that is not the server's own name, such as kubectl port-forward's localhost")
}

// roleFlags are a server's --tls-cert, --tls-key and --tls-ca with
// --tls-roles: how its ports check the roles in their peers'
// certificates (tlsconf.Role).
type roleFlags struct {
	tlsFlags
	mode tlsconf.RoleMode
}

func (r *roleFlags) register(fs *pflag.FlagSet, what string) {
	r.tlsFlags.register(fs, what)
	fs.Var(roleModeFlag{&r.mode}, "tls-roles", "how the role in a peer's certificate (a URI SAN spiffe://CLUSTER/ROLE) is checked: enforce (refuse a certificate without the role a port takes), warn (refuse none for its role, log each enforce would refuse: for certificates that predate roles) or off")
}

// load loads the files for a server of cluster: mutual TLS, roles
// checked as --tls-roles says. Nil if no file is named.
func (r *roleFlags) load(ctx context.Context, cluster topo.Cluster) (*tlsconf.Source, error) {
	src, err := r.tlsFlags.load(ctx, true)
	if src != nil {
		src.SetRoles(string(cluster.OrDefault()), r.mode)
	}
	return src, err
}

type roleModeFlag struct{ m *tlsconf.RoleMode }

func (f roleModeFlag) String() string {
	if f.m == nil {
		return tlsconf.RolesEnforce.String()
	}
	return f.m.String()
}
func (f roleModeFlag) Type() string { return "mode" }
func (f roleModeFlag) Set(s string) error {
	m, err := tlsconf.ParseRoleMode(s)
	if err == nil {
		*f.m = m
	}
	return err
}

// load loads the files, nil if none is named; mutual needs all three.
func (t *tlsFlags) load(ctx context.Context, mutual bool) (*tlsconf.Source, error) {
	if !t.files.Set() {
		if t.serverName != "" {
			return nil, errors.New("--tls-server-name is the name a TLS server's certificate is checked against: give --tls-ca too")
		}
		return nil, nil
	}
	if mutual {
		if err := t.files.Mutual(); err != nil {
			return nil, err
		}
	}
	return tlsconf.Load(ctx, t.files)
}

// grpcCreds are a client's credentials for addr: TLS with the flags,
// else plaintext.
func (t *tlsFlags) grpcCreds(ctx context.Context, addr string) (credentials.TransportCredentials, error) {
	src, err := t.load(ctx, false)
	if err != nil {
		return nil, err
	}
	if src != nil && t.serverName != "" {
		return credentials.NewTLS(src.Client(t.serverName)), nil
	}
	return src.GRPCClient(addr)
}

// httpTransport is a client's transport for host: TLS with the flags
// (nil without them, and the scheme to use).
func (t *tlsFlags) httpTransport(ctx context.Context, host string) (http.RoundTripper, string, error) {
	src, err := t.load(ctx, false)
	if err != nil || src == nil {
		return nil, "http", err
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if t.serverName != "" {
		host = t.serverName
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = src.Client(host)
	return tr, "https", nil
}

// tlsHint adds a likely cause to a connection error a client without
// --tls-* gets from a TLS server (gRPC says only that the server's
// preface did not come), or one with them from a server that refused
// its certificate.
func tlsHint(err error, t tlsFlags) error {
	msg := err.Error()
	switch {
	case !t.files.Set() && strings.Contains(msg, "server preface"):
		return fmt.Errorf("%w (does the server serve TLS? give --tls-ca, and --tls-cert and --tls-key if it asks for a client certificate)", err)
	case t.files.Set() && (strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe") || strings.Contains(msg, "certificate required")):
		return fmt.Errorf("%w (did the server refuse this client's certificate? check --tls-cert, --tls-key and its CA)", err)
	}
	return err
}
