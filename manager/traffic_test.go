package manager

import (
	"bytes"
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// routerMetrics is a registry with the router's two families, as
// router/canary.go declares them.
func routerMetrics() (*prometheus.Registry, *prometheus.CounterVec, *prometheus.HistogramVec) {
	reg := prometheus.NewRegistry()
	req := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_router_requests_total"}, []string{"model", "track", "outcome"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cumulus_router_request_seconds", Buckets: prometheus.ExponentialBuckets(100e-6, 2, 16)}, []string{"model", "track"})
	reg.MustRegister(req, lat, prometheus.NewCounter(prometheus.CounterOpts{Name: "other_total"}))
	return reg, req, lat
}

// anyModel knows every model; onlyM knows m.
func anyModel(string) bool { return true }

func onlyM(model string) bool { return model == "m" }

func page(t *testing.T, g prometheus.Gatherer) []byte {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func TestTrafficFromRouterMetrics(t *testing.T) {
	reg, req, lat := routerMetrics()
	before, err := parseRouterMetrics(bytes.NewReader(page(t, reg)), onlyM)
	if err != nil || len(before) != 0 {
		t.Fatalf("an empty page: %v, %v", before, err)
	}
	old := map[string]routerSample{"r1": {at: time.Unix(100, 0), tracks: before}}
	// 10 seconds of 1,000 calls: 980 at 1 ms, 20 at 100 ms of which 5
	// failed; a canary's 100 calls at 2 ms.
	for range 980 {
		req.WithLabelValues("m", "stable", "ok").Inc()
		lat.WithLabelValues("m", "stable").Observe(0.001)
	}
	for range 15 {
		req.WithLabelValues("m", "stable", "ok").Inc()
		lat.WithLabelValues("m", "stable").Observe(0.1)
	}
	for range 5 {
		req.WithLabelValues("m", "stable", "error").Inc()
		lat.WithLabelValues("m", "stable").Observe(0.1)
	}
	for range 100 {
		req.WithLabelValues("m", "canary", "ok").Inc()
		lat.WithLabelValues("m", "canary").Observe(0.002)
	}
	// A model the manager does not know is left out.
	req.WithLabelValues("zz", "stable", "ok").Add(1e6)
	after, err := parseRouterMetrics(bytes.NewReader(page(t, reg)), onlyM)
	if err != nil {
		t.Fatal(err)
	}
	cur := map[string]routerSample{"r1": {at: time.Unix(110, 0), tracks: after}}
	got := trafficBetween(old, cur)
	if len(got) != 2 || got[0].Track != "canary" || got[1].Track != "stable" {
		t.Fatalf("traffic %+v; want m's canary and stable tracks", got)
	}
	st, ca := got[1], got[0]
	if st.QPS != 100 || st.Errors != 0.5 || ca.QPS != 10 || st.Seconds != 10 {
		t.Fatalf("stable %+v, canary %+v; want 100 and 10 calls a second, 0.5 errors", st, ca)
	}
	// The 99th percentile falls among the 100 ms calls: in the bucket
	// (51.2 ms, 102.4 ms].
	if st.P99 <= 0.0512 || st.P99 > 0.1024 {
		t.Fatalf("stable p99 %v; want within (51.2 ms, 102.4 ms]", st.P99)
	}
	if ca.P99 <= 0.0016 || ca.P99 > 0.0032 {
		t.Fatalf("canary p99 %v; want within (1.6 ms, 3.2 ms]", ca.P99)
	}

	// A second router's rates add; a router that restarted counts from
	// zero.
	old["r2"] = routerSample{at: time.Unix(100, 0), tracks: after}
	cur["r2"] = routerSample{at: time.Unix(105, 0), tracks: before}
	if got := trafficBetween(old, cur); got[1].QPS != 100 {
		t.Fatalf("with a router reset to nothing: %+v; want the first router's 100/s", got[1])
	}
	cur["r2"] = routerSample{at: time.Unix(105, 0), tracks: after}
	if got := trafficBetween(old, cur); got[1].QPS != 100 {
		t.Fatalf("with an idle router: %+v; want 100/s", got[1])
	}
}

func TestBucketQuantile(t *testing.T) {
	bounds := []float64{1, 2, 4, math.Inf(1)}
	for _, c := range []struct {
		cum  []float64
		q    float64
		want float64
	}{
		{[]float64{0, 0, 0, 0}, 0.99, 0},
		{[]float64{100, 100, 100, 100}, 0.5, 0.5}, // all in the first bucket, from 0
		{[]float64{0, 100, 100, 100}, 0.5, 1.5},
		{[]float64{0, 0, 0, 100}, 0.99, 4}, // in +Inf: its lower bound
		{[]float64{50, 40, 100, 100}, 0.5, 1},
	} {
		if got := bucketQuantile(c.q, bounds, c.cum); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile %v of %v = %v; want %v", c.q, c.cum, got, c.want)
		}
	}
}

