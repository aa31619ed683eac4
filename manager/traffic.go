package manager

// Routers' traffic, as the console shows it: the manager reads the
// metrics each router publishes (the address in its registration,
// topo.RouterInfo.Metrics) and aggregates them per model and track, so
// that the page talks only to its own origin. Reads happen only while
// someone looks (Traffic is called by GET /admin/v1/console), at most
// once a second, and are bounded in time and bytes: a router's metrics
// are a peer's report like any other.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

const (
	// maxMetricsBytes bounds one router's metrics page, maxMetricsLine
	// one line of it.
	maxMetricsBytes = 2 << 20
	maxMetricsLine  = 64 << 10
	// maxMetricsReads bounds the routers read at once.
	maxMetricsReads = 8
	// maxTrafficSeries bounds the (model, track) pairs kept per router
	// (besides: only known models' stable and canary tracks are kept).
	maxTrafficSeries = 1024
	// maxBuckets bounds a latency histogram's buckets (the router's have
	// 17).
	maxBuckets = 32
	// trafficWindow is the span rates and quantiles are taken over.
	trafficWindow = 10 * time.Second
	// metricsTimeout bounds one read of a router's metrics.
	metricsTimeout = time.Second
)

// Traffic is one model's track over the last trafficWindow, summed over
// the routers that report it.
type Traffic struct {
	Model string `json:"model"`
	Track string `json:"track"`
	// QPS is predict calls answered a second; Errors failed ones a second.
	QPS    float64 `json:"qps"`
	Errors float64 `json:"errors"`
	// P99 is the 99th percentile latency in seconds, interpolated within
	// the routers' histogram buckets (0: no calls).
	P99 float64 `json:"p99"`
	// Seconds is the span the figures cover.
	Seconds float64 `json:"seconds"`
}

// trackKey is a (model, track) pair.
type trackKey struct{ model, track string }

// trackCounts is one router's cumulative counts for a track.
type trackCounts struct {
	ok, failed float64
	// buckets are the latency histogram's cumulative counts, by upper
	// bound (the +Inf bucket last).
	bounds, buckets []float64
}

// routerSample is one read of a router's metrics.
type routerSample struct {
	at     time.Time
	tracks map[trackKey]trackCounts
}

// parseRouterMetrics reads the router families of a Prometheus text
// page: cumulus_router_requests_total and cumulus_router_request_seconds.
func parseRouterMetrics(r io.Reader, known func(model string) bool) (map[trackKey]trackCounts, error) {
	// Only the two families' lines reach the parser, which holds all it
	// parses: a page's other families cost a read, not memory.
	lr := &io.LimitedReader{R: r, N: maxMetricsBytes + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 4096), maxMetricsLine)
	var kept bytes.Buffer
	for sc.Scan() {
		line := sc.Bytes()
		name := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("# TYPE ")), []byte("# HELP "))
		if bytes.HasPrefix(name, []byte("cumulus_router_requests_total")) || bytes.HasPrefix(name, []byte("cumulus_router_request_seconds")) {
			kept.Write(line)
			kept.WriteByte('\n')
		}
	}
	if lr.N <= 0 {
		return nil, fmt.Errorf("metrics page over %d bytes", maxMetricsBytes)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics page: %w", err)
	}
	parser := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(&kept)
	if err != nil {
		return nil, fmt.Errorf("metrics page: %w", err)
	}
	out := map[trackKey]trackCounts{}
	key := func(m *dto.Metric) (trackKey, bool) {
		var k trackKey
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "model":
				k.model = l.GetValue()
			case "track":
				k.track = l.GetValue()
			}
		}
		_, seen := out[k]
		return k, (k.track == "stable" || k.track == "canary") && k.model != "" && known(k.model) && (seen || len(out) < maxTrafficSeries)
	}
	if f := fams["cumulus_router_requests_total"]; f != nil {
		for _, m := range f.GetMetric() {
			k, ok := key(m)
			if !ok {
				continue
			}
			c := out[k]
			v := m.GetCounter().GetValue()
			if m.GetCounter() == nil {
				v = m.GetUntyped().GetValue() // a page without its TYPE line
			}
			if !validCount(v) {
				continue
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					if l.GetValue() == "ok" {
						c.ok += v
					} else {
						c.failed += v
					}
				}
			}
			out[k] = c
		}
	}
	if f := fams["cumulus_router_request_seconds"]; f != nil {
		for _, m := range f.GetMetric() {
			k, ok := key(m)
			h := m.GetHistogram()
			if !ok || h == nil || len(h.GetBucket()) > maxBuckets {
				continue
			}
			c := out[k]
			c.bounds, c.buckets = nil, nil
			for _, b := range h.GetBucket() {
				if !validCount(float64(b.GetCumulativeCount())) || math.IsNaN(b.GetUpperBound()) {
					c.bounds, c.buckets = nil, nil
					break
				}
				c.bounds = append(c.bounds, b.GetUpperBound())
				c.buckets = append(c.buckets, float64(b.GetCumulativeCount()))
			}
			if len(c.bounds) > 0 && !math.IsInf(c.bounds[len(c.bounds)-1], 1) {
				c.bounds = append(c.bounds, math.Inf(1))
				c.buckets = append(c.buckets, float64(h.GetSampleCount()))
			}
			out[k] = c
		}
	}
	return out, nil
}

