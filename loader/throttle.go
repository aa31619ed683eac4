package loader

import (
	"context"
	"io"
	"math"
	"sync/atomic"

	"golang.org/x/time/rate"
)

// A Throttle bounds how fast a process reads partition files from the
// repository (Repo.Throttle), so that loading — a rebalance's moves, a
// rollout's new version — leaves CPU and disk to the serving it runs
// beside: reading, hashing and checking a partition cost about a
// nanosecond a byte, all of it on the cores that answer lookups.
// Reads wait their turn in slices of throttleChunk once the process
// serves (SetServing): one that serves nothing yet loads at full speed.
// A nil Throttle does not wait.
type Throttle struct {
	ctx     context.Context
	lim     *rate.Limiter
	serving atomic.Bool
}

// throttleChunk is the slice a throttled read is made in: small enough
// that a load's work is spread out, large enough to cost nothing.
const throttleChunk = 1 << 20

// NewThrottle bounds reads to bytesPerSecond (at least throttleChunk).
// A wait ends early, with ctx's error, once ctx is done (a shard closing
// does not wait out its loads).
func NewThrottle(ctx context.Context, bytesPerSecond int64) *Throttle {
	bytesPerSecond = max(bytesPerSecond, throttleChunk)
	return &Throttle{ctx: ctx, lim: rate.NewLimiter(rate.Limit(bytesPerSecond), throttleChunk)}
}

// SetServing says whether the process serves: reads wait their turn
// only while it does.
func (t *Throttle) SetServing(on bool) {
	if t != nil {
		t.serving.Store(on)
	}
}

// Tokens is the bytes that may be read now without waiting.
func (t *Throttle) Tokens() float64 {
	if t == nil {
		return math.Inf(1)
	}
	return t.lim.Tokens()
}

// wait takes n bytes' worth of turns.
func (t *Throttle) wait(n int) error {
	if t == nil || !t.serving.Load() {
		return nil
	}
	for n > 0 {
		k := min(n, throttleChunk)
		if err := t.lim.WaitN(t.ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// reader reads r in slices of at most throttleChunk, each after its turn.
func (t *Throttle) reader(r io.Reader) io.Reader {
	if t == nil {
		return r
	}
	return throttledReader{r, t}
}

type throttledReader struct {
	r io.Reader
	t *Throttle
}

func (tr throttledReader) Read(p []byte) (int, error) {
	p = p[:min(len(p), throttleChunk)]
	if err := tr.t.wait(len(p)); err != nil {
		return 0, err
	}
	return tr.r.Read(p)
}
