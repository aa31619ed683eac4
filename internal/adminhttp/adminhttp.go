// Package adminhttp is what every Cumulus admin API shares: the bearer
// token check, JSON answers and the server. The manager's admin API and a shard's
// HTTP surface use it.
package adminhttp

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// Auth refuses a call without "Authorization: Bearer token", comparing
// in constant time, with 401 and a warning naming who (the server) and
// the caller. It changes nothing, and calls h only when the token is
// right.
func Auth(who, token string, h http.HandlerFunc) http.HandlerFunc {
	return AuthFor(who, "admin", token, h)
}

// AuthFor is Auth for a token of another kind ("push"): the refusal
// names it.
func AuthFor(who, kind, token string, h http.HandlerFunc) http.HandlerFunc {
	want := []byte("Bearer " + token)
	return func(w http.ResponseWriter, r *http.Request) {
		if token == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			slog.Warn(who+": "+kind+" call refused: missing or wrong token", "from", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
			w.Header().Set("WWW-Authenticate", `Bearer realm="cumulus-`+kind+`"`)
			WriteError(w, http.StatusUnauthorized, "missing or wrong "+kind+" token (Authorization: Bearer TOKEN)")
			return
		}
		h(w, r)
	}
}

// WriteJSON answers v as indented JSON with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// WriteError answers {"error": msg} with status code.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, map[string]string{"error": msg})
}

// Server is an admin HTTP surface served in the background, with bounds
// on how long a client may take to send and to read.
type Server struct {
	srv *http.Server
	lis net.Listener
}

// Serve listens on addr and serves h, over TLS with tlsConfig (nil:
// plaintext); a response may take up to writeTimeout to be written.
// Refused handshakes are logged, rate-limited, as who's.
func Serve(addr string, h http.Handler, writeTimeout time.Duration, tlsConfig *tls.Config, who string) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{lis: lis, srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: writeTimeout, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10, TLSConfig: tlsConfig,
		ErrorLog: tlsconf.HTTPErrorLog(who)}}
	if tlsConfig != nil {
		go s.srv.ServeTLS(lis, "", "")
	} else {
		go s.srv.Serve(lis)
	}
	return s, nil
}

// Addr is the address it listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Close stops serving, waiting up to 5 seconds for calls under way.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
}

// HandleProbes adds to mux what Kubernetes' probes and metrics scrapers
// ask, with no token: GET /healthz (200 while the process runs), GET
// /readyz (200 when ready returns nil, else 503 with its error) and GET
// /metrics (g's; none if g is nil).
func HandleProbes(mux *http.ServeMux, ready func(context.Context) error, g prometheus.Gatherer) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	if g != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
}

// Probes is HandleProbes on an address of its own (no client
// certificate either). ready's answer is kept for a second: probes
// hammering the address cost at most one check a second.
func Probes(ready func(context.Context) error, g prometheus.Gatherer) http.Handler {
	var mu sync.Mutex
	var last time.Time
	var lastErr error
	cached := func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) > time.Second {
			// Not the caller's context: a probe that gives up must not
			// leave its "canceled" to the others for a second.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			lastErr, last = ready(ctx), time.Now()
			cancel()
		}
		return lastErr
	}
	mux := http.NewServeMux()
	HandleProbes(mux, cached, g)
	return mux
}