func validCount(v float64) bool { return v >= 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }

// increase is how much a counter rose from was to now; a counter that
// fell was reset (the router restarted), and counts now from zero.
func increase(was, now float64) float64 {
	if now < was {
		return now
	}
	return now - was
}

// trafficBetween aggregates, over routers, what happened between each
// router's old and new sample.
func trafficBetween(old, cur map[string]routerSample) []Traffic {
	type acc struct {
		ok, failed float64
		bounds     []float64
		buckets    []float64
		seconds    float64
	}
	sums := map[trackKey]*acc{}
	for id, n := range cur {
		o, ok := old[id]
		if !ok || !n.at.After(o.at) {
			continue
		}
		secs := n.at.Sub(o.at).Seconds()
		for k, c := range n.tracks {
			was := o.tracks[k]
			a := sums[k]
			if a == nil {
				a = &acc{}
				sums[k] = a
			}
			// Each router's rate over its own span: spans differ by the
			// time between reads.
			a.ok += increase(was.ok, c.ok) / secs
			a.failed += increase(was.failed, c.failed) / secs
			a.seconds = max(a.seconds, secs)
			if len(c.bounds) == 0 {
				continue
			}
			if a.bounds == nil {
				a.bounds, a.buckets = c.bounds, make([]float64, len(c.bounds))
			}
			if !slices.Equal(a.bounds, c.bounds) {
				continue // another layout of buckets: not summable
			}
			same := slices.Equal(was.bounds, c.bounds)
			for i := range c.buckets {
				w := 0.0
				if same {
					w = was.buckets[i]
				}
				a.buckets[i] += increase(w, c.buckets[i])
			}
		}
	}
	out := []Traffic{}
	for _, k := range slices.SortedFunc(maps.Keys(sums), func(a, b trackKey) int {
		return cmp.Or(cmp.Compare(a.model, b.model), cmp.Compare(a.track, b.track))
	}) {
		a := sums[k]
		out = append(out, Traffic{Model: k.model, Track: k.track, QPS: a.ok + a.failed, Errors: a.failed,
			P99: bucketQuantile(0.99, a.bounds, a.buckets), Seconds: a.seconds})
	}
	return out
}

// bucketQuantile is the q-quantile of a histogram given as cumulative
// counts by upper bound, interpolated linearly within its bucket (the
// lowest bucket from 0; the +Inf bucket answers its lower bound). 0 if
// the histogram is empty.
func bucketQuantile(q float64, bounds, cum []float64) float64 {
	if len(cum) == 0 || cum[len(cum)-1] <= 0 {
		return 0
	}
	// Cumulative counts summed from increases can dip when routers
	// restart mid-window; keep them monotonic.
	c := slices.Clone(cum)
	for i := 1; i < len(c); i++ {
		c[i] = max(c[i], c[i-1])
	}
	rank := q * c[len(c)-1]
	i := sort.SearchFloat64s(c, rank)
	if i >= len(c) {
		i = len(c) - 1
	}
	if math.IsInf(bounds[i], 1) {
		if i == 0 {
			return 0
		}
		return bounds[i-1]
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = bounds[i-1], c[i-1]
	}
	in := c[i] - below
	if in <= 0 {
		return bounds[i]
	}
	return lo + (bounds[i]-lo)*(rank-below)/in
}

