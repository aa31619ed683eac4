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
	adv := lis.Addr()
	if advertise != "" {
		a, err := net.ResolveTCPAddr("tcp", advertise)
		if err != nil {
			lis.Close()
			return nil, fmt.Errorf("raftgroup: advertise address %q: %w", advertise, err)
		}
		adv = a
	} else if tcp := adv.(*net.TCPAddr); tcp.IP.IsUnspecified() {
		lis.Close()
		return nil, fmt.Errorf("raftgroup: listening on %s, an address peers cannot dial: give the address to advertise", addr)
	}
	s := &streamLayer{Listener: lis, advertise: adv, tls: src}
	if src != nil {
		s.Listener = tls.NewListener(lis, src.Server())
	}
	return s, nil
}

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
