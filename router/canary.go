package router

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// A model's canary (topo.Assignment.Canary) answers a fixed share of its
// unpinned requests: those whose key hashes below the share,
// xxh64(key) / 2^64 < fraction. The key is the request's CanaryKey (the
// front sets it from parameters.canary_key, else the KServe id), or a
// random draw when it has none; every router hashes alike, so a key
// (a user) stays on one arm whichever router it reaches. A request may
// also name its arm (Track) or a version. The choice is made once per
// request: replica retries, hedges and a rerun on a newer routing table
// stay on the arm.

// Tracks a request may name.
const (
	TrackStable = "stable"
	TrackCanary = "canary"
)

// draw is req's position in [0, 2^64) for the canary split.
func draw(req *Request) uint64 {
	if req.CanaryKey == "" {
		return rand.Uint64()
	}
	return xxhash.Sum64String(req.CanaryKey)
}

// threshold is the draw below which a request goes to a canary of
// fraction f (0 < f ≤ 0.5).
func threshold(f float64) uint64 {
	if !(f > 0) {
		return 0
	}
	return uint64(math.Ldexp(min(f, 0.5), 64))
}

// trackMetrics are one model's and one track's request metrics.
type trackMetrics struct {
	ok, failed prometheus.Counter
	latency    prometheus.Observer
	rows       prometheus.Counter
	scores     prometheus.Counter
}

// tracks holds the router's per-track metrics, the label sets made once
// per model and track (the watch goroutine makes them; requests read the
// routing table's pointers).
type tracks struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	rows     *prometheus.CounterVec
	scores   *prometheus.CounterVec
	version  *prometheus.GaugeVec
	made     map[[2]string]*trackMetrics
	versions map[string]bool // models the version gauge has
}

func newTracks() *tracks {
	return &tracks{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_router_requests_total",
			Help: "Predict calls answered from a model's stable (live) or canary version, by outcome."}, []string{"model", "track", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cumulus_router_request_seconds",
			Help:    "Latency of predict calls answered, by model and track (stable or canary).",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 16)}, []string{"model", "track"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_router_scored_rows_total",
			Help: "Rows scored, by model and track; with cumulus_router_score_sum, the mean score."}, []string{"model", "track"}),
		scores: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_router_score_sum",
			Help: "Sum of the scores given, by model and track: divided by cumulus_router_scored_rows_total, the mean score."}, []string{"model", "track"}),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cumulus_model_version",
			Help: "The version answering a model's unpinned requests, per track (stable: the live version; canary: its canary, absent when none)."}, []string{"model", "track"}),
		made: map[[2]string]*trackMetrics{}, versions: map[string]bool{},
	}
}

func (t *tracks) collectors() []prometheus.Collector {
	return []prometheus.Collector{t.requests, t.latency, t.rows, t.scores, t.version}
}

// of is the metrics of model's track.
func (t *tracks) of(model, track string) *trackMetrics {
	k := [2]string{model, track}
	if m := t.made[k]; m != nil {
		return m
	}
	m := &trackMetrics{ok: t.requests.WithLabelValues(model, track, "ok"), failed: t.requests.WithLabelValues(model, track, "error"),
		latency: t.latency.WithLabelValues(model, track), rows: t.rows.WithLabelValues(model, track), scores: t.scores.WithLabelValues(model, track)}
	t.made[k] = m
	return m
}

// label gives tab's routes their metrics and sets the version gauge;
// models gone from the routing table leave it. The watch goroutine only,
// before tab is in use.
func (t *tracks) label(tab *table) {
	for name, mr := range tab.models {
		mr.stableObs = t.of(name, TrackStable)
		if mr.live != nil {
			t.version.WithLabelValues(name, TrackStable).Set(float64(mr.live.version))
		} else {
			t.version.DeleteLabelValues(name, TrackStable)
		}
		if mr.canary != nil {
			mr.canaryObs = t.of(name, TrackCanary)
			t.version.WithLabelValues(name, TrackCanary).Set(float64(mr.canary.version))
		} else {
			t.version.DeleteLabelValues(name, TrackCanary)
		}
		t.versions[name] = true
	}
	for name := range t.versions {
		if tab.models[name] == nil {
			// The model left: its label sets go, so that they do not
			// pile up as models come and go.
			for _, vec := range []interface{ DeletePartialMatch(prometheus.Labels) int }{t.version, t.requests, t.latency, t.rows, t.scores} {
				vec.DeletePartialMatch(prometheus.Labels{"model": name})
			}
			delete(t.made, [2]string{name, TrackStable})
			delete(t.made, [2]string{name, TrackCanary})
			delete(t.versions, name)
		}
	}
}

// choose is the route of mr that answers req, with its metrics (nil for
// a request pinned to a version), given its draw.
func (mr *modelRoute) choose(req *Request, d uint64) (*versionRoute, *trackMetrics, error) {
	switch {
	case req.Version != 0:
		if vr := mr.versions[req.Version]; vr != nil {
			return vr, nil, nil
		}
		return nil, nil, fmt.Errorf("router: %w: model %q version %d is not served (servable: %v)", ErrNotFound, mr.name, req.Version, slices.Sorted(maps.Keys(mr.versions)))
	case req.Track == TrackCanary:
		if mr.canary == nil {
			return nil, nil, fmt.Errorf("router: %w: model %q has no canary serving", ErrNotFound, mr.name)
		}
		return mr.canary, mr.canaryObs, nil
	case req.Track == "" && mr.canary != nil && d < mr.threshold:
		return mr.canary, mr.canaryObs, nil
	}
	return mr.live, mr.stableObs, nil
}

// observe records one request's outcome on its track (m nil: a pinned
// request, or no version chosen).
func (m *trackMetrics) observe(resp *Response, err error, start time.Time) {
	if m == nil {
		return
	}
	if err != nil {
		m.failed.Inc()
		return
	}
	m.ok.Inc()
	m.latency.Observe(time.Since(start).Seconds())
	var sum float64
	for _, s := range resp.Scores {
		sum += float64(s)
	}
	m.rows.Add(float64(len(resp.Scores)))
	m.scores.Add(sum)
}