// metricsURL checks a router's metrics address: http(s)://HOST/metrics,
// and nothing else (no user, query or fragment; no other path: a forged
// registration cannot point the manager at another API).
func metricsURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" || u.RawQuery != "" || u.Path != "/metrics" || len(s) > 512 {
		return nil, errors.New("not an http(s) URL of a host's /metrics")
	}
	return u, nil
}

// trafficRead is one read of every router's metrics, at a time.
type trafficRead struct {
	at      time.Time
	samples map[string]routerSample // by router ID: those read
}

// trafficReader keeps the routers' recent samples.
type trafficReader struct {
	client *http.Client
	mu     sync.Mutex // one read at a time; guards what follows
	last   time.Time
	// history is each read's samples, oldest first, over twice the
	// window.
	history []trafficRead
	errs    map[string]string // router ID → why its metrics could not be read
}

// newTrafficReader reads routers' metrics; https ones with tlsFor's
// configuration for the host dialled (nil: the system's roots).
func newTrafficReader(tlsFor func(host string) *tls.Config) *trafficReader {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2
	if tlsFor != nil {
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			d := tls.Dialer{Config: tlsFor(host)}
			return d.DialContext(ctx, network, addr)
		}
	}
	return &trafficReader{client: &http.Client{Transport: tr, Timeout: metricsTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// read returns the traffic over the last window, reading the routers'
// metrics first if the last read is over a second old.
// Only the tracks of models known says it knows are kept.
func (t *trafficReader) read(ctx context.Context, routers map[string]topo.RouterInfo, now time.Time, known func(model string) bool) ([]Traffic, map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Sub(t.last) >= time.Second {
		t.last = now
		cur, errs := t.sample(ctx, routers, now, known)
		t.errs = errs
		// The newest read replaces the one before it unless that one is
		// 2 s older than the one before: about 7 reads are kept.
		read := trafficRead{at: now, samples: cur}
		if n := len(t.history); n >= 2 && t.history[n-1].at.Sub(t.history[n-2].at) < 2*time.Second {
			t.history[n-1] = read
		} else {
			t.history = append(t.history, read)
		}
		for len(t.history) > 1 && now.Sub(t.history[1].at) > trafficWindow+2*time.Second {
			t.history = t.history[1:]
		}
	}
	if len(t.history) == 0 {
		return []Traffic{}, t.errs
	}
	cur := t.history[len(t.history)-1].samples
	// Per router, its newest sample and its oldest within the window.
	old := map[string]routerSample{}
	for _, h := range t.history {
		for id, s := range h.samples {
			if _, ok := old[id]; !ok && now.Sub(s.at) <= trafficWindow+time.Second {
				old[id] = s
			}
		}
	}
	// The routers read this time (a router gone, or not read, has no
	// figures), each against its oldest read in the window.
	return trafficBetween(old, cur), t.errs
}

// sample reads every router's metrics at once, as of now.
func (t *trafficReader) sample(ctx context.Context, routers map[string]topo.RouterInfo, now time.Time, known func(string) bool) (map[string]routerSample, map[string]string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	out, errs := map[string]routerSample{}, map[string]string{}
	// All of them within about a read's time: those not read by then
	// wait for the next.
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout+500*time.Millisecond)
	defer cancel()
	sem := make(chan struct{}, maxMetricsReads)
	for id, r := range routers {
		if r.Metrics == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				mu.Lock()
				errs[id] = "not read: the other routers' reads took the time"
				mu.Unlock()
				return
			}
			tracks, err := t.get(ctx, r.Metrics, known)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[id] = err.Error()
				return
			}
			out[id] = routerSample{at: now, tracks: tracks}
		}()
	}
	wg.Wait()
	return out, errs
}

func (t *trafficReader) get(ctx context.Context, raw string, known func(string) bool) (map[trackKey]trackCounts, error) {
	u, err := metricsURL(raw)
	if err != nil {
		return nil, fmt.Errorf("metrics address %q: %w", raw, err)
	}
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)
	}
	return parseRouterMetrics(resp.Body, known)
}
