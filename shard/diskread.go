package shard

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
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

// width is how many reads one batch has in flight through r: coldReaders,
// or fewer if r bounds them to fewer.
func (r *ColdReads) width() int {
	if r == nil || r.slots == nil {
		return coldReaders
	}
	return min(coldReaders, cap(r.slots))
}

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

// readBufs is the cold readers' scratch for the bytes they read, pooled
// so that a lookup's readers do not each allocate their own.
var readBufs = sync.Pool{New: func() any { return new([]byte) }}

// putReadBuf gives a reader's buffer back, unless one read made it large.
func putReadBuf(bp *[]byte) {
	if cap(*bp) <= spanMax {
		readBufs.Put(bp)
	}
}

// readCold is Find for a table served from disk, with the values: the
// value bytes of keys[q] go to vals[q×vlen:] and out[q] is q, or −1 when
// the table lacks it. Keys the value cache holds are copied from it; the
// others' buckets (and, keys apart from values, their values) are read
// with pread, up to coldReaders at once, each read taking its turn from
// r. The mapping is never read, so a lookup never waits on a page fault.
// What it read goes to the cache's empty slots (offer).
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
	err := readAll(ctx, r, len(miss), func(m int, buf []byte) ([]byte, error) {
		q := miss[m]
		o, buf, err := t.readOne(keys[q], vals[int(q)*t.vlen:int(q+1)*t.vlen], buf)
		if o >= 0 {
			o = q
		}
		out[q] = o
		return buf, err
	})
	if c := t.useCache(); c != nil {
		for _, q := range miss {
			if out[q] >= 0 {
				c.offer(codec.KeyHash(keys[q]), vals[int(q)*t.vlen:int(q+1)*t.vlen])
			}
		}
		c.done()
	}
	return miss, err
}

// readAll calls read(i, buf) for every i below n, up to coldReaders at
// once, each in a turn from r; buf is a reader's pooled scratch, which
// read returns (grown, if it needed more). It stops at the first error,
// or once ctx ends, and returns it (ctx's, if ctx ended).
func readAll(ctx context.Context, r *ColdReads, n int, read func(i int, buf []byte) ([]byte, error)) error {
	var next atomic.Int64
	var failed atomic.Pointer[error]
	// fail keeps the first error. (A reader's own err never has its
	// address taken: it would move to the heap, two allocations a key.)
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	work := func() {
		bp := readBufs.Get().(*[]byte)
		defer putReadBuf(bp)
		for {
			i := int(next.Add(1) - 1)
			if i >= n || failed.Load() != nil {
				return
			}
			if err := r.acquire(ctx); err != nil {
				fail(err)
				return
			}
			var err error
			*bp, err = read(i, *bp)
			r.release()
			if err != nil {
				fail(err)
				return
			}
		}
	}
	if w := min(r.width(), n); w == 1 {
		work()
	} else {
		var wg sync.WaitGroup
		for range w {
			wg.Go(work)
		}
		wg.Wait()
	}
	if err := failed.Load(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return *err
	}
	return nil
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
	i := t.match(bucket, probe)
	switch {
	case i < 0:
		return -1, buf, nil
	case !t.split: // the record came whole with its bucket
		copy(val, bucket[i*t.rs+t.vo:i*t.rs+t.vo+t.vlen])
		return int32(lo + i), buf, nil
	}
	v, buf, err := t.readAt(t.valOff+int64(lo+i)*int64(t.vs), t.vlen, buf)
	if err != nil {
		return -1, buf, err
	}
	copy(val, v)
	return int32(lo + i), buf, nil
}

// match is the index in bucket, t's records, of the one whose key is
// probe's, or −1.
func (t *Table) match(bucket []byte, probe uint64) int {
	for i := range len(bucket) / t.rs {
		if binary.LittleEndian.Uint64(bucket[i*t.rs+t.ko:])&t.kmask == probe {
			return i
		}
	}
	return -1
}

// spanGap is the most readSpans reads between two keys' buckets to read
// both at once (a page), and spanMax the most it reads at once.
const (
	spanGap = 4 << 10
	spanMax = 64 << 10
)

// readSpans is readCold for many keys, not through the cache (but for
// keys apart from values): keys[q]'s
// value bytes go to vals[q×vlen:] and out[q] is q, or −1. Where records
// hold their values, the buckets of keys near each other in the file
// (at most spanGap apart) are read at once, up to spanMax a read, so
// reading the thousands of hot keys that warm a partition's cache costs
// a read per span of the file, not one per key. Keys apart from values
// are read one by one (readCold, which asks the cache first and offers
// it what it read). Reads take turns from r; it stops, with
// ctx's error, once ctx ends.
func (t *Table) readSpans(ctx context.Context, keys []uint64, out []int32, vals []byte, r *ColdReads) error {
	if t.split {
		for q := range keys {
			out[q] = -1
		}
		_, err := t.readCold(ctx, keys, out, vals, nil, r)
		return err
	}
	type loc struct {
		q      int
		lo, hi int // the bucket's records
		probe  uint64
	}
	locs := make([]loc, len(keys))
	for q, k := range keys {
		h := codec.KeyHash(k)
		b, frac := bits.Mul64(h, t.nb)
		locs[q] = loc{q, int(t.dirAt(b)), int(t.dirAt(b + 1)), t.probe(h, frac)}
		out[q] = -1
	}
	slices.SortFunc(locs, func(a, b loc) int { return cmp.Compare(a.lo, b.lo) })
	var spans [][2]int // [i, j) of locs
	for i := 0; i < len(locs); {
		j := i + 1
		for j < len(locs) && (locs[j].lo-locs[j-1].hi)*t.rs <= spanGap && (locs[j].hi-locs[i].lo)*t.rs <= spanMax {
			j++
		}
		spans = append(spans, [2]int{i, j})
		i = j
	}
	return readAll(ctx, r, len(spans), func(i int, buf []byte) ([]byte, error) {
		ls := locs[spans[i][0]:spans[i][1]]
		lo, hi := ls[0].lo, ls[len(ls)-1].hi
		if hi <= lo {
			return buf, nil // empty buckets: absent
		}
		span, buf, err := t.readAt(t.recOff+int64(lo*t.rs), (hi-lo)*t.rs, buf)
		if err != nil {
			return buf, err
		}
		for _, l := range ls {
			if k := t.match(span[(l.lo-lo)*t.rs:(l.hi-lo)*t.rs], l.probe); k >= 0 {
				rec := span[(l.lo-lo+k)*t.rs:]
				copy(vals[l.q*t.vlen:(l.q+1)*t.vlen], rec[t.vo:t.vo+t.vlen])
				out[l.q] = int32(l.q)
			}
		}
		return buf, nil
	})
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
