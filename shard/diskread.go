package shard

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
)

// coldReaders is how many reads one lookup has in flight on a table
// served from disk, and by default (ColdReads) a shard in all. pread is
// a system call, during which the scheduler runs other goroutines, so
// the disk sees this many reads (a page fault on a mapping would block
// its thread unseen by the scheduler: GOMAXPROCS at a time).
const coldReaders = 64

// ColdReads bounds the reads from disk of lookups that share it and
// injects the disk's faults; the zero value does neither.
type ColdReads struct {
	slots chan struct{}
	// delay, when set, is waited before a read of the given fraction
	// (Faults' diskdelay), as a slow disk would make it wait.
	delay    time.Duration
	fraction float64
}

// NewColdReads bounds reads in flight to n.
func NewColdReads(n int) *ColdReads { return &ColdReads{slots: make(chan struct{}, n)} }

// withDelay is r with reads delayed d at the given fraction.
func (r *ColdReads) withDelay(d time.Duration, fraction float64) *ColdReads {
	c := &ColdReads{delay: d, fraction: fraction}
	if r != nil {
		c.slots = r.slots
	}
	return c
}

// acquire takes a read's turn, or returns ctx's error.
func (r *ColdReads) acquire(ctx context.Context) error {
	if r == nil {
		return ctx.Err()
	}
	if r.delay > 0 && (r.fraction >= 1 || rand.Float64() < r.fraction) {
		t := time.NewTimer(r.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if r.slots == nil {
		return ctx.Err()
	}
	select {
	case r.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *ColdReads) release() {
	if r != nil && r.slots != nil {
		<-r.slots
	}
}

// readBufs is the cold readers' scratch for the bytes they read. Each
// would otherwise allocate its own for every lookup: about a megabyte of
// garbage a rank200 request, and the collector running all the time.
var readBufs = sync.Pool{New: func() any { return new([]byte) }}

// readCold is Find for a table served from disk, with the values: the
// value bytes of keys[q] go to vals[q×vlen:] and out[q] is q, or −1 when
// the table lacks it. Keys the value cache holds are copied from it; the
// others' buckets (and, keys apart from values, their values) are read
// with pread, up to coldReaders at once, each read taking its turn from
// r. The mapping is never read, so a lookup never waits on a page fault.
// It returns ctx's error, having stopped reading, once ctx ends.
// miss is scratch; it is returned for reuse.
func (t *Table) readCold(ctx context.Context, keys []uint64, out []int32, vals []byte, miss []int32, r *ColdReads) ([]int32, error) {
	c := t.useCache()
	if c != nil {
		c.getAll(keys, out, vals)
		c.done() // not held across the reads: a dropped cache goes at once
	} else {
		for q := range out[:len(keys)] {
			out[q] = -1
		}
	}
	miss = miss[:0]
	for q := range keys {
		if out[q] < 0 {
			miss = append(miss, int32(q))
		}
	}
	if len(miss) == 0 {
		return miss, nil
	}
	var next atomic.Int64
	var failed atomic.Pointer[error]
	// fail keeps the first error. (A worker's own err never has its
	// address taken: it would move to the heap, two allocations a key.)
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	work := func() {
		bp := readBufs.Get().(*[]byte)
		defer func() {
			if cap(*bp) <= 64<<10 {
				readBufs.Put(bp)
			}
		}()
		for {
			m := int(next.Add(1) - 1)
			if m >= len(miss) || failed.Load() != nil {
				return
			}
			if err := r.acquire(ctx); err != nil {
				fail(err)
				return
			}
			q := miss[m]
			var err error
			out[q], *bp, err = t.readOne(keys[q], vals[int(q)*t.vlen:int(q+1)*t.vlen], *bp)
			r.release()
			if err != nil {
				fail(err)
				return
			}
			if out[q] >= 0 {
				out[q] = q
			}
		}
	}
	if n := min(coldReaders, len(miss)); n == 1 {
		work()
	} else {
		var wg sync.WaitGroup
		for range n {
			wg.Go(work)
		}
		wg.Wait()
	}
	if err := failed.Load(); err != nil {
		if ctx.Err() != nil {
			return miss, ctx.Err()
		}
		return miss, *err
	}
	return miss, nil
}

// readOne reads key's bucket from the file and, if the table holds key,
// its value bytes into val; it returns the record's index or −1. buf is
// scratch, returned for reuse.
func (t *Table) readOne(key uint64, val, buf []byte) (int32, []byte, error) {
	h := codec.KeyHash(key)
	b, frac := bits.Mul64(h, t.nb)
	probe := t.probe(h, frac)
	lo, hi := int(t.dirAt(b)), int(t.dirAt(b+1))
	n := (hi - lo) * t.rs
	if n <= 0 {
		return -1, buf, nil
	}
	bucket, buf, err := t.readAt(t.recOff+int64(lo*t.rs), n, buf)
	if err != nil {
		return -1, buf, err
	}
	for i := 0; i < hi-lo; i++ {
		if binary.LittleEndian.Uint64(bucket[i*t.rs+t.ko:])&t.kmask != probe {
			continue
		}
		r := lo + i
		if !t.split { // the record came whole with its bucket
			copy(val, bucket[i*t.rs+t.vo:i*t.rs+t.vo+t.vlen])
			return int32(r), buf, nil
		}
		v, buf, err := t.readAt(t.valOff+int64(r)*int64(t.vs), t.vlen, buf)
		if err != nil {
			return -1, buf, err
		}
		copy(val, v)
		return int32(r), buf, nil
	}
	return -1, buf, nil
}

// readAt returns n bytes of t's file from off, read into buf (scratch,
// returned for reuse). Reads go through the page cache: direct I/O
// (O_DIRECT) was measured and gained nothing here (see docs/storage.md).
func (t *Table) readAt(off int64, n int, buf []byte) ([]byte, []byte, error) {
	if cap(buf) < n {
		buf = make([]byte, max(n, 64*16))
	}
	if _, err := t.file.ReadAt(buf[:n], off); err != nil {
		return nil, buf, fmt.Errorf("reading partition file %s: %w", t.file.Name(), err)
	}
	return buf[:n], buf, nil
}
