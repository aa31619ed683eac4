package shard

import (
	"math/bits"
	"unsafe"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/prefetch"
)

// window is how many consecutive records findWindow compares with each
// key: the interpolated guess lands within ±4 of the key's record for
// ~97% of keys (docs/storage.md).
const window = 8

// maxWindowRecord is the widest record findWindow serves: a window of
// 8 LR records (12 bytes) spans 2–3 cache lines; wider records would
// make every lookup read many lines.
const maxWindowRecord = 16

// How far ahead of the key being settled the pipeline works, in keys:
// keys placeAhead ahead have their window's lines on the way, keys
// hashAhead ahead their directory entry. Measured with the assembly
// (docs/storage.md): when every line was prefetched into L1, looking
// further ahead than 8/16 gained nothing; with a window's second and
// third lines prefetched into L2 only (PREFETCHT1), 16/32 is ~35% faster
// at 10M keys, and 24/48 or 32/64 no better.
const (
	placeAhead = 16
	hashAhead  = 32
	ringSize   = 64 // > hashAhead, a power of two
)

// chunkKeys bounds one call into scanWindows: assembly is not
// preemptible, so a huge batch is cut into pieces of ~0.2 ms.
const chunkKeys = 8192

// outside marks, in scanWindows' output, a key whose place lay outside
// its window: the caller resolves it.
const outside = -2

// outsideCap is how many outside keys scanWindows lists per call; past
// that, the caller finds the rest by their outside mark. 1–3% of a
// chunk's keys fall outside their windows: 80–250 of 8192.
const outsideCap = 512

// windowScan is scanWindows' argument block; the assembly finds its
// fields through go_asm.h.
type windowScan struct {
	keys  *uint64
	n     int
	out   *int32
	w     *float32 // nil: no weights wanted
	dir   unsafe.Pointer
	rec   unsafe.Pointer // record 0's key word (Table.rec)
	rs    uintptr
	nb    uint64
	count int64
	mask  uint64 // Table.kmask
	quot  int64  // 1: format 4, windows inside the key's bucket (Table.quot)
	woff  int64  // a record's weight, from its key word
	// The keys in flight, by key index mod ringSize.
	probe  [ringSize]uint64 // Table.probe of KeyHash(key)
	frac   [ringSize]uint64 // low half of h × nb: the place inside the bucket
	bucket [ringSize]uint64 // high half: the bucket
	start  [ringSize]int64  // the first record of the key's window; -1: none
	// The first outsideCap keys marked outside, by index; nout counts
	// them all.
	outs [outsideCap]int32
	nout int
}

// findWindow is find for narrow records (LR weights, tiny factor
// vectors), without a data-dependent branch per key. It is a software
// pipeline over the batch (scanWindows): key i+hashAhead is hashed and
// its directory entry prefetched; key i+placeAhead reads its directory
// entry, places an 8-record window around its guess and prefetches the
// window's lines; key i counts the records in its window that sort below
// it. Records are sorted, so that count is the key's place, checked with
// one more comparison. Keys whose place lies outside the window (1–3%)
// are listed by scanWindows and resolved here by findOne.
func (t *Table) findWindow(keys []uint64, out []int32, w []float32) {
	var a windowScan
	t.tableArgs(&a)
	for lo := 0; lo < len(keys); lo += chunkKeys {
		hi := min(lo+chunkKeys, len(keys))
		a.keys, a.n, a.out, a.nout = &keys[lo], hi-lo, &out[lo], 0
		var ws []float32
		if w != nil {
			a.w, ws = &w[lo], w[lo:hi]
		}
		a.scan()
		if a.nout <= outsideCap {
			for _, j := range a.outs[:a.nout] {
				t.resolve(int(j), keys[lo:hi], out[lo:hi], ws)
			}
			continue
		}
		for j, r := range out[lo:hi] { // more than were listed
			if r == outside {
				t.resolve(j, keys[lo:hi], out[lo:hi], ws)
			}
		}
	}
}

// windowed reports whether find takes the windowed search: narrow
// records, and at least one window's worth of them.
func (t *Table) windowed() bool { return t.rs <= maxWindowRecord && t.n >= window }

// tableArgs sets the fields of scanWindows' argument block that come from
// t. In place: the block is ~5 KiB, and returning it by value cost a
// zeroing and a copy on every lookup.
func (t *Table) tableArgs(a *windowScan) {
	a.dir, a.rec = unsafe.Pointer(unsafe.SliceData(t.dir)), unsafe.Pointer(unsafe.SliceData(t.rec))
	a.rs, a.nb, a.count, a.mask, a.woff = uintptr(t.rs), t.nb, int64(t.n), t.kmask, int64(t.vo-t.ko)
	if t.quot {
		a.quot = 1
	}
}

