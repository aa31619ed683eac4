package shard

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
)

// coldReaders is how many reads one lookup has in flight on a table
// served from disk, and by default (ColdReads) a shard in all: the
// depth of a lookup's io_uring, or as many goroutines in pread, during
// which the scheduler runs other goroutines. Either way the disk sees
// this many reads (a page fault on a mapping would block its thread
// unseen by the scheduler: GOMAXPROCS at a time).
const coldReaders = 64

// ColdReads bounds the reads from disk of lookups that share it, says
// how they are made, and injects the disk's faults; the zero value
// bounds none and reads as the process does by default (io_uring where
// the kernel allows).
type ColdReads struct {
	slots chan struct{}
	pread bool // preads, not io_uring
	// delay, when set, is waited before a read of the given fraction
	// (Faults' diskdelay), as a slow disk would make it wait, and
	// counted by delayed.
	delay    time.Duration
	fraction float64
	delayed  func()
}

// NewColdReads bounds reads in flight to n.
func NewColdReads(n int) *ColdReads { return &ColdReads{slots: make(chan struct{}, n)} }

// Pread is r with its reads made with pread, a goroutine each, not
// through io_uring (--disk-reads pread).
func (r *ColdReads) Pread() *ColdReads {
	c := &ColdReads{pread: true}
	if r != nil {
		c.slots, c.delay, c.fraction, c.delayed = r.slots, r.delay, r.fraction, r.delayed
	}
	return c
}

// rings is the ring pool r's reads go through, or nil for preads: asked
// for, io_uring refused, or a delay injected (it is waited in pread's
// goroutines, a read's wait beside the others', as a slow disk's).
func (r *ColdReads) rings() *ringPool {
	if r != nil && (r.pread || r.delay > 0) {
		return nil
	}
	if p, _ := rings(); p != nil && p.failed.Load() == nil {
		return p
	}
	return nil
}

// width is how many reads one batch has in flight through r: coldReaders,
// or fewer if r bounds them to fewer.
func (r *ColdReads) width() int {
	if r == nil || r.slots == nil {
		return coldReaders
	}
	return min(coldReaders, cap(r.slots))
}

// withDelay is r with reads delayed d at the given fraction, each
// delay counted by delayed.
func (r *ColdReads) withDelay(d time.Duration, fraction float64, delayed func()) *ColdReads {
	c := &ColdReads{delay: d, fraction: fraction, delayed: delayed}
	if r != nil {
		c.slots, c.pread = r.slots, r.pread
	}
	return c
}

