package bench_test

import (
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/bench"
)

// TestPool: pooled spans count each call that ended in any of them once,
// and their percentiles are over those calls alone.
func TestPool(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var calls []bench.Call
	// One call ends every 10ms for 1s, taking (i+1)ms; every tenth fails.
	for i := range 100 {
		end := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		c := bench.Call{Start: end.Add(-time.Duration(i+1) * time.Millisecond), End: end, Version: 1}
		if i%10 == 9 {
			c.Err = "Unavailable"
		}
		calls = append(calls, c)
	}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// [0, 100ms) and [500ms, 600ms), and a span overlapping the first.
	w := bench.Pool(calls, []bench.Span{{From: at(0), To: at(100)}, {From: at(500), To: at(600)}, {From: at(50), To: at(80)}})
	if w.Requests != 20 || w.Failed != 2 || w.Codes["Unavailable"] != 2 || w.Versions[1] != 18 {
		t.Fatalf("pooled window %+v, want 20 requests, 2 failed", w)
	}
	// Answered: calls 0-8 (1-9ms) and 50-58 (51-59ms); the p99 is the
	// slowest, the p50 the 10th of 18.
	if w.P99 != 59*time.Millisecond || w.P50 != 51*time.Millisecond {
		t.Fatalf("pooled p50 %v p99 %v, want 51ms and 59ms", w.P50, w.P99)
	}
	if s := bench.Summarize(calls, at(0), at(100)); s.Requests != 10 || s.P99 != 9*time.Millisecond {
		t.Fatalf("one span: %+v", s)
	}
	if e := bench.Pool(calls, nil); e.Requests != 0 || e.P99 != 0 {
		t.Fatalf("no span: %+v", e)
	}
}
