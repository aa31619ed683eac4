package admit

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// Defaults fills a server's zero admission bounds: perCPU requests per
// CPU in flight, 256 MiB of them, 5ms in the queue; negative ones are an
// error. The router's front and the shards share these.
func Defaults(inflight *int, inflightBytes *int64, queue *time.Duration, perCPU int) error {
	if *inflight == 0 {
		*inflight = perCPU * runtime.GOMAXPROCS(0)
	}
	if *inflightBytes == 0 {
		*inflightBytes = 256 << 20
	}
	if *queue == 0 {
		*queue = 5 * time.Millisecond
	}
	if *inflight < 0 || *inflightBytes < 0 || *queue < 0 {
		return errors.New("admit: admission bounds must not be negative")
	}
	return nil
}

// ErrOverloaded is returned when a gate refuses a request.
var ErrOverloaded = errors.New("admit: overloaded")

// Gate admits weighted work up to a capacity. Safe for concurrent use.
type Gate struct {
	sem     *semaphore.Weighted
	size    int64
	queue   time.Duration
	waiting atomic.Int64
	held    atomic.Int64 // weight admitted now
	// hold is a moving average of how long admitted work held the gate,
	// in nanoseconds per unit of weight; 0 until the first release.
	hold atomic.Int64
}

// NewGate admits up to size units of weight at once; a request that
// cannot be admitted at once waits at most queue. size must be positive.
func NewGate(size int64, queue time.Duration) *Gate {
	return &Gate{sem: semaphore.NewWeighted(size), size: size, queue: queue}
}

// Ticket is admitted weight; Release gives it back.
type Ticket struct {
	g      *Gate
	weight int64
	start  time.Time
}

// Acquire admits weight (clamped to 1..size: a request heavier than the
// whole capacity runs alone). It returns ErrOverloaded when the gate is
// full and the queue is too long or the queue time passes, or ctx's error
// when ctx ends first.
func (g *Gate) Acquire(ctx context.Context, weight int64) (Ticket, error) {
	weight = min(max(weight, 1), g.size)
	if g.sem.TryAcquire(weight) {
		g.held.Add(weight)
		return Ticket{g, weight, time.Now()}, nil
	}
	// Join the queue and check its length in one step, so that a burst
	// cannot all pass the check before any joins.
	defer g.waiting.Add(-1)
	if g.queue <= 0 || g.waiting.Add(1) > g.maxWaiting(weight) {
		return Ticket{}, ErrOverloaded
	}
	qctx, cancel := context.WithTimeout(ctx, g.queue)
	defer cancel()
	if err := g.sem.Acquire(qctx, weight); err != nil {
		if ctx.Err() != nil {
			return Ticket{}, ctx.Err()
		}
		return Ticket{}, ErrOverloaded
	}
	g.held.Add(weight)
	return Ticket{g, weight, time.Now()}, nil
}

// Refusing reports whether Acquire of weight would be refused at once
// now, with ahead more requests about to join the queue (a front counts
// those whose bytes are still arriving): the gate is full and its queue
// as long as it may be. A front asks before it reads a request, so that
// under overload a refusal costs nothing; the answer may be stale a
// moment later, and Acquire decides.
func (g *Gate) Refusing(weight, ahead int64) bool {
	weight = min(max(weight, 1), g.size)
	if g.held.Load()+weight <= g.size {
		return false
	}
	return g.queue <= 0 || g.waiting.Load()+ahead+1 > g.maxWaiting(weight)
}

// maxWaiting is how many requests of this weight the gate can serve
// within its queue time: its capacity in weight times the queue time,
// over the time a unit of weight is held. Before anything has been
// released, the capacity itself.
func (g *Gate) maxWaiting(weight int64) int64 {
	h := g.hold.Load()
	if h <= 0 {
		return g.size / weight
	}
	return max(1, int64(float64(g.size)*float64(g.queue)/float64(h))/weight)
}

// Release returns the ticket's weight. A zero Ticket releases nothing.
func (t Ticket) Release() {
	if t.g == nil {
		return
	}
	per := int64(time.Since(t.start)) / t.weight
	// An exponential moving average over about 16 releases; concurrent
	// updates may lose one another's contribution, which only slows it.
	old := t.g.hold.Load()
	if old == 0 {
		t.g.hold.Store(max(per, 1))
	} else {
		t.g.hold.Store(max(old+(per-old)/16, 1))
	}
	t.g.held.Add(-t.weight)
	t.g.sem.Release(t.weight)
}

// Waiting is the number of requests queued now.
func (g *Gate) Waiting() int64 { return g.waiting.Load() }
