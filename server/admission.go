package server

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cumulus-serving/cumulus/internal/admit"
	"github.com/cumulus-serving/cumulus/router"
)

// admission is the front's bound on infer work in flight: a slot per
// request (MaxInflight) and the request's bytes (MaxInflightBytes), each
// with a short queue (internal/admit).
type admission struct {
	slots, bytes *admit.Gate
	refused      *prometheus.CounterVec
	refusedIn    prometheus.Histogram
	waiting      prometheus.GaugeFunc
}

func newAdmission(o *Options) *admission {
	a := &admission{
		slots: admit.NewGate(int64(o.MaxInflight), o.MaxQueueTime),
		bytes: admit.NewGate(o.MaxInflightBytes, o.MaxQueueTime),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_admission_refused_total",
			Help: "Infer requests refused as overload (ResourceExhausted, HTTP 429), by API and the bound that refused them."}, []string{"api", "bound"}),
	}
	a.refusedIn = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cumulus_admission_refusal_seconds",
		Help:    "Time from a request's admission check to its refusal as overload (the queue time, or nothing when refused at once).",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16)})
	a.waiting = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cumulus_admission_waiting",
		Help: "Infer requests queued for admission now."}, func() float64 { return float64(a.slots.Waiting() + a.bytes.Waiting()) })
	return a
}

// retryPushbackMS is what a refused gRPC caller is told to wait, in the
// grpc-retry-pushback-ms trailer and as google.rpc.RetryInfo in the
// status details (grpcFailure; HTTP's Retry-After counts whole seconds:
// 1).
const retryPushbackMS = 100

// refusal is the error for a request admission turned down, having asked
// since t0.
func (s *Server) refusal(ctx context.Context, api, bound string, err error, t0 time.Time) error {
	if ctx.Err() != nil {
		return router.ContextError(ctx, "admission")
	}
	s.adm.refused.WithLabelValues(api, bound).Inc()
	s.adm.refusedIn.Observe(time.Since(t0).Seconds())
	return fmt.Errorf("server: %w: %w: at the bound of %s in flight; retry later", router.ErrResourceExhausted, err, bound)
}
