package hedge

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Floor is the shortest hedge delay.
const Floor = 2 * time.Millisecond

const (
	ringSize   = 256 // recent latencies kept per shard
	recompute  = 32  // the p95 is recomputed every this many observations
	minSamples = 32  // fewer samples than this give no p95
)

// Latency keeps a shard's recent call latencies and their 95th
// percentile. Safe for concurrent use; Observe does not block.
type Latency struct {
	ring [ringSize]atomic.Int64 // nanoseconds
	n    atomic.Uint64
	p95  atomic.Int64
	mu   sync.Mutex // held while recomputing; observers never wait on it
}

// Observe records one call's latency.
func (l *Latency) Observe(d time.Duration) {
	i := l.n.Add(1) - 1
	l.ring[i%ringSize].Store(int64(d))
	if (i+1)%recompute == 0 && i+1 >= minSamples && l.mu.TryLock() {
		l.recompute(min(i+1, ringSize))
		l.mu.Unlock()
	}
}

func (l *Latency) recompute(n uint64) {
	var s [ringSize]int64
	for i := range n {
		s[i] = l.ring[i].Load()
	}
	v := s[:n]
	slices.Sort(v)
	l.p95.Store(v[(len(v)*95+99)/100-1])
}

// P95 is the 95th percentile of recent latencies; 0 until enough calls
// have been observed.
func (l *Latency) P95() time.Duration { return time.Duration(l.p95.Load()) }

// Delay is how long to wait for a call before hedging it, given the p95
// latencies of the replicas that could take the hedge: the largest of
// them, and at least Floor. Replicas with no p95 yet count as Floor.
func Delay(p95s ...time.Duration) time.Duration {
	d := Floor
	for _, p := range p95s {
		d = max(d, p)
	}
	return d
}

// Straggling reports whether a request that made first calls, outstanding
// of which are unanswered (hedges and retries included), has stragglers
// worth hedging: at most half its calls (rounded up) are still out. A
// request whose calls are all late at once is slowed by something every
// replica shares — a busy machine, a long garbage collection — and a
// hedge would only add to it; one whose other calls have answered is
// waiting on a slow shard.
func Straggling(outstanding, first int) bool { return 2*outstanding <= first+1 }

// Choice is how a replica is chosen among a partition's.
type Choice int

const (
	// LeastLoaded asks the replica with the fewest calls outstanding,
	// rotating among equals.
	LeastLoaded Choice = iota
	// Rotation asks replicas in turn, blind to load.
	Rotation
)

// String names the choice as its flag does.
func (c Choice) String() string {
	if c == Rotation {
		return "rotation"
	}
	return "least-loaded"
}

// ParseChoice reads a Choice's name.
func ParseChoice(s string) (Choice, bool) {
	switch s {
	case "least-loaded":
		return LeastLoaded, true
	case "rotation":
		return Rotation, true
	}
	return 0, false
}

// Pick returns which of n replicas to ask, or -1 when exclude (bit i:
// replica i) excludes every one; replicas past the 64th are never asked.
// Rotation takes the first not excluded from start mod n; LeastLoaded the
// one whose load is smallest, the first from start among equals.
func Pick(c Choice, n, start int, exclude uint64, load func(i int) int64) int {
	n = min(n, 64)
	best, bestLoad := -1, int64(0)
	for k := range n {
		i := (start + k) % n
		if i < 0 {
			i += n
		}
		if exclude&(1<<i) != 0 {
			continue
		}
		if c == Rotation {
			return i
		}
		if l := load(i); best < 0 || l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best
}
