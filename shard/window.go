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

// wgroup is how many keys findWindow moves through its pipeline at once.
// Small on purpose: each key has ~3 lines in flight and the core tracks
// only a few dozen misses; prefetching further ahead measured slower
// (docs/storage.md).
const wgroup = 8

// winGroup is one group of keys in findWindow's pipeline. The assembly
// stages (window_amd64.s) find its fields through go_asm.h.
type winGroup struct {
	hs     [wgroup]uint64 // KeyHash of each key
	frac   [wgroup]uint64 // low half of hs × nb: the place inside the bucket
	bucket [wgroup]uint64 // high half: the bucket
	start  [wgroup]int32  // first record of the key's window
}

// findWindow is find for narrow records (LR weights, tiny factor
// vectors), without a data-dependent branch per key. A three-stage
// pipeline: group g+2 is hashed and its directory entries prefetched;
// group g+1 reads its directory entries, places an 8-record window
// around each guess and prefetches the window's lines; group g counts,
// for each key, the records in its window that sort below it. Records
// are sorted, so that count is the key's place, checked with one more
// comparison. Keys whose place lies outside the window (~3%) are left
// to findOne.
//
// The stages run in assembly on amd64 (window_amd64.s): this is the
// shard's innermost loop, and the Go compiler's version of it executed
// about twice the instructions (bounds checks, spills around the
// prefetch calls; docs/storage.md). windowGeneric is the same algorithm
// in Go, used elsewhere and as the assembly's reference in tests.
func (t *Table) findWindow(keys []uint64, out []int32, w []float32) {
	var st [3]winGroup
	dir := unsafe.Pointer(unsafe.SliceData(t.dir))
	rec := unsafe.Pointer(unsafe.SliceData(t.rec))
	rs := uintptr(t.rs)
	last := int64(t.n - window)
	ng := (len(keys) + wgroup - 1) / wgroup
	for g := -2; g < ng; g++ {
		if a := g + 2; a < ng {
			ks := keys[a*wgroup : min((a+1)*wgroup, len(keys))]
			hashGroup(&st[a%3], unsafe.SliceData(ks), len(ks), t.nb, dir)
		}
		if b := g + 1; b >= 0 && b < ng {
			placeGroup(&st[b%3], min((b+1)*wgroup, len(keys))-b*wgroup, dir, rec, rs, last)
		}
		if g < 0 {
			continue
		}
		s, base := &st[g%3], g*wgroup
		os := out[base:min(base+wgroup, len(keys))]
		var wp *float32
		if w != nil {
			wp = &w[base]
		}
		miss := settleGroup(s, len(os), rec, rs, int64(t.n), unsafe.SliceData(os), wp)
		for miss != 0 {
			j := bits.TrailingZeros64(miss)
			miss &= miss - 1
			r := int32(t.findOne(s.hs[j]))
			os[j] = r
			if w != nil {
				w[base+j] = 0
				if r >= 0 {
					w[base+j] = t.weightAt(int(r))
				}
			}
		}
	}
}

// The stages below are the pure-Go reference of window_amd64.s; each
// takes at most wgroup keys.

// hashGroupGo hashes n keys, splits each hash into bucket and place, and
// prefetches each bucket's directory entry.
func hashGroupGo(s *winGroup, keys *uint64, n int, nb uint64, dir unsafe.Pointer) {
	for j, k := range unsafe.Slice(keys, n) {
		h := codec.KeyHash(k)
		b, f := bits.Mul64(h, nb)
		s.hs[j], s.frac[j], s.bucket[j] = h, f, b
		prefetch.Line(uintptr(unsafe.Add(dir, 4*b)))
	}
}

// placeGroupGo places each key's window: its guess minus window/2,
// clamped to [0, last], and prefetches the window's first, second and
// last lines (8 records of ≤ 16 bytes span at most three).
func placeGroupGo(s *winGroup, n int, dir, rec unsafe.Pointer, rs uintptr, last int64) {
	for j := range n {
		// Both ends of the bucket in one load: bucket < nb, and the
		// directory holds nb+1 entries.
		e := *(*uint64)(unsafe.Add(dir, 4*s.bucket[j]))
		lo, hi := e&0xffffffff, e>>32
		g, _ := bits.Mul64(s.frac[j], hi-lo)
		start := max(min(int64(lo+g)-window/2, last), 0)
		s.start[j] = int32(start)
		a := uintptr(unsafe.Add(rec, uintptr(start)*rs))
		prefetch.Line(a)
		prefetch.Line(a + 64)
		prefetch.Line(a + window*rs - 1)
	}
}

// settleGroupGo stores each key's record in out[j] (and its weight in
// w[j] if w is not nil), or -1 and 0 for an absent key. It returns a
// bit mask of the keys whose place lay outside their window: their out
// and w are for the caller to fill.
func settleGroupGo(s *winGroup, n int, rec unsafe.Pointer, rs uintptr, count int64, out *int32, w *float32) (miss uint64) {
	os := unsafe.Slice(out, n)
	var ws []float32
	if w != nil {
		ws = unsafe.Slice(w, n)
	}
	for j := range os {
		h, start := s.hs[j], int64(s.start[j])
		a := unsafe.Add(rec, uintptr(start)*rs)
		var c uintptr // records in the window below h
		for i := range uintptr(window) {
			_, b := bits.Sub64(*(*uint64)(unsafe.Add(a, i*rs)), h, 0)
			c += uintptr(b)
		}
		r := unsafe.Add(a, c*rs)
		switch {
		case start+int64(c) < count && *(*uint64)(r) == h:
			os[j] = int32(start + int64(c))
			if ws != nil {
				ws[j] = *(*float32)(unsafe.Add(r, 8))
			}
		case c == 0 || c == window:
			miss |= 1 << j
		default:
			os[j] = -1
			if ws != nil {
				ws[j] = 0
			}
		}
	}
	return miss
}
