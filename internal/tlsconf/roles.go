package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
)

// Role is what a certificate's holder is to the cluster. A certificate
// names it as its SPIFFE ID, a URI SAN spiffe://CLUSTER/ROLE[/ID]:
// CLUSTER is the cluster's name (--cluster), the trust domain; ID, when
// given, names one holder (a shard's ID, say) and is not checked.
type Role string

// The roles, and which port takes which (README.md, TLS):
//   - a shard's lookups (gRPC): routers and managers (the manager's
//     gates call shards);
//   - a shard's fault API (HTTP): operators;
//   - the manager's admin API: operators;
//   - the managers' raft transport: managers;
//   - trainers: reserved for the push API of online updates (not built
//     yet); nothing takes them today.
//
// A router's front takes its clients by --client-ca, not by role.
const (
	RoleShard    Role = "shard"
	RoleRouter   Role = "router"
	RoleManager  Role = "manager"
	RoleOperator Role = "operator"
	RoleTrainer  Role = "trainer"
)

// Roles are every role, in the order above.
var Roles = []Role{RoleShard, RoleRouter, RoleManager, RoleOperator, RoleTrainer}

// RoleMode is how a server applies roles (--tls-roles).
type RoleMode int

const (
	// RolesEnforce refuses a certificate without the role a port takes.
	RolesEnforce RoleMode = iota
	// RolesWarn refuses none for its role, and logs each certificate
	// that enforce would refuse: a cluster whose certificates predate
	// roles upgrades under it, then enforces.
	RolesWarn
	// RolesOff checks no role: any certificate the CA signed.
	RolesOff
)

func (m RoleMode) String() string {
	switch m {
	case RolesWarn:
		return "warn"
	case RolesOff:
		return "off"
	}
	return "enforce"
}

// ParseRoleMode reads a RoleMode's name.
func ParseRoleMode(s string) (RoleMode, error) {
	for _, m := range []RoleMode{RolesEnforce, RolesWarn, RolesOff} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%q: use enforce, warn or off", s)
}

// Identity is a certificate's SPIFFE ID, read.
type Identity struct {
	Cluster string
	Role    Role
	ID      string // "" when the ID names none
}

// URI is the identity as a certificate carries it.
func (i Identity) URI() *url.URL {
	p := "/" + string(i.Role)
	if i.ID != "" {
		p += "/" + i.ID
	}
	return &url.URL{Scheme: "spiffe", Host: strings.ToLower(i.Cluster), Path: p}
}

func (i Identity) String() string { return i.URI().String() }

// IdentityOf reads c's SPIFFE ID: ok is false when it carries none (a
// certificate that predates roles). As the SPIFFE X.509 profile has it,
// a certificate with a SPIFFE ID has no other URI SAN, its trust domain
// is lowercase letters, digits, '.', '-' and '_', and its path segments
// are letters, digits, '.', '-' and '_' (not "." or ".."), written
// plainly (no percent-encoding). Anything else, or a role not of Roles,
// or more than ROLE/ID, is an error: a certificate names one holder,
// one way.
func IdentityOf(c *x509.Certificate) (id Identity, ok bool, err error) {
	var found *url.URL
	for _, u := range c.URIs {
		if strings.EqualFold(u.Scheme, "spiffe") {
			found = u
		}
	}
	if found == nil {
		return Identity{}, false, nil
	}
	bad := func() (Identity, bool, error) {
		return Identity{}, false, fmt.Errorf("SPIFFE ID %s is not spiffe://CLUSTER/ROLE[/ID]", found)
	}
	if len(c.URIs) > 1 {
		return Identity{}, false, fmt.Errorf("names %d URIs with its SPIFFE ID %s; a certificate with a SPIFFE ID names no other", len(c.URIs), found)
	}
	if found.Scheme != "spiffe" || found.User != nil || found.Port() != "" || found.RawQuery != "" || found.Fragment != "" ||
		found.Opaque != "" || found.RawPath != "" || !spiffeChars(found.Host, false) || !strings.HasPrefix(found.Path, "/") {
		return bad()
	}
	segs := strings.Split(found.Path[1:], "/")
	if len(segs) > 2 {
		return bad()
	}
	for _, seg := range segs {
		if seg == "." || seg == ".." || !spiffeChars(seg, true) {
			return bad()
		}
	}
	r := Role(segs[0])
	if !slices.Contains(Roles, r) {
		return Identity{}, false, fmt.Errorf("SPIFFE ID %s names role %q, which is none of %v", found, segs[0], Roles)
	}
	id = Identity{Cluster: found.Host, Role: r}
	if len(segs) == 2 {
		id.ID = segs[1]
	}
	return id, true, nil
}

