package router

import "math/bits"

// idIndex numbers distinct feature ids in first-seen order. It is an
// open-addressing table of 16-byte slots, reused across requests: one
// probe touches one cache line. It starts sized for half the request's
// ids being distinct and doubles while it fills past two thirds, so the
// table is as large as the distinct ids need: a rank200 request (20,400
// ids, 6,700 distinct) probes 16,384 slots, 256 KiB, which fits L2. A
// slot belongs to the current request only if its generation matches,
// so reset is O(1) and nothing is cleared or allocated once the table
// has grown.
type idIndex struct {
	slots []idSlot
	gen   uint32
	shift uint
	mask  uint64
	limit int      // distinct ids past which the table doubles
	sink  uint32   // keeps size's reads from being optimized away
	uniq  []uint64 // distinct ids, in first-seen order
}

type idSlot struct {
	key uint64
	gen uint32
	num int32
}

// reset prepares for n ids.
func (x *idIndex) reset(n int) {
	x.uniq = x.uniq[:0]
	x.size(n/2 + 1)
}

// size sets the table up for up to n distinct ids at most two thirds
// full, in a new generation. Only the first slots are used, also of a
// table grown larger by an earlier request: a small request stays in
// cache.
func (x *idIndex) size(n int) {
	size := 64
	for size < n+n/2 {
		size *= 2
	}
	if size > len(x.slots) {
		x.slots = append(x.slots[:cap(x.slots)], make([]idSlot, size-cap(x.slots))...)
	}
	x.mask = uint64(size - 1)
	x.shift = uint(64 - bits.TrailingZeros(uint(size)))
	x.limit = size * 2 / 3
	// Read the table's lines in order before probing it at random: by the
	// time a request begins, the shards' lookups have usually evicted it,
	// and a sequential pass (which the hardware prefetches) costs a
	// fraction of the misses random probes would take one at a time.
	var sink uint32
	for i := 0; i < size; i += 4 { // 4 slots a 64-byte line
		sink += x.slots[i].gen
	}
	x.sink = sink
	x.gen++
	if x.gen == 0 { // wrapped: old stamps could alias
		clear(x.slots)
		x.gen = 1
	}
}

// grow doubles the table and puts the distinct ids seen so far back in.
func (x *idIndex) grow() {
	x.size(int(x.mask+1) * 2 * 2 / 3)
	for i, id := range x.uniq {
		s := x.slot(id)
		for x.slots[s].gen == x.gen {
			s = (s + 1) & x.mask
		}
		x.slots[s] = idSlot{key: id, gen: x.gen, num: int32(i)}
	}
}

func (x *idIndex) slot(id uint64) uint64 { return (id * 0x9e3779b97f4a7c15) >> x.shift }

// index returns id's number, assigning the next one if id is new.
func (x *idIndex) index(id uint64) int32 {
	for s := x.slot(id); ; s = (s + 1) & x.mask {
		e := &x.slots[s]
		if e.gen != x.gen {
			if len(x.uniq) >= x.limit {
				x.grow()
				return x.index(id)
			}
			*e = idSlot{key: id, gen: x.gen, num: int32(len(x.uniq))}
			x.uniq = append(x.uniq, id)
			return e.num
		}
		if e.key == id {
			return e.num
		}
	}
}