// resolve finds keys[j], which scanWindows left outside, with findOne.
func (t *Table) resolve(j int, keys []uint64, out []int32, w []float32) {
	r := int32(t.findOne(codec.KeyHash(keys[j])))
	out[j] = r
	if w != nil {
		w[j] = 0
		if r >= 0 {
			w[j] = t.weightAt(int(r))
		}
	}
}

// scanWindowsGo is the pure-Go reference of scanWindows (the assembly in
// window_amd64.s), and scanWindows itself on other architectures. It
// stores in out[i] key i's record, outside, or -1 when the window proves
// the key absent; and in w[i], if w is not nil, the record's linear
// weight or 0 (left as it is for outside).
//
// Why assembly on amd64: this loop is the shard's innermost one, and the
// Go compiler's version of it ran about twice the instructions (bounds
// checks, spills around each prefetch call; docs/storage.md).
func scanWindowsGo(a *windowScan) {
	keys := unsafe.Slice(a.keys, a.n)
	out := unsafe.Slice(a.out, a.n)
	var w []float32
	if a.w != nil {
		w = unsafe.Slice(a.w, a.n)
	}
	for i := -hashAhead; i < a.n; i++ {
		if k := i + hashAhead; k < a.n {
			s := k % ringSize
			h := codec.KeyHash(keys[k])
			a.bucket[s], a.frac[s] = bits.Mul64(h, a.nb)
			a.probe[s] = h
			if a.quot != 0 {
				a.probe[s] = a.frac[s] & a.mask
			}
			prefetch.Line(uintptr(unsafe.Add(a.dir, 4*a.bucket[s])))
		}
		if k := i + placeAhead; k >= 0 && k < a.n {
			s := k % ringSize
			// Both ends of the bucket in one load: bucket < nb, and the
			// directory holds nb+1 entries.
			e := *(*uint64)(unsafe.Add(a.dir, 4*a.bucket[s]))
			lo, hi := int64(e&0xffffffff), int64(e>>32)
			g, _ := bits.Mul64(a.frac[s], uint64(hi-lo))
			guess := lo + int64(g)
			lo, hi = a.bounds(s)
			a.start[s] = -1 // no window fits: the key is resolved outside
			if hi-lo >= window {
				a.start[s] = max(min(guess-window/2, hi-window), lo)
				// The window's first, second and last lines: 8 records
				// of ≤ 16 bytes span at most three.
				p := uintptr(unsafe.Add(a.rec, uintptr(a.start[s])*a.rs))
				prefetch.Line(p)
				prefetch.Line(p + 64)
				prefetch.Line(p + window*a.rs - 1)
			}
		}
		if i < 0 {
			continue
		}
		s := i % ringSize
		h, start := a.probe[s], a.start[s]
		if start < 0 {
			a.outside(out, i)
			continue
		}
		p := unsafe.Add(a.rec, uintptr(start)*a.rs)
		var c uintptr // records in the window below h
		for r := range uintptr(window) {
			_, b := bits.Sub64(*(*uint64)(unsafe.Add(p, r*a.rs)), h, 0)
			c += uintptr(b)
		}
		r := unsafe.Add(p, c*a.rs)
		inside := c < window // the place is a record the window may cover
		if !inside {
			_, hi := a.bounds(s)
			inside = start+window < hi
		}
		switch {
		case inside && *(*uint64)(r)&a.mask == h:
			out[i] = int32(start + int64(c))
			if w != nil {
				w[i] = *(*float32)(unsafe.Add(r, a.woff))
			}
		case a.beyond(s, start, c):
			a.outside(out, i)
		default:
			out[i] = -1
			if w != nil {
				w[i] = 0
			}
		}
	}
}

// bounds is the records the window of the key in ring slot s may cover:
// its bucket's (format 4, whose key words compare only inside their
// bucket) or the table's.
func (a *windowScan) bounds(s int) (lo, hi int64) {
	if a.quot == 0 {
		return 0, a.count
	}
	e := *(*uint64)(unsafe.Add(a.dir, 4*a.bucket[s]))
	return int64(e & 0xffffffff), int64(e >> 32)
}

// beyond reports whether the key in ring slot s, not found at its place
// start+c in its window, may lie outside the window: c is 0 or window,
// and the window does not end there at its bounds.
func (a *windowScan) beyond(s int, start int64, c uintptr) bool {
	lo, hi := a.bounds(s)
	return c == 0 && start > lo || c == window && start+window < hi
}

// scan runs the scanWindows for a's table: its keys whole or quotiented.
func (a *windowScan) scan() {
	if a.quot != 0 {
		scanWindowsQ(a)
		return
	}
	scanWindows(a)
}

// outside marks key i as outside its window, listing it while the list
// has room.
func (a *windowScan) outside(out []int32, i int) {
	out[i] = outside
	if a.nout < outsideCap {
		a.outs[a.nout] = int32(i)
	}
	a.nout++
}
