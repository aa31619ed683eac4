package hedge

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestScaleSteps(t *testing.T) {
	var s Scale
	if f := s.Factor(); f != 1 {
		t.Fatalf("zero Scale = %v, want 1", f)
	}
	s.Won()
	if f := s.Factor(); f != 1 {
		t.Fatalf("a win at 1 = %v, want 1 (the floor)", f)
	}
	s.Lost()
	if f := s.Factor(); math.Abs(f-scaleUp) > 1e-12 {
		t.Fatalf("a loss = %v, want %v", f, scaleUp)
	}
	for range 100 {
		s.Lost()
	}
	if f := s.Factor(); f != MaxScale {
		t.Fatalf("100 losses = %v, want the cap %v", f, MaxScale)
	}
	if d := s.Of(4 * time.Millisecond); d != 32*time.Millisecond {
		t.Fatalf("4ms at the cap = %v, want 32ms", d)
	}
	wins := 0
	for s.Factor() > 1 {
		s.Won()
		wins++
	}
	if wins != 10 {
		t.Fatalf("%d wins from the cap to 1, want 10", wins)
	}
}

// replicaSim is one replica under the policy: calls to it take
// latency(); one not answered after the scaled base delay is hedged to a
// healthy replica, which answers after alt() more.
type replicaSim struct {
	latency   func() time.Duration
	scale     Scale
	done      []time.Duration // each call's time to an answer
	hedges    int
	hedgeWins int
}

func (r *replicaSim) call(base time.Duration, alt time.Duration) {
	l := r.latency()
	d := r.scale.Of(base)
	if l <= d {
		r.done = append(r.done, l)
		return
	}
	r.hedges++
	if h := d + alt; h < l {
		r.hedgeWins++
		r.scale.Won()
		r.done = append(r.done, h)
	} else {
		r.scale.Lost()
		r.done = append(r.done, l)
	}
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(math.Ceil(q*float64(len(s))))-1]
}

// TestScaleTellsStragglersFromNoise plays the tail issue's case with a
// fixed seed: two replicas with the same noisy latency (1–3 ms, and a
// tail to 8 ms: a busy machine), one of which also answers 1% of its
// calls 50 ms late. Both are hedged against the healthy p95. The
// straggler's p99.9 comes down to within twice the healthy one's, while
// the healthy replica's hedges — noise, mostly lost — fall well below
// the 5% a fixed p95 delay sends.
func TestScaleTellsStragglersFromNoise(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	noise := func() time.Duration {
		d := time.Millisecond + time.Duration(rng.Float64()*float64(2*time.Millisecond))
		if rng.Float64() < 0.08 { // the machine's tail
			d += time.Duration(rng.ExpFloat64() * float64(1500*time.Microsecond))
		}
		return d
	}
	healthy := &replicaSim{latency: noise}
	straggler := &replicaSim{latency: func() time.Duration {
		if rng.Float64() < 0.01 {
			return 50 * time.Millisecond
		}
		return noise()
	}}
	var baseline []time.Duration
	for range 10000 {
		baseline = append(baseline, noise())
	}
	base := Delay(quantile(baseline, 0.95))
	const calls = 100000
	for range calls {
		healthy.call(base, noise())
		straggler.call(base, noise())
	}
	h999, s999 := quantile(healthy.done, 0.999), quantile(straggler.done, 0.999)
	t.Logf("base %v; healthy: p99.9 %v, hedges %.2f%% (%d won), scale %.2f; straggler: p99.9 %v, hedges %.2f%% (%d won), scale %.2f",
		base, h999, 100*float64(healthy.hedges)/calls, healthy.hedgeWins, healthy.scale.Factor(),
		s999, 100*float64(straggler.hedges)/calls, straggler.hedgeWins, straggler.scale.Factor())
	if s999 > 2*h999 {
		t.Errorf("straggler p99.9 %v, want within 2x the healthy %v", s999, h999)
	}
	if r := float64(healthy.hedges) / calls; r > 0.02 {
		t.Errorf("healthy replica hedged %.2f%% of its calls, want under 2%%", 100*r)
	}
	if r := float64(straggler.hedges+healthy.hedges) / (2 * calls); r > 0.05 {
		t.Errorf("%.2f%% extra calls in all, want at most 5%%", 100*r)
	}
	if healthy.scale.Factor() <= straggler.scale.Factor() {
		t.Errorf("healthy scale %.2f, straggler's %.2f: want the straggler hedged sooner", healthy.scale.Factor(), straggler.scale.Factor())
	}

	// Against the old policy, a fixed p95 delay: the same straggler
	// costs about as much, with hedges of noise on both replicas.
	fixedH := &replicaSim{latency: healthy.latency}
	fixedS := &replicaSim{latency: straggler.latency}
	for range calls {
		for _, r := range []*replicaSim{fixedH, fixedS} {
			r.call(base, noise())
			r.scale = Scale{}
		}
	}
	t.Logf("fixed p95 delay: hedges %.2f%% and %.2f%% of calls", 100*float64(fixedH.hedges)/calls, 100*float64(fixedS.hedges)/calls)
	if fixedH.hedges <= 2*healthy.hedges {
		t.Errorf("fixed delay: %d hedges of the healthy replica, scaled: %d: want the scale to save most", fixedH.hedges, healthy.hedges)
	}
}
