package server_test

import (
	"fmt"
	"io"
	"net"
	"regexp"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/server"
)

// served reports whether the front serves c: it answers an HTTP request
// (http), or sends its HTTP/2 settings (grpc), within a second. A
// connection held unread gets nothing, and is closed.
func served(t *testing.T, api string, c net.Conn) bool {
	t.Helper()
	if api == "http" {
		if _, err := io.WriteString(c, "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return false
		}
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	n, _ := c.Read(make([]byte, 1))
	return n > 0
}

// TestConnsPerPeer: a client address holds at most MaxConnsPerPeer
// connections on each front; the next is held unread, closed after
// HeaderTimeout and counted; a connection closed makes room again.
func TestConnsPerPeer(t *testing.T) {
	s, _ := startFront(t, server.Options{MaxConnsPerPeer: 3, HeaderTimeout: 300 * time.Millisecond}, failing{})
	dial := func(addr string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, front := range []struct{ api, addr string }{{"http", s.HTTPAddr()}, {"grpc", s.GRPCAddr()}} {
		var open []net.Conn
		for range 3 {
			c := dial(front.addr)
			if !served(t, front.api, c) {
				t.Fatalf("%s: a connection within the bound was not served", front.api)
			}
			open = append(open, c)
		}
		over := dial(front.addr)
		if served(t, front.api, over) {
			t.Fatalf("%s: a fourth connection from one address was served", front.api)
		}
		over.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(over); err != nil {
			t.Fatalf("%s: a connection held past the bound was not closed: %v", front.api, err)
		}
		open[0].Close()
		// The count falls once the server sees the close: a new one is
		// served then.
		testenv.Eventually(t, 10*time.Second, func() error {
			c := dial(front.addr)
			defer c.Close()
			if !served(t, front.api, c) {
				return fmt.Errorf("%s: no room again after a connection closed", front.api)
			}
			return nil
		})
		for _, c := range open[1:] {
			c.Close()
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		_, metrics := get(t, s, "/metrics")
		for _, api := range []string{"grpc", "http"} {
			// One at least (the wait for room again may count more).
			if !regexp.MustCompile(`\ncumulus_connections_refused_total\{api="` + api + `"\} [1-9]`).MatchString(metrics) {
				return fmt.Errorf("no connection of %s counted as refused", api)
			}
		}
		return nil
	})
}

// TestHeaderTimeout: an HTTP connection that sends part of its headers
// and stalls is closed after HeaderTimeout; a gRPC connection that sends
// nothing of its preface likewise.
func TestHeaderTimeout(t *testing.T) {
	s, _ := startFront(t, server.Options{HeaderTimeout: 200 * time.Millisecond}, failing{})
	for _, front := range []struct{ api, addr, send string }{
		{"http", s.HTTPAddr(), "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"},
		{"grpc", s.GRPCAddr(), ""},
	} {
		c, err := net.Dial("tcp", front.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, front.send); err != nil {
			t.Fatal(err)
		}
		// Whatever the server sends (gRPC's settings, HTTP's 408), it
		// then closes the connection: reading ends before the deadline.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: a stalled connection was kept open 10s", front.api)
		}
	}
}
