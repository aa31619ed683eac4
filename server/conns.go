package server

import (
	"net"
	"sync"
)

// A client address holds at most Options.MaxConnsPerPeer connections
// open on each front: past it, a new connection is closed as soon as it
// is accepted, before anything is read from it, and counted
// (cumulus_connections_refused_total). Whatever else bounds a client (its bytes arriving,
// its requests admitted), each connection costs the front a goroutine
// and buffers from the start: connections opened and left idle, or
// trickling their headers, were bounded only by the process's files.

// peerListener bounds the connections each client address holds.
type peerListener struct {
	net.Listener
	max     int
	refused func()
	mu      sync.Mutex
	open    map[string]int // by client address
}

func limitPeers(l net.Listener, max int, refused func()) net.Listener {
	return &peerListener{Listener: l, max: max, refused: refused, open: map[string]int{}}
}

// Accept returns the next connection whose client is within its bound.
func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerHost(c.RemoteAddr().String())
		l.mu.Lock()
		ok := l.open[peer] < l.max
		if ok {
			l.open[peer]++
		}
		l.mu.Unlock()
		if !ok {
			c.Close()
			l.refused()
			continue
		}
		return &peerConn{Conn: c, done: func() { l.closed(peer) }}, nil
	}
}

func (l *peerListener) closed(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[peer]--; l.open[peer] <= 0 {
		delete(l.open, peer)
	}
}

// peerHost is a client's address without its port.
func peerHost(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// peerConn is a connection counted against its client's bound until it
// is closed.
type peerConn struct {
	net.Conn
	once sync.Once
	done func()
}

func (c *peerConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.done)
	return err
}
