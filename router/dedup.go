package router

import "math/bits"

// idIndex numbers distinct feature ids in first-seen order. It is an
// open-addressing table reused across requests: a slot belongs to the
// current request only if its generation matches, so reset is O(1) and
// nothing is cleared or allocated once the table has grown.
type idIndex struct {
	keys  []uint64
	slots []int32
	gens  []uint32
	gen   uint32
	shift uint
	mask  uint64
	uniq  []uint64 // distinct ids, in first-seen order
}

// reset prepares for up to n distinct ids.
func (x *idIndex) reset(n int) {
	size := 64
	for size < 2*n {
		size *= 2
	}
	if size > len(x.keys) {
		x.keys = make([]uint64, size)
		x.slots = make([]int32, size)
		x.gens = make([]uint32, size)
		x.gen = 0
	}
	x.mask = uint64(size - 1)
	x.shift = uint(64 - bits.TrailingZeros(uint(size)))
	x.gen++
	if x.gen == 0 { // wrapped: old stamps could alias
		clear(x.gens)
		x.gen = 1
	}
	x.uniq = x.uniq[:0]
}

// index returns id's number, assigning the next one if id is new.
func (x *idIndex) index(id uint64) int32 {
	for s := (id * 0x9e3779b97f4a7c15) >> x.shift; ; s = (s + 1) & x.mask {
		if x.gens[s] != x.gen {
			x.gens[s], x.keys[s] = x.gen, id
			x.slots[s] = int32(len(x.uniq))
			x.uniq = append(x.uniq, id)
			return x.slots[s]
		}
		if x.keys[s] == id {
			return x.slots[s]
		}
	}
}
