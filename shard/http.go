package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cumulus-serving/cumulus/internal/adminhttp"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// Ready reports whether the shard holds what the serving map assigns it
// and is not draining: its gRPC health is SERVING.
func (s *Shard) Ready() bool {
	r, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
	return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// CheckReady is Ready as a probe's check: nil when ready, else why not.
func (s *Shard) CheckReady(context.Context) error {
	if !s.Ready() {
		return errors.New("does not hold everything the serving map assigns it yet, or draining")
	}
	return nil
}

// FaultBody is the body of GET and PUT /admin/v1/fault.
type FaultBody struct {
	Spec string `json:"spec"`
}

// HTTPHandler is the shard's HTTP surface:
//
//	GET /metrics           gatherer's metrics (none if nil)
//	GET /healthz           200 while the process runs
//	GET /readyz            200 when Ready, else 503
//	GET /admin/v1/fault    {"spec": "SPEC"}: the faults injected now
//	PUT /admin/v1/fault    {"spec": "SPEC"}: inject these ("" clears)
//
// The admin calls need "Authorization: Bearer token"; with no token they
// are refused. A shard with TLS takes them only over TLS from an
// operator's certificate (tlsconf.RoleOperator), on a server of
// tlsconf.Source.ServerAsking: probes and scrapers present none.
func (s *Shard) HTTPHandler(token string, gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	adminhttp.HandleProbes(mux, s.CheckReady, gatherer)
	who := "shard " + s.opts.ID
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		h = adminhttp.Auth(who, token, h)
		if s.opts.TLS == nil {
			return h
		}
		return func(w http.ResponseWriter, r *http.Request) {
			if err := s.opts.TLS.Allow(r.TLS, tlsconf.RoleOperator); err != nil {
				slog.Warn(who+": admin call refused", "from", r.RemoteAddr, "path", r.URL.Path, "reason", err.Error())
				adminhttp.WriteError(w, http.StatusForbidden, "the shard's admin calls take an operator's certificate (TLS, role operator)")
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("GET /admin/v1/fault", auth(func(w http.ResponseWriter, _ *http.Request) {
		adminhttp.WriteJSON(w, http.StatusOK, FaultBody{Spec: s.Faults().String()})
	}))
	mux.HandleFunc("PUT /admin/v1/fault", auth(func(w http.ResponseWriter, r *http.Request) {
		var body FaultBody
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8*maxFaultSpec))
		dec.DisallowUnknownFields()
		err := dec.Decode(&body)
		if err == nil && dec.More() {
			err = errors.New("more after the object")
		}
		if err != nil {
			adminhttp.WriteError(w, http.StatusBadRequest, fmt.Sprintf(`body must be {"spec": "SPEC"}: %v`, err))
			return
		}
		f, err := ParseFaults(body.Spec)
		if err != nil {
			adminhttp.WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
		s.SetFaults(f)
		slog.Warn("shard: faults injected into lookups set", "shard", s.opts.ID, "spec", f.String(), "from", r.RemoteAddr)
		adminhttp.WriteJSON(w, http.StatusOK, FaultBody{Spec: f.String()})
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if strings.HasPrefix(p, "/admin/") {
			auth(func(w http.ResponseWriter, r *http.Request) {
				adminhttp.WriteError(w, http.StatusNotFound, fmt.Sprintf("no admin call %s %s", r.Method, p))
			})(w, r)
			return
		}
		adminhttp.WriteError(w, http.StatusNotFound, fmt.Sprintf("no such path %s %s (/metrics, /healthz, /readyz, /admin/v1/fault)", r.Method, p))
	})
	return mux
}
