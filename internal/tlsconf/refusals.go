package tlsconf

import (
	"fmt"
	"log"
	"log/slog"
	"net"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// logRefusal logs a refused connection with its reason. Anyone who
// reaches the port can fail a handshake: the process's log handler
// (internal/lograte, installed by cmd/cumulus) bounds how many such
// lines are written, and counts those it leaves out.
func logRefusal(who, from, reason string) {
	slog.Warn(who+": refused a connection", "from", from, "reason", reason)
}

// GRPCClient is a gRPC client's credentials for addr ("host:port"): TLS
// checking the server against host and its role against want (see
// Client), or plaintext from a nil Source.
func (s *Source) GRPCClient(addr string, want ...Role) (credentials.TransportCredentials, error) {
	if s == nil {
		return insecure.NewCredentials(), nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("tls: address %q: %w", addr, err)
	}
	return credentials.NewTLS(s.Client(host, want...)), nil
}

// GRPC is a gRPC server's credentials over Server(accept...), logging
// refused handshakes as who's.
func (s *Source) GRPC(who string, accept ...Role) credentials.TransportCredentials {
	return refusingCreds{TransportCredentials: credentials.NewTLS(s.Server(accept...)), who: who}
}

type refusingCreds struct {
	credentials.TransportCredentials
	who string
}

func (c refusingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	from := conn.RemoteAddr().String()
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		logRefusal(c.who, from, err.Error())
	}
	return out, info, err
}

func (c refusingCreds) Clone() credentials.TransportCredentials {
	return refusingCreds{TransportCredentials: c.TransportCredentials.Clone(), who: c.who}
}

// HTTPErrorLog is an http.Server's ErrorLog logging as who's: a refused
// TLS handshake as a refusal, with its reason; anything else (a panic in
// a handler, an accept error) as a warning of its own.
func HTTPErrorLog(who string) *log.Logger { return log.New(httpLog(who), "", 0) }

type httpLog string

func (h httpLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	// net/http: "http: TLS handshake error from ADDR: REASON".
	if rest, ok := strings.CutPrefix(line, "http: TLS handshake error from "); ok {
		from, reason, _ := strings.Cut(rest, ": ")
		logRefusal(string(h), from, reason)
	} else {
		slog.Warn(string(h)+": HTTP server error", "err", line)
	}
	return len(p), nil
}
