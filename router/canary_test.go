package router

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

// TestCanaryChoice: a request's key decides its arm (xxh64(key)/2^64 <
// fraction), the same on every call; a named track or version overrides
// it; a canary track with no canary is NotFound.
func TestCanaryChoice(t *testing.T) {
	live, canary, standby := &versionRoute{version: 1}, &versionRoute{version: 2}, &versionRoute{version: 3}
	mr := &modelRoute{name: "m", live: live, canary: canary, threshold: threshold(0.25),
		versions: map[uint64]*versionRoute{1: live, 2: canary, 3: standby}, stableObs: &trackMetrics{}, canaryObs: &trackMetrics{}}
	n, onCanary := 20000, 0
	for i := range n {
		req := &Request{CanaryKey: fmt.Sprint("user-", i)}
		vr, tm, err := mr.choose(req, draw(req))
		if err != nil {
			t.Fatal(err)
		}
		again, _, _ := mr.choose(req, draw(req))
		if again != vr || (vr == canary) != (tm == mr.canaryObs) {
			t.Fatalf("key %s: %d then %d", req.CanaryKey, vr.version, again.version)
		}
		if vr == canary {
			onCanary++
		}
	}
	// Binomial: mean 5000, standard deviation √(20000·0.25·0.75) ≈ 61.
	if math.Abs(float64(onCanary)-0.25*float64(n)) > 4*math.Sqrt(float64(n)*0.25*0.75) {
		t.Fatalf("%d of %d keys on a 25%% canary", onCanary, n)
	}
	for _, c := range []struct {
		req  Request
		want *versionRoute
	}{
		{Request{Track: TrackStable}, live},
		{Request{Track: TrackCanary}, canary},
		{Request{Version: 3}, standby},
		{Request{Version: 2}, canary},
	} {
		if vr, _, err := mr.choose(&c.req, 0); err != nil || vr != c.want {
			t.Fatalf("%+v: %v %v", c.req, vr, err)
		}
	}
	if threshold(0.5) != 1<<63 || threshold(0) != 0 || threshold(math.NaN()) != 0 {
		t.Fatal("thresholds")
	}
	mr.canary = nil
	if _, _, err := mr.choose(&Request{Track: TrackCanary}, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("canary track with no canary: %v", err)
	}
	for i := range 100 {
		req := &Request{CanaryKey: fmt.Sprint(i)}
		if vr, _, _ := mr.choose(req, draw(req)); vr != live {
			t.Fatal("a request went to a canary that is gone")
		}
	}
	for _, r := range []Request{{Track: "beta"}, {Track: TrackCanary, Version: 2}} {
		r.Model, r.RowSplits = "m", []int64{0, 0}
		if err := r.Validate(Limits{}); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%+v: %v", r, err)
		}
	}
}

// TestCanaryChoiceAllocs: choosing an arm and counting the answer on its
// track allocate nothing.
func TestCanaryChoiceAllocs(t *testing.T) {
	tr := newTracks()
	live, canary := &versionRoute{version: 1}, &versionRoute{version: 2}
	mr := &modelRoute{name: "m", live: live, canary: canary, threshold: threshold(0.1),
		versions: map[uint64]*versionRoute{1: live, 2: canary}, stableObs: tr.of("m", TrackStable), canaryObs: tr.of("m", TrackCanary)}
	req := &Request{CanaryKey: "user-42"}
	resp := &Response{Scores: []float32{0.25, 0.5}}
	start := time.Now()
	if n := testing.AllocsPerRun(1000, func() {
		_, tm, _ := mr.choose(req, draw(req))
		tm.observe(resp, nil, start)
	}); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}
