package raftgroup

import (
	"crypto/tls"
	"fmt"
	"net"
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
		s.Listener = tls.NewListener(lis, src.Server())
	}
	return s, nil
}

// tcpName is an address as peers dial it, perhaps a host name.
type tcpName string

func (tcpName) Network() string  { return "tcp" }
func (a tcpName) String() string { return string(a) }

// Addr is the address peers dial (raft advertises it).
func (s *streamLayer) Addr() net.Addr { return s.advertise }

func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.tls == nil {
		return d.Dial("tcp", string(address))
	}
	host, _, err := net.SplitHostPort(string(address))
	if err != nil {
		return nil, err
	}
	return (&tls.Dialer{NetDialer: d, Config: s.tls.Client(host)}).Dial("tcp", string(address))
}