func TestRouterMetricsRefused(t *testing.T) {
	for name, in := range map[string]string{
		"garbage":   "cumulus_router_requests_total{model=\"m\" 1\n",
		"oversized": "# " + strings.Repeat("x", maxMetricsBytes) + "\n",
		"long line": "other_total{a=\"" + strings.Repeat("x", maxMetricsLine) + "\"} 1\n",
	} {
		if _, err := parseRouterMetrics(strings.NewReader(in), anyModel); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Negative or NaN counts, series without a model or of another
	// track, are left out.
	got, err := parseRouterMetrics(strings.NewReader(`cumulus_router_requests_total{model="m",track="stable",outcome="ok"} -5
cumulus_router_requests_total{model="n",track="stable",outcome="ok"} NaN
cumulus_router_requests_total{track="stable",outcome="ok"} 7
cumulus_router_requests_total{model="m",track="other",outcome="ok"} 7
cumulus_router_requests_total{model="m",track="canary",outcome="ok"} 4
`), anyModel)
	if err != nil || len(got) != 1 || got[trackKey{"m", "canary"}].ok != 4 {
		t.Fatalf("%+v, %v", got, err)
	}
	for _, u := range []string{"file:///etc/passwd", "http://", "http://u:p@h/metrics", "gopher://h/", "h:80", "http://h/admin/v1/console", "http://h/metrics?x=1", "http://h/"} {
		if _, err := metricsURL(u); err == nil {
			t.Errorf("metrics address %q accepted", u)
		}
	}
}

// TestTrafficReader reads a router's metrics over a real socket, twice,
// and a router whose address serves no metrics.
func TestTrafficReader(t *testing.T) {
	reg, req, _ := routerMetrics()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	bad := httptest.NewServer(http.NotFoundHandler())
	defer bad.Close()
	routers := map[string]topo.RouterInfo{"r1": {ID: "r1", Metrics: srv.URL + "/metrics"}, "r2": {ID: "r2", Metrics: bad.URL + "/metrics"}, "r3": {ID: "r3"}}
	tr := newTrafficReader(nil)
	t0 := time.Now()
	if got, _ := tr.read(context.Background(), routers, t0, anyModel); len(got) != 0 {
		t.Fatalf("one read: %+v; want nothing yet", got)
	}
	req.WithLabelValues("m", "stable", "ok").Add(30)
	// Within a second: no new read.
	if got, _ := tr.read(context.Background(), routers, t0.Add(500*time.Millisecond), anyModel); len(got) != 0 {
		t.Fatalf("a read within the second: %+v", got)
	}
	got, errs := tr.read(context.Background(), routers, t0.Add(3*time.Second), anyModel)
	if len(got) != 1 || got[0].QPS != 10 {
		t.Fatalf("traffic %+v; want m at 10/s", got)
	}
	if !strings.Contains(errs["r2"], "404") || errs["r1"] != "" || errs["r3"] != "" {
		t.Fatalf("errors %v; want r2's 404 only", errs)
	}
}

func FuzzParseRouterMetrics(f *testing.F) {
	reg, req, lat := routerMetrics()
	req.WithLabelValues("m", "stable", "ok").Add(3)
	lat.WithLabelValues("m", "stable").Observe(0.01)
	fams, _ := reg.Gather()
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, fam := range fams {
		enc.Encode(fam)
	}
	f.Add(b.Bytes())
	f.Add([]byte("cumulus_router_request_seconds_bucket{model=\"m\",track=\"t\",le=\"NaN\"} 1\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := parseRouterMetrics(bytes.NewReader(in), anyModel)
		if err != nil {
			return
		}
		for _, c := range got {
			if len(c.bounds) != len(c.buckets) || c.ok < 0 || c.failed < 0 {
				t.Fatalf("inconsistent %+v", c)
			}
			if len(c.bounds) > 0 {
				q := bucketQuantile(0.99, c.bounds, c.buckets)
				if math.IsNaN(q) || q < 0 {
					t.Fatalf("quantile %v of %+v", q, c)
				}
			}
		}
	})
}

func TestConsoleOf(t *testing.T) {
	for u, want := range map[string]bool{
		"http://10.0.0.1:8002/console/":        true,
		"https://m0.example:8002/console/":     false, // another host than the raft address's
		"http://10.0.0.1:8002/console/?x=1":    false,
		"javascript:alert(1)//10.0.0.1/":       false,
		"http://10.0.0.1:8002/admin/v1/models": false,
		"http://u@10.0.0.1:8002/console/":      false,
	} {
		if got := consoleOf(u, "10.0.0.1:7400"); (got == u) != want || (!want && got != "") {
			t.Errorf("consoleOf(%q) = %q; want it kept: %v", u, got, want)
		}
	}
}
