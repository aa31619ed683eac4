package hedge

import (
	"math"
	"sync/atomic"
	"time"
)

// The bounds and steps of a Scale. A hedge that loses (the call it
// hedged answered first) makes the replica's next hedges later by
// scaleUp; one that wins makes them sooner by scaleDown. They balance
// where about 30% of a replica's hedges win: ln(1.1) / (ln(1.1) +
// ln(1.25)). From MaxScale, ten wins in a row bring it back to 1.
const (
	MaxScale  = 8.0
	scaleUp   = 1.1
	scaleDown = 1.25
)

// Scale tells a straggler from noise, per replica: how many times the
// base delay (Delay) to wait before hedging a call to it. A healthy
// replica's calls past the p95 are mostly about to answer, and its hedges
// lose: its scale climbs, and it is hedged only past its real tail
// (bounded by MaxScale times the base). A replica with stragglers — a
// fraction of calls far slower than the rest — has hedges that win: its
// scale falls back toward 1, and its slow calls are hedged at once. The
// scale settles where about 30% of the replica's hedges win: past the
// delay, its noise and its stragglers are then of about one size, so
// every straggler is hedged for roughly two noise calls.
//
// The zero value is 1. Safe for concurrent use; it changes only on
// outcomes, never with time.
type Scale struct {
	bits atomic.Uint64 // float64; 0 reads as 1
}

// Factor is the current scale, in [1, MaxScale].
func (s *Scale) Factor() float64 { return factorOf(s.bits.Load()) }

// Of is base scaled.
func (s *Scale) Of(base time.Duration) time.Duration {
	return time.Duration(float64(base) * s.Factor())
}

// Won records a hedge of this replica's call that answered first.
func (s *Scale) Won() { s.times(1 / scaleDown) }

// Lost records a hedge of this replica's call that the call beat.
func (s *Scale) Lost() { s.times(scaleUp) }

func (s *Scale) times(f float64) {
	for {
		old := s.bits.Load()
		v := min(MaxScale, max(1, factorOf(old)*f))
		if s.bits.CompareAndSwap(old, math.Float64bits(v)) {
			return
		}
	}
}

func factorOf(b uint64) float64 {
	if b == 0 {
		return 1
	}
	return math.Float64frombits(b)
}