// spiffeChars reports whether s is non-empty and of the characters a
// SPIFFE trust domain (upper false: lowercase only) or path segment
// (upper true) may hold.
func spiffeChars(s string, upper bool) bool {
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_' || upper && c >= 'A' && c <= 'Z'
		if !ok {
			return false
		}
	}
	return s != ""
}

// SetRoles says which cluster's roles this process checks (the trust
// domain of the SPIFFE IDs: the cluster's name in lowercase, so clusters
// named alike but for case share one), and how (--tls-roles). Call it
// before serving with Server, GRPC or Allow, or dialling with Client,
// with roles.
func (s *Source) SetRoles(cluster string, mode RoleMode) {
	s.cluster, s.mode = cluster, mode
}

// errNoCert is a refusal of a peer that presented no certificate.
var errNoCert = errors.New("tls: the peer presented no certificate")

// checkRole checks that peer (whose chain is verified) has one of accept
// as its role; accept empty takes any. Under RolesWarn it logs what
// enforce would refuse and refuses nothing; under RolesOff it checks
// nothing.
func (s *Source) checkRole(peer *x509.Certificate, accept []Role) error {
	if len(accept) == 0 || s.mode == RolesOff {
		return nil
	}
	err := s.roleProblem(peer, accept)
	if err == nil || s.mode != RolesWarn {
		return err
	}
	slog.Warn("tls: accepted a certificate that --tls-roles enforce would refuse", "reason", err.Error())
	return nil
}

func (s *Source) roleProblem(peer *x509.Certificate, accept []Role) error {
	want := fmt.Sprint(accept)
	if s.cluster == "" {
		return fmt.Errorf("tls: roles wanted %s, but this process knows no cluster to check them in (SetRoles)", want)
	}
	id, ok, err := IdentityOf(peer)
	switch {
	case err != nil:
		return fmt.Errorf("tls: the peer's certificate (%q) %v; wanted the role %s", peer.Subject.CommonName, err, want)
	case !ok:
		return fmt.Errorf("tls: the peer's certificate (%q) names no role (a URI SAN spiffe://%s/ROLE); wanted the role %s",
			peer.Subject.CommonName, strings.ToLower(s.cluster), want)
	case id.Cluster != strings.ToLower(s.cluster):
		return fmt.Errorf("tls: the peer's certificate (%q) has role %s of cluster %q, not of %q; wanted the role %s",
			peer.Subject.CommonName, id.Role, id.Cluster, s.cluster, want)
	case !slices.Contains(accept, id.Role):
		return fmt.Errorf("tls: the peer's certificate (%q) has role %s; wanted the role %s", peer.Subject.CommonName, id.Role, want)
	}
	return nil
}

// Allow checks a request's connection for handlers on a server that asks
// for a certificate but answers without one (ServerAsking): the peer
// presented one (verified in the handshake) with one of accept as its
// role.
func (s *Source) Allow(cs *tls.ConnectionState, accept ...Role) error {
	if cs == nil {
		return errors.New("tls: the call came without TLS")
	}
	if len(cs.PeerCertificates) == 0 {
		return errNoCert
	}
	return s.checkRole(cs.PeerCertificates[0], accept)
}
