package shard

import (
	"math/bits"
	"unsafe"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/prefetch"
)

// pfGroup is one group of keys in flight in findScan's pipeline.
type pfGroup struct {
	n      int
	hs     [group]uint64 // the keys' probes
	frac   [group]uint64
	bucket [group]uint64
	lo, hi [group]int32
	pos    [group]int32
}

// find stores in out[j] the record of keys[j] or -1, and, if w is not
// nil, the record's linear weight or 0 in w[j].
func (t *Table) find(keys []uint64, out []int32, w []float32) {
	if t.split && w != nil {
		// The searches read a weight beside its key: apart, it is read
		// after (only LR asks for weights, and its records are narrow).
		t.find(keys, out, nil)
		for j, r := range out {
			w[j] = 0
			if r >= 0 {
				w[j] = t.weightAt(int(r))
			}
		}
		return
	}
	switch {
	case t.n == 0:
		for j := range keys {
			out[j] = -1
			if w != nil {
				w[j] = 0
			}
		}
	case t.windowed():
		t.findWindow(keys, out, w)
	default:
		t.findScan(keys, out, w)
	}
}

// findScan resolves keys in groups, pipelined two groups deep with
// software prefetch: while group g settles, group g+1's guessed record
// lines (and the lines two records either side, where a missed guess
// usually lands) and group g+2's directory lines are on their way. It
// serves tables of wide records (FM factors), where comparing a window
// of records would read many lines for one key.
func (t *Table) findScan(keys []uint64, out []int32, w []float32) {
	var st [3]pfGroup
	ng := (len(keys) + group - 1) / group
	dir := uintptr(unsafe.Pointer(unsafe.SliceData(t.dir)))
	rec := uintptr(unsafe.Pointer(unsafe.SliceData(t.rec)))
	for g := -2; g < ng; g++ {
		if a := g + 2; a < ng {
			s := &st[a%3]
			ks := keys[a*group : min((a+1)*group, len(keys))]
			s.n = len(ks)
			for j, k := range ks {
				h := codec.KeyHash(k)
				b, f := bits.Mul64(h, t.nb)
				s.hs[j], s.frac[j], s.bucket[j] = t.probe(h, f), f, b
				prefetch.Line(dir + uintptr(4*b))
			}
		}
		if b := g + 1; b >= 0 && b < ng {
			s := &st[b%3]
			for j := range s.n {
				lo, hi := int32(t.dirAt(s.bucket[j])), int32(t.dirAt(s.bucket[j]+1))
				gs, _ := bits.Mul64(s.frac[j], uint64(hi-lo))
				p := min(lo+int32(gs), int32(t.n-1))
				s.lo[j], s.hi[j], s.pos[j] = lo, hi, p
				prefetch.Line(rec + uintptr(int(p)*t.rs))
				// A missed guess is usually within two records: fetch the
				// neighbouring lines too (a prefetch never stalls).
				prefetch.Line(rec + uintptr(int(max(p-2, 0))*t.rs))
				prefetch.Line(rec + uintptr(int(min(p+2, int32(t.n-1)))*t.rs))
			}
		}
		if g >= 0 {
			s := &st[g%3]
			base := g * group
			for j := range s.n {
				r := int32(-1)
				if s.lo[j] < s.hi[j] {
					r = int32(t.scan(s.hs[j], int(s.pos[j]), int(s.lo[j]), int(s.hi[j])))
				}
				out[base+j] = r
				if w != nil {
					w[base+j] = 0
					if r >= 0 {
						w[base+j] = t.weightAt(int(r))
					}
				}
			}
		}
	}
}
