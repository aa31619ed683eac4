// Package peerlimit bounds the connections each client address holds
// on a listener: the fronts' --max-conns-per-peer, and the push API's.
package peerlimit

import (
	"net"
	"sync"
	"time"
)

// A client address holds at most max connections on a listener (the
// fronts' Options.MaxConnsPerPeer). Past it, a new connection is held unread for
// hold (the fronts' HeaderTimeout), then closed, and counted (refused;
// the fronts' cumulus_connections_refused_total). Whatever else bounds a client (its
// bytes arriving, its requests admitted), each connection served costs
// the front a goroutine and buffers from the start: connections opened
// and left idle, or trickling their headers, were bounded only by the
// process's files. A connection held costs a file and a timer. Closing
// it at once would cost more: a sender that reopens whatever is cut then
// opens and closes connections as fast as it can (300 slow HTTP senders
// from one address, closed at once, cut a good client to 0.05 of its
// QPS on this project's 2-core machine: cumulus bench hostile --slow
// http --streams 300). Past maxHeld connections held, a new one over
// its client's bound is closed at once.

// maxHeld bounds the connections held unread, all clients together.
const maxHeld = 4096

// peerListener bounds the connections each client address holds.
type peerListener struct {
	net.Listener
	max     int
	hold    time.Duration
	refused func()
	mu      sync.Mutex
	open    map[string]int // by client address
	held    map[net.Conn]bool
}

// Limit is l, with each client address holding at most max connections;
// one over the bound is held unread for hold, then closed, and refused
// is called.
func Limit(l net.Listener, max int, hold time.Duration, refused func()) net.Listener {
	return &peerListener{Listener: l, max: max, hold: hold, refused: refused, open: map[string]int{}, held: map[net.Conn]bool{}}
}

// Accept returns the next connection whose client is within its bound.
func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := Host(c.RemoteAddr().String())
		l.mu.Lock()
		ok := l.open[peer] < l.max
		if ok {
			l.open[peer]++
		}
		hold := !ok && len(l.held) < maxHeld
		if hold {
			l.held[c] = true
		}
		l.mu.Unlock()
		if ok {
			return &peerConn{Conn: c, done: func() { l.closed(peer) }}, nil
		}
		l.refused()
		if !hold {
			c.Close()
			continue
		}
		time.AfterFunc(l.hold, func() {
			l.mu.Lock()
			delete(l.held, c)
			l.mu.Unlock()
			c.Close()
		})
	}
}

// Close closes the listener and the connections it holds.
func (l *peerListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.held {
		c.Close()
		delete(l.held, c)
	}
	return err
}

func (l *peerListener) closed(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[peer]--; l.open[peer] <= 0 {
		delete(l.open, peer)
	}
}

// Host is a client's address without its port.
func Host(addr string) string {
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
