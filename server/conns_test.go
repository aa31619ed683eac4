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

// closedByServer reports whether the server has closed c (a read ends
// with EOF or a reset within d; a read that times out: still open).
func closedByServer(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

// TestConnsPerPeer: a client address holds at most MaxConnsPerPeer
// connections on each front; the next is closed at once and counted,
// and a connection closed makes room again.
func TestConnsPerPeer(t *testing.T) {
	s, _ := startFront(t, server.Options{MaxConnsPerPeer: 3}, failing{})
	for _, front := range []struct{ api, addr string }{{"http", s.HTTPAddr()}, {"grpc", s.GRPCAddr()}} {
		var open []net.Conn
		for range 3 {
			c, err := net.Dial("tcp", front.addr)
			if err != nil {
				t.Fatal(err)
			}
			open = append(open, c)
		}
		over, err := net.Dial("tcp", front.addr)
		if err != nil {
			t.Fatal(err)
		}
		if !closedByServer(over, 5*time.Second) {
			t.Fatalf("%s: a fourth connection from one address was kept open", front.api)
		}
		if closedByServer(open[0], 100*time.Millisecond) {
			t.Fatalf("%s: a connection within the bound was closed", front.api)
		}
		open[0].Close()
		// The count falls once the server sees the close: a new one is
		// kept open then.
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := net.Dial("tcp", front.addr)
			if err != nil {
				t.Fatal(err)
			}
			kept := !closedByServer(c, 200*time.Millisecond)
			c.Close()
			if kept {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no room again after a connection closed", front.api)
			}
		}
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
