package raftgroup

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// streamLayer is raft's transport over TCP, mutual TLS when tls is set:
// a member answers only peers whose certificate the CA signed, and checks
// each peer it dials against the host of the peer's address.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	tls       *tlsconf.Source

	// known, once the group runs, lists the hosts of its members.
	known atomic.Pointer[func() []string]

	// cut, while set, partitions the member: no connection in or out,
	// and those open are closed (SetPartitioned).
	cut   atomic.Bool
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// track keeps c to close on a partition; nil when partitioned.
func (s *streamLayer) track(c net.Conn) net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut.Load() {
		c.Close()
		return nil
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return &trackedConn{Conn: c, s: s}
}

type trackedConn struct {
	net.Conn
	s *streamLayer
}

func (c *trackedConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.conns, c.Conn)
	c.s.mu.Unlock()
	return c.Conn.Close()
}

// partition cuts (or restores) every connection of this member.
func (s *streamLayer) partition(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut.Store(on)
	if on {
		for c := range s.conns {
			c.Close()
		}
		clear(s.conns)
	}
}

func (s *streamLayer) Accept() (net.Conn, error) {
	for {
		c, err := s.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if t := s.track(c); t != nil {
			return t, nil
		}
	}
}

func listen(addr, advertise string, src *tlsconf.Source) (*streamLayer, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("raftgroup: %w", err)
	}
	// Peers dial what was given (a host name stays a host name, for
	// certificates and for peers that name this member so), with the
	// port the kernel chose for port 0.
	adv := advertise
	if adv == "" {
		host, port, _ := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			lis.Close()
			return nil, fmt.Errorf("raftgroup: listening on %s, an address peers cannot dial: give the address to advertise", addr)
		}
		if port == "0" {
			_, port, _ = net.SplitHostPort(lis.Addr().String())
		}
		adv = net.JoinHostPort(host, port)
	}
	if _, _, err := splitAddr(adv); err != nil {
		lis.Close()
		return nil, fmt.Errorf("raftgroup: advertised %w", err)
	}
	s := &streamLayer{Listener: lis, advertise: tcpName(adv), tls: src}
	if src != nil {
		c := src.Server(tlsconf.RoleManager)
		chain := c.VerifyConnection
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if chain != nil {
				if err := chain(cs); err != nil {
					return err
				}
			}
			return s.checkPeer(cs.PeerCertificates)
		}
		s.Listener = tls.NewListener(lis, c)
	}
	return s, nil
}

// checkPeer lets in only a peer whose certificate names the host of a
// member the group knows (its configuration, or the peers it was
// bootstrapped with): any other certificate the CA signed (a shard's, a
// router's, an operator's) gets nothing from the raft transport. A member
// that knows no one yet (waiting to be added) takes any the CA signed.
func (s *streamLayer) checkPeer(certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("raftgroup: the peer presented no certificate")
	}
	hosts := s.members()
	if len(hosts) == 0 {
		return nil
	}
	for _, h := range hosts {
		if certs[0].VerifyHostname(h) == nil {
			return nil
		}
	}
	return fmt.Errorf("raftgroup: the peer's certificate (%q) names none of the group's members %v", certs[0].Subject.CommonName, hosts)
}

// members are the hosts of the members this one knows.
func (s *streamLayer) members() []string {
	if f := s.known.Load(); f != nil {
		return (*f)()
	}
	return nil
}

// tcpName is an address as peers dial it, perhaps a host name.
type tcpName string

func (tcpName) Network() string  { return "tcp" }
func (a tcpName) String() string { return string(a) }

// Addr is the address peers dial (raft advertises it).
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// errPartitioned refuses a dial from a partitioned member.
var errPartitioned = errors.New("raftgroup: this member is partitioned (SetPartitioned)")

func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.cut.Load() {
		return nil, errPartitioned
	}
	d := &net.Dialer{Timeout: timeout}
	var c net.Conn
	var err error
	if s.tls == nil {
		c, err = d.Dial("tcp", string(address))
	} else {
		host, _, serr := net.SplitHostPort(string(address))
		if serr != nil {
			return nil, serr
		}
		c, err = (&tls.Dialer{NetDialer: d, Config: s.tls.Client(host, tlsconf.RoleManager)}).Dial("tcp", string(address))
	}
	if err != nil {
		return nil, err
	}
	if t := s.track(c); t != nil {
		return t, nil
	}
	return nil, errPartitioned
}
