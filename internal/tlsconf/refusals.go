package tlsconf

import (
	"log"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/credentials"
)

// refusals logs refused connections with their reason, at most a few a
// second: anyone who reaches the port can fail a handshake, and each
// would otherwise be a line. What is left out is counted in the next
// line logged.
type refusals struct {
	who     string
	lim     *rate.Limiter
	skipped atomic.Int64
}

func newRefusals(who string) *refusals {
	return &refusals{who: who, lim: rate.NewLimiter(1, 5)}
}

func (r *refusals) log(from string, reason string) {
	if !r.lim.Allow() {
		r.skipped.Add(1)
		return
	}
	slog.Warn(r.who+": refused a connection", "from", from, "reason", reason, "refusals_not_logged_before", r.skipped.Swap(0))
}

// GRPC is a gRPC server's credentials over Server, logging refused
// handshakes (rate-limited) as who's.
func (s *Source) GRPC(who string) credentials.TransportCredentials {
	return refusingCreds{TransportCredentials: credentials.NewTLS(s.Server()), r: newRefusals(who)}
}

type refusingCreds struct {
	credentials.TransportCredentials
	r *refusals
}

func (c refusingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	from := conn.RemoteAddr().String()
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.r.log(from, err.Error())
	}
	return out, info, err
}

func (c refusingCreds) Clone() credentials.TransportCredentials {
	return refusingCreds{TransportCredentials: c.TransportCredentials.Clone(), r: c.r}
}

// HTTPErrorLog is an http.Server's ErrorLog logging as who's, as
// refusals are: refused TLS handshakes with their reason, anything else
// as it comes.
func HTTPErrorLog(who string) *log.Logger {
	return log.New(httpLog{newRefusals(who)}, "", 0)
}

type httpLog struct{ r *refusals }

func (h httpLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	// net/http: "http: TLS handshake error from ADDR: REASON".
	from, reason := "", line
	if rest, ok := strings.CutPrefix(line, "http: TLS handshake error from "); ok {
		from, reason, _ = strings.Cut(rest, ": ")
	}
	h.r.log(from, reason)
	return len(p), nil
}
