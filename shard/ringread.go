package shard

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Reads from disk through io_uring. A lookup's reads are prepared and
// submitted together and their completions reaped together, from the
// lookup's own goroutine: one system call a round instead of one a
// read, and no goroutine (and thread) a read in flight. Measured on
// this project's VM (BenchmarkDiskReads, docs/storage.md): 3–4× the
// reads a second of 64 goroutines in pread. Where the kernel
// refuses io_uring (before Linux 5.11, a seccomp profile that blocks it,
// kernel.io_uring_disabled) reads are preads, as with --disk-reads
// pread.

// ringWait is the longest a lookup waits in the kernel for a read
// before it looks at its context again (a caller that gave up, with no
// deadline to wait until).
const ringWait = 20 * time.Millisecond

// maxIdleRings is how many rings the process keeps for the next
// lookups; one made beyond them (more lookups reading at once) is
// closed once used.
const maxIdleRings = 32

// spanBufs holds buffers of spanMax bytes for reads of more than a page
// (warming's spans), which a ring gives back when it is put back rather
// than keep one an entry.
var spanBufs = sync.Pool{New: func() any {
	b := make([]byte, spanMax)
	return &b
}}

// ringPool lends rings, one to a lookup at a time; the process has one
// (rings).
type ringPool struct {
	mu     sync.Mutex
	idle   []*ring
	broken []*ring // kept, never closed or freed: the kernel may still write into their buffers
	// failed is why io_uring_enter failed, after which the process
	// reads with pread (ColdReads.rings).
	failed atomic.Pointer[error]
}

// rings is the process's ring pool, or why it has none: the first ring
// is made at the first call, and one the kernel refuses means preads
// for the process's life.
var rings = sync.OnceValues(func() (*ringPool, error) {
	rg, err := newRing(coldReaders)
	if err != nil {
		return nil, err
	}
	return &ringPool{idle: []*ring{rg}}, nil
})

// DiskReadsMode is how this process reads from disk by default: "io_uring",
// or "pread" with the reason the kernel refused io_uring.
func DiskReadsMode() string {
	p, err := rings()
	if err != nil {
		return "pread (" + err.Error() + ")"
	}
	if err := p.failed.Load(); err != nil {
		return "pread (" + (*err).Error() + ")"
	}
	return "io_uring"
}

func (p *ringPool) get() (*ring, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		rg := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return rg, nil
	}
	p.mu.Unlock()
	return newRing(coldReaders)
}

// put takes back a ring with no read in flight.
func (p *ringPool) put(rg *ring) {
	for e, bp := range rg.spans {
		if bp != nil {
			spanBufs.Put(bp)
			rg.spans[e], rg.bufs[e] = nil, nil
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) < maxIdleRings {
		p.idle = append(p.idle, rg)
		return
	}
	rg.close()
}

// retire takes back a ring its user left with reads in flight: once
// they are done (their turns from r given back) it is lent again.
func (p *ringPool) retire(rg *ring, r *ColdReads) {
	for rg.inflight > 0 {
		if err := rg.enter(ringWait); err != nil {
			p.lose(rg, r, err)
			return
		}
		rg.reap(func(int, int32) { r.release() })
	}
	p.put(rg)
}

// lose keeps a ring that failed, with reads in flight that cannot be
// waited for: closing it, or letting its buffers be collected, could
// have the kernel write into memory no longer its. Their turns are
// given back (the bound is exceeded for a while rather than lookups
// starved), and the process reads with pread from now on.
func (p *ringPool) lose(rg *ring, r *ColdReads, err error) {
	for range rg.inflight {
		r.release()
	}
	p.mu.Lock()
	p.broken = append(p.broken, rg)
	p.mu.Unlock()
	if p.failed.CompareAndSwap(nil, &err) {
		slog.Warn("shard: reading from disk with pread from now on: io_uring failed", "err", err)
	}
}

// readAll is readAll through one of p's rings: up to r.width() reads
// in flight, each prepared as its item's step asks and submitted with
// the others; a step's next read goes ahead of new items. A read takes
// its turn from r without waiting while others are in flight (it waits
// for one of those to complete instead): a lookup waiting for a turn
// holds none, so lookups sharing r never wait on each other's turns.
// Once ctx ends it stops, returns, and leaves the reads in flight to
// the pool (retire); their buffers are the ring's, not the caller's.
func (p *ringPool) readAll(ctx context.Context, r *ColdReads, file func(i int) *os.File, n int, step step) error {
	rg, err := p.get()
	if err != nil {
		return preadAll(ctx, r, func(i int) (io.ReaderAt, string) {
			f := file(i)
			return f, f.Name()
		}, n, step)
	}
	type read struct {
		i   int
		off int64
		n   int
	}
	reading := make([]read, rg.entries) // by entry
	var later []read                    // steps' next reads, not yet submitted
	depth, item := min(r.width(), rg.entries), 0
	var failed error
	for failed == nil {
		for failed == nil && rg.inflight < depth && ctx.Err() == nil {
			var rd read
			switch {
			case len(later) > 0:
				rd, later = later[len(later)-1], later[:len(later)-1]
			case item < n:
				off, m, err := step(item, nil)
				item++
				if failed = err; err != nil || m <= 0 {
					continue
				}
				rd = read{item - 1, off, m}
			}
			if rd.n == 0 {
				break // nothing more to read
			}
			if !r.tryAcquire() {
				if rg.inflight > 0 {
					later = append(later, rd)
					break
				}
				if failed = r.acquire(ctx); failed != nil {
					break
				}
			}
			reading[rg.prep(int(file(rd.i).Fd()), rd.off, rd.n)] = rd
		}
		if rg.inflight == 0 {
			break
		}
		wait := ringWait
		if d, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(d))
		}
		if wait <= 0 {
			failed = context.DeadlineExceeded
			break
		}
		if err := rg.enter(wait); err != nil {
			for range rg.unprep() {
				r.release()
			}
			p.lose(rg, r, err)
			return fmt.Errorf("reading from disk: %w", err)
		}
		rg.reap(func(e int, res int32) {
			r.release()
			rd := reading[e]
			f := file(rd.i)
			switch {
			case failed != nil:
			case res < 0:
				failed = fmt.Errorf("reading partition file %s: %w", f.Name(), syscall.Errno(-res))
			default:
				if int(res) < rd.n {
					// Short (a network file system, or the file cut
					// short): the rest read as pread would, io.EOF if
					// the file ends first.
					if _, err := f.ReadAt(rg.bufs[e][res:rd.n], rd.off+int64(res)); err != nil {
						failed = fmt.Errorf("reading partition file %s: %w", f.Name(), err)
						return
					}
				}
				if off, m, err := step(rd.i, rg.bufs[e][:rd.n]); err != nil {
					failed = err
				} else if m > 0 {
					later = append(later, read{rd.i, off, m})
				}
			}
		})
		if failed == nil {
			failed = ctx.Err()
		}
	}
	if failed == nil && (item < n || len(later) > 0) {
		failed = ctx.Err() // ended before it read them all
	}
	for range rg.unprep() { // (prepared, never submitted: the caller still holds the files)
		r.release()
	}
	if rg.inflight > 0 {
		go p.retire(rg, r)
	} else {
		p.put(rg)
	}
	if failed != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return failed
}