// tryAcquire takes a read's turn if one is free now (no delay: ring
// reads have none).
func (r *ColdReads) tryAcquire() bool {
	if r == nil || r.slots == nil {
		return true
	}
	select {
	case r.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// acquire takes a read's turn, or returns ctx's error.
func (r *ColdReads) acquire(ctx context.Context) error {
	if r == nil {
		return ctx.Err()
	}
	if r.delay > 0 && (r.fraction >= 1 || rand.Float64() < r.fraction) {
		r.delayed()
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
// from the file, up to coldReaders at once (readAll), each read taking
// its turn from r. The mapping is never read, so a lookup never waits on
// a page fault. What it read goes to the cache's empty slots (offer).
// It returns ctx's error, having stopped reading, once ctx ends.
// miss is scratch; it is returned for reuse.
func (t *Table) readCold(ctx context.Context, keys []uint64, out []int32, vals []byte, miss []int32, r *ColdReads) ([]int32, error) {
	t.fromCache(keys, out, vals)
	miss = miss[:0]
	for q := range keys {
		if out[q] < 0 {
			miss = append(miss, int32(q))
		}
	}
	if len(miss) == 0 {
		return miss, nil
	}
	err := readAll(ctx, r, t.file, len(miss), func(m int, data []byte) (int64, int, error) {
		q := miss[m]
		return t.readStep(keys[q], q, &out[q], vals[int(q)*t.vlen:int(q+1)*t.vlen], data)
	})
	for _, q := range miss {
		out[q] = max(out[q], -1) // a value still to read, when reading stopped
	}
	t.offer(keys, out, vals, miss)
	return miss, err
}

// fromCache copies the values of keys t's value cache holds (getAll:
// out[q] is q, or −1 if it lacks key q, or there is no cache). The
// cache is not held after: a dropped one goes at once, not after reads.
func (t *Table) fromCache(keys []uint64, out []int32, vals []byte) {
	if c := t.useCache(); c != nil {
		c.getAll(keys, out, vals)
		c.done()
		return
	}
	for q := range out[:len(keys)] {
		out[q] = -1
	}
}

// offer puts the keys of miss that were found (read from disk) into
// t's cache's empty slots.
func (t *Table) offer(keys []uint64, out []int32, vals []byte, miss []int32) {
	if c := t.useCache(); c != nil {
		for _, q := range miss {
			if out[q] >= 0 {
				c.offer(codec.KeyHash(keys[q]), vals[int(q)*t.vlen:int(q+1)*t.vlen])
			}
		}
		c.done()
	}
}

// A readAhead is what readCold does, for all the partitions served from
// disk that a lookup asks a shard for at once (scratch.readAhead): each
// one's keys are looked up in its cache, and the misses of all of them
// read in one readFiles, their reads in flight together, instead of a
// readAll a partition, each waiting for the one before. lookupStack then
// takes each partition's values from it.
type readAhead struct {
	// Section s of the request has its keys that reach its base from
	// keys[secAt[s]] on, secN[s] of them (secAt[s] < 0: none read ahead);
	// key g's value bytes at vals[g×vlen:] (the bases of a version have
	// values of one size), out[g] its index in its section's keys, or −1
	// if the base lacks it.
	secAt, secN []int32
	keys        []uint64
	out         []int32
	vals        []byte
	reads       []aheadRead // the keys the caches lacked
}

type aheadRead struct {
	t    *Table
	g, q int32 // its index in keys, and in its section's
}

// add looks up keys, those of section s that reach base t, in t's cache.
func (a *readAhead) add(s int, t *Table, keys []uint64) {
	start := len(a.keys)
	a.secAt[s], a.secN[s] = int32(start), int32(len(keys))
	a.keys = append(a.keys, keys...)
	a.out = slices.Grow(a.out[:start], len(keys))[:len(a.keys)]
	a.vals = slices.Grow(a.vals[:start*t.vlen], len(keys)*t.vlen)[:len(a.keys)*t.vlen]
	out, vals := a.out[start:], a.vals[start*t.vlen:]
	t.fromCache(keys, out, vals)
	for q := range out {
		if out[q] < 0 {
			a.reads = append(a.reads, aheadRead{t, int32(start + q), int32(q)})
		}
	}
}

// read reads the keys the caches lacked, up to r's width at once, each
// in a turn from r, and offers those found to their caches.
func (a *readAhead) read(ctx context.Context, r *ColdReads) error {
	if len(a.reads) == 0 {
		return nil
	}
	err := readFiles(ctx, r, len(a.reads), func(m int) *os.File { return a.reads[m].t.file }, func(m int, data []byte) (int64, int, error) {
		rd := &a.reads[m]
		vl := rd.t.vlen
		return rd.t.readStep(a.keys[rd.g], rd.q, &a.out[rd.g], a.vals[int(rd.g)*vl:int(rd.g+1)*vl], data)
	})
	var c *valueCache
	var ct *Table
	for _, rd := range a.reads {
		g := rd.g
		if a.out[g] = max(a.out[g], -1); a.out[g] < 0 {
			continue
		}
		if rd.t != ct { // a section's reads are together
			if c != nil {
				c.done()
			}
			ct, c = rd.t, rd.t.useCache()
		}
		if c != nil {
			c.offer(codec.KeyHash(a.keys[g]), a.vals[int(g)*rd.t.vlen:int(g+1)*rd.t.vlen])
		}
	}
	if c != nil {
		c.done()
	}
	return err
}

// section is what a holds for section s: its keys' out and values, or
// ok false if it read none ahead.
func (a *readAhead) section(s int, vlen int) (out []int32, vals []byte, ok bool) {
	if s < 0 || s >= len(a.secAt) || a.secAt[s] < 0 {
		return nil, nil, false
	}
	at, n := int(a.secAt[s]), int(a.secN[s])
	return a.out[at : at+n], a.vals[at*vlen : (at+n)*vlen], true
}

// reset empties a for the next lookup, keeping no table reachable.
func (a *readAhead) reset() {
	clear(a.reads)
	a.secAt, a.secN = a.secAt[:0], a.secN[:0]
	a.keys, a.reads = a.keys[:0], a.reads[:0]
}

// valuePending marks, in a key's out, that its record was found in its
// bucket and its value (kept apart from the key) is still to read.
const valuePending = -2

// readStep is one step of reading key (the q-th of its lookup) from the
// file (a readAll step): first its bucket's records, then, keys apart
// from values, the value. *out is −1 until the key is found, then
// valuePending while its value is read, then q.
func (t *Table) readStep(key uint64, q int32, out *int32, val, data []byte) (int64, int, error) {
	h := codec.KeyHash(key)
	b, frac := bits.Mul64(h, t.nb)
	lo, hi := int(t.dirAt(b)), int(t.dirAt(b+1))
	switch {
	case data == nil: // the bucket, if it has records
		return t.recOff + int64(lo*t.rs), (hi - lo) * t.rs, nil
	case *out == valuePending:
		copy(val, data)
		*out = q
		return 0, 0, nil
	}
	i := t.match(data, t.probe(h, frac))
	switch {
	case i < 0:
		return 0, 0, nil
	case !t.split: // the record came whole with its bucket
		copy(val, data[i*t.rs+t.vo:i*t.rs+t.vo+t.vlen])
		*out = q
		return 0, 0, nil
	}
	*out = valuePending
	return t.valOff + int64(lo+i)*int64(t.vs), t.vlen, nil
}

// A step drives the reads of item i of a readAll: called first with
// nil, then with the bytes of each read it asked for, it returns the
// next read (n bytes at off), or n ≤ 0 once item i is done.
type step func(i int, data []byte) (off int64, n int, err error)

// readAll runs step for every i below n, reading from f what each asks
// for, up to r.width() reads at once, each in a turn from r: through an
// io_uring where the kernel allows (ringPool.readAll), with preads
// otherwise (preadAll). It stops at the first error, or once ctx ends,
// and returns it (ctx's, if ctx ended); step is never called once it
// has returned.
func readAll(ctx context.Context, r *ColdReads, f *os.File, n int, step step) error {
	return readFiles(ctx, r, n, func(int) *os.File { return f }, step)
}

// readFiles is readAll for items of several files: item i's reads are
// from file(i).
func readFiles(ctx context.Context, r *ColdReads, n int, file func(i int) *os.File, step step) error {
	if p := r.rings(); p != nil {
		return p.readAll(ctx, r, file, n, step)
	}
	return preadAll(ctx, r, func(i int) (io.ReaderAt, string) {
		f := file(i)
		return f, f.Name()
	}, n, step)
}

// preadAll is readAll with a goroutine a read in flight, each in pread;
// item i's reads are from file(i), named so in errors.
func preadAll(ctx context.Context, r *ColdReads, file func(i int) (io.ReaderAt, string), n int, step step) error {
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
			off, m, err := step(i, nil)
			f, name := file(i)
			for err == nil && m > 0 {
				if err = r.acquire(ctx); err != nil {
					break
				}
				if cap(*bp) < m {
					*bp = make([]byte, max(m, 1024))
				}
				_, err = f.ReadAt((*bp)[:m], off)
				r.release()
				if err != nil {
					err = fmt.Errorf("reading partition file %s: %w", name, err)
					break
				}
				off, m, err = step(i, (*bp)[:m])
			}
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
	return readAll(ctx, r, t.file, len(spans), func(i int, span []byte) (int64, int, error) {
		ls := locs[spans[i][0]:spans[i][1]]
		lo, hi := ls[0].lo, ls[len(ls)-1].hi
		if span == nil {
			return t.recOff + int64(lo*t.rs), (hi - lo) * t.rs, nil // nothing if its buckets are empty: absent
		}
		for _, l := range ls {
			if k := t.match(span[(l.lo-lo)*t.rs:(l.hi-lo)*t.rs], l.probe); k >= 0 {
				rec := span[(l.lo-lo+k)*t.rs:]
				copy(vals[l.q*t.vlen:(l.q+1)*t.vlen], rec[t.vo:t.vo+t.vlen])
				out[l.q] = int32(l.q)
			}
		}
		return 0, 0, nil
	})
}
