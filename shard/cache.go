package shard

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/prefetch"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
)

// A partition served from disk keeps the values of its most asked keys
// in a value cache: a fixed array of slots, set-associative (a key's
// set is 8 slots side by side, found from the low bits of its h), that
// the request path reads without locks. It never grows: its memory is
// taken once, within the budget.
//
// Two kinds of writer: the shard's loader, which admits and evicts
// (below), and lookups, which put a key they read from disk into an
// empty slot of its set (offer), never evicting. So a cache made empty
// (a rollback's, a new one) fills at the rate of the traffic, each hot
// key read from disk about once, instead of every lookup reading it
// until the loader's next turn.
//
// What a set keeps is decided by frequency, TinyLFU-style: the loader
// counts sampled lookups in a small sketch, and a key asked for but not
// cached replaces the least frequent key of its set only if it has been
// asked for more often. One-off keys (most of a uniform stream, the long
// tail of a Zipf one) never push out the hot ones, and the cache holds
// the keys that recur, not the pages they happen to sit on.
//
// A slot is rewritten under a sequence number, odd while a writer
// holds it (claimed by compare-and-swap, so writers exclude each other):
// a reader copies the value between two reads of it and of the slot's h,
// and takes it only if neither changed, so it never sees one key's h with
// another's value. The sequence number is the word before the value, so
// a hit reads two cache lines, its set's hs and its slot. A set's empty
// slots are its last ones (slots are filled first empty first, and never
// emptied), so lookups offering keys of one set race for one slot, and a
// key is not put twice by two of them.

// cacheWays is the slots of a set: their hs fill one cache line.
const cacheWays = 8

// Its memory is outside the Go heap (tablemem), as tables' is: a cache
// is most of a shard's heap-like memory when partitions are served from
// disk, and in the heap the collector would let garbage grow to the
// cache's size again before collecting it.
type valueCache struct {
	hs []atomic.Uint64 // slot i's h; 0 when empty
	// words holds slot i at i×sw: its sequence number (odd while it is
	// rewritten), then its value bytes, vw words.
	words []atomic.Uint32
	vw    int          // words a value
	sw    int          // words a slot: vw + 1
	vlen  int          // value bytes
	mask  uint64       // sets − 1
	freq  sketch       // the loader's only
	n     atomic.Int64 // slots filled
	mem   *tablemem.Buffer
	// readers counts lookups reading the cache (Table.useCache): memory
	// is freed only once a dropped cache has none.
	readers atomic.Int64
}

// slotBytes is what one slot of a cache for values of vlen bytes costs.
func slotBytes(vlen int) int64 { return int64(12 + 4*((vlen+3)/4)) }

// cacheBytes is what a cache of sets sets costs, sketch included.
func cacheBytes(sets, vlen int) int64 {
	n := int64(sets * cacheWays)
	return 8*n + sketchBytes(sets*cacheWays) + (4*n*int64(1+(vlen+3)/4)+7)&^7
}

// cacheSets is the sets of the largest cache for values of vlen bytes
// that costs at most bytes, holding at most keys keys; 0 if not one
// fits. Sets are a power of two, so a cache leaves up to half of what
// it is given unused.
func cacheSets(bytes int64, vlen, keys int) int {
	sets := 1
	for sets*2*cacheWays <= keys && cacheBytes(sets*2, vlen) <= bytes {
		sets *= 2
	}
	if cacheBytes(sets, vlen) > bytes {
		return 0
	}
	return sets
}

// cacheFit is what the cache newValueCache(bytes, vlen, keys) makes
// costs; 0 if none.
func cacheFit(bytes int64, vlen, keys int) int64 {
	if sets := cacheSets(bytes, vlen, keys); sets > 0 {
		return cacheBytes(sets, vlen)
	}
	return 0
}

// newValueCache makes the largest cache for values of vlen bytes that
// costs at most bytes, holding at most keys keys; nil if not one set fits.
func newValueCache(bytes int64, vlen, keys int) *valueCache {
	sets := cacheSets(bytes, vlen, keys)
	if sets == 0 {
		return nil
	}
	vw := (vlen + 3) / 4
	n := sets * cacheWays
	counters := sketchCounters(n)
	// One region, each part 8-byte aligned: hs (first: a set's hs are
	// one cache line), the sketch's words, the slots.
	mem := tablemem.Alloc(int(cacheBytes(sets, vlen)))
	b := mem.Bytes
	carve := func(bytes int) unsafe.Pointer {
		p := unsafe.Pointer(unsafe.SliceData(b))
		b = b[(bytes+7)&^7:]
		return p
	}
	c := &valueCache{vw: vw, sw: vw + 1, vlen: vlen, mask: uint64(sets - 1), mem: mem}
	c.hs = unsafe.Slice((*atomic.Uint64)(carve(8*n)), n)
	c.freq.init(unsafe.Slice((*uint64)(carve(counters/2)), counters/16), n)
	c.words = unsafe.Slice((*atomic.Uint32)(carve(4*n*c.sw)), n*c.sw)
	return c
}

// free gives the cache's memory back. Nothing may read it after.
func (c *valueCache) free() { c.mem.Free() }

// Bytes is the cache's memory.
func (c *valueCache) Bytes() int64 { return cacheBytes(int(c.mask+1), c.vlen) }

// Len is how many keys it holds.
func (c *valueCache) Len() int { return int(c.n.Load()) }

func (c *valueCache) set(h uint64) int { return int(h&c.mask) * cacheWays }

// get copies h's value into dst (vlen bytes) and reports whether the
// cache holds h. Any goroutine; no lock, no allocation.
func (c *valueCache) get(h uint64, dst []byte) bool {
	i := c.way(h)
	return i >= 0 && c.read(int(i), h, dst)
}

// way is the slot holding h, or −1.
func (c *valueCache) way(h uint64) int32 {
	if h == 0 {
		return -1 // 0 marks an empty slot
	}
	s := c.set(h)
	for i := s; i < s+cacheWays; i++ {
		if c.hs[i].Load() == h {
			return int32(i)
		}
	}
	return -1
}

// read copies slot i's value into dst and reports whether it is h's: the
// slot was not being rewritten, and still holds h after the copy.
func (c *valueCache) read(i int, h uint64, dst []byte) bool {
	w := c.words[i*c.sw : (i+1)*c.sw]
	q := w[0].Load()
	if q&1 != 0 {
		return false
	}
	full := c.vlen / 4
	for k := range full {
		binary.LittleEndian.PutUint32(dst[4*k:], w[1+k].Load())
	}
	if full < c.vw { // a value not a whole number of words: its last bytes
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], w[1+full].Load())
		copy(dst[4*full:c.vlen], b[:])
	}
	return w[0].Load() == q && c.hs[i].Load() == h
}

// copySlot copies c's slot i, holding h, into g's empty slot j unless
// a lookup rewrites it meanwhile, and reports whether it did. No other
// goroutine may reach g yet (grow's copy, before the cache is
// published, which orders these writes before any read): it is written
// with plain stores, not put's atomic ones, an exchange each on amd64,
// which took most of a copy's time. The caller counts the slot in g.n.
func (g *valueCache) copySlot(j int, c *valueCache, i int, h uint64) bool {
	src := c.words[i*c.sw : (i+1)*c.sw]
	dst := unsafe.Slice((*uint32)(unsafe.Pointer(&g.words[j*g.sw])), g.sw)
	q := src[0].Load()
	if q&1 != 0 {
		return false
	}
	for k := 1; k < len(src); k++ {
		dst[k] = src[k].Load()
	}
	if src[0].Load() != q || c.hs[i].Load() != h {
		return false // what was written of the value lies in a slot still empty
	}
	*(*uint64)(unsafe.Pointer(&g.hs[j])) = h
	return true
}

// cacheAhead is how many keys ahead getAll fetches a key's set, and
// then again its slot: each line has that many keys' work to arrive in.
const cacheAhead = 8

// getAll is get for a batch: key q's value goes to vals[q×vlen:] and
// out[q] is q, or −1 if the cache lacks it. Keys are taken in three
// stages, each cacheAhead keys behind the one before: hash and prefetch
// the set's hs, find the slot and prefetch it, copy the value. So a
// hit's two cache misses overlap other keys' instead of coming one after
// the other (get's). Any goroutine; no lock, no allocation.
func (c *valueCache) getAll(keys []uint64, out []int32, vals []byte) {
	var ring [4 * cacheAhead]uint64 // the hs of keys q to q+2×cacheAhead
	const mask = len(ring) - 1
	hs := uintptr(unsafe.Pointer(unsafe.SliceData(c.hs)))
	slots := uintptr(unsafe.Pointer(unsafe.SliceData(c.words)))
	n := len(keys)
	for q := -2 * cacheAhead; q < n; q++ {
		if j := q + 2*cacheAhead; j < n {
			h := codec.KeyHash(keys[j])
			ring[j&mask] = h
			prefetch.Line(hs + uintptr(8*c.set(h)))
		}
		if j := q + cacheAhead; j >= 0 && j < n {
			i := c.way(ring[j&mask])
			out[j] = i
			if i >= 0 {
				prefetch.Range(slots+uintptr(4*int(i)*c.sw), uintptr(4*c.sw))
			}
		}
		if q < 0 {
			continue
		}
		if i := out[q]; i >= 0 && c.read(int(i), ring[q&mask], vals[q*c.vlen:]) {
			out[q] = int32(q)
		} else {
			out[q] = -1
		}
	}
}

// has reports whether the cache holds h.
func (c *valueCache) has(h uint64) bool {
	s := c.set(h)
	for i := s; i < s+cacheWays; i++ {
		if c.hs[i].Load() == h {
			return true
		}
	}
	return false
}

// admits reports which slot h would take: an empty one, else its set's
// least frequent key's if h has been asked for more often; -1 if none.
// The loader's only.
func (c *valueCache) admits(h uint64) int {
	if h == 0 {
		return -1 // 0 marks an empty slot
	}
	s := c.set(h)
	victim, least := -1, 0
	for i := s; i < s+cacheWays; i++ {
		x := c.hs[i].Load()
		if x == 0 {
			return i
		}
		if f := c.freq.estimate(x); victim < 0 || f < least {
			victim, least = i, f
		}
	}
	if c.freq.estimate(h) > least {
		return victim
	}
	return -1
}

// put writes h and its value into slot i (from admits), waiting for a
// lookup writing it (offer: nanoseconds). The loader's only.
func (c *valueCache) put(i int, h uint64, val []byte) {
	w := c.words[i*c.sw : (i+1)*c.sw]
	q := w[0].Load()
	for q&1 != 0 || !w[0].CompareAndSwap(q, q+1) { // odd: readers of slot i give up
		q = w[0].Load()
	}
	c.write(i, h, val, q)
}

// write fills slot i, claimed at sequence q (now q+1), and releases it.
func (c *valueCache) write(i int, h uint64, val []byte, q uint32) {
	w := c.words[i*c.sw : (i+1)*c.sw]
	if c.hs[i].Load() == 0 {
		c.n.Add(1)
	}
	c.hs[i].Store(h)
	var b [4]byte
	for k := range w[1:] {
		n := copy(b[:], val[min(4*k, len(val)):])
		clear(b[n:])
		w[1+k].Store(binary.LittleEndian.Uint32(b[:]))
	}
	w[0].Store(q + 2)
}

// offer puts h and its value in its set's first empty slot, if the set
// has one and lacks h, and no other writer holds that slot; it never
// evicts. Any goroutine: a lookup offers what it read from disk.
func (c *valueCache) offer(h uint64, val []byte) {
	if h == 0 {
		return // 0 marks an empty slot
	}
	s, i := c.set(h), -1
	for j := s; j < s+cacheWays; j++ {
		if x := c.hs[j].Load(); x == h {
			return
		} else if x == 0 {
			i = j
			break
		}
	}
	if i < 0 {
		return
	}
	w := &c.words[i*c.sw]
	q := w.Load()
	if q&1 != 0 || !w.CompareAndSwap(q, q+1) {
		return
	}
	// Claimed: a writer that held it before is done, and what it wrote
	// is seen. If it filled the slot, leave it (the slot's sequence moves
	// on, which readers take as a miss once).
	if c.hs[i].Load() != 0 {
		w.Store(q + 2)
		return
	}
	c.write(i, h, val, q)
}

// sketch estimates how often keys were asked for: a count-min sketch of
// 4-bit counters, four per key, halved every 10 counts per slot of the
// cache it serves so that old traffic fades. About 1 byte a cache slot.
type sketch struct {
	words   []uint64 // 16 counters each
	shift   uint     // 64 − log2(counters)
	adds    int
	resetAt int
}

func sketchCounters(slots int) int { return 1 << max(10, bits.Len(uint(slots))+1) }
func sketchBytes(slots int) int64  { return int64(sketchCounters(slots) / 2) }

// init sets the sketch up for a cache of slots slots, its counters in
// words (sketchCounters(slots)/16 of them, zero).
func (s *sketch) init(words []uint64, slots int) {
	s.words = words
	s.shift = uint(64 - bits.Len(uint(16*len(words)-1)))
	s.resetAt = 10 * slots
}

// sketchSeeds spread one h over four counters.
var sketchSeeds = [4]uint64{0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9, 0x94d049bb133111eb, 0xd6e8feb86659fd93}

func (s *sketch) counter(h uint64, i int) (word int, shift uint) {
	c := (h * sketchSeeds[i]) >> s.shift
	return int(c >> 4), uint(c&15) * 4
}

// add counts one request for h.
func (s *sketch) add(h uint64) { s.addTimes(h, 1) }

// addTimes counts n requests for h (a count carried over from another
// cache's sketch: at most 15), each counter once.
func (s *sketch) addTimes(h uint64, n int) {
	if n <= 0 {
		return
	}
	for i := range sketchSeeds {
		w, sh := s.counter(h, i)
		c := s.words[w] >> sh & 15
		s.words[w] += uint64(min(15-c, uint64(n))) << sh
	}
	if s.adds += n; s.adds >= s.resetAt {
		for i, w := range s.words {
			s.words[i] = w >> 1 & 0x7777777777777777
		}
		s.adds /= 2
	}
}

// spreadFrom sets s's counters, as many as from's or a power of two
// times as many, to those of from they divide: a counter's index is the
// top bits of a product of h, so h's counter in s is one of those that
// its counter in from divides into, and its estimate stays no less than
// the truth. Counts fade on s's halvings from then on.
func (s *sketch) spreadFrom(from *sketch) {
	if len(s.words) < len(from.words) {
		return
	}
	// Doubled in place, from the end, as many times as it takes: word i
	// of n becomes words 2i and 2i+1, each of its counters two.
	n := copy(s.words, from.words)
	for ; n < len(s.words); n *= 2 {
		for i := n - 1; i >= 0; i-- {
			w := s.words[i]
			s.words[2*i+1], s.words[2*i] = doubleCounters(w>>32), doubleCounters(w&0xffffffff)
		}
	}
	s.adds = from.adds
}

// doubleCounters is the 8 counters of x's low 32 bits, each twice in a
// row: counter i becomes counters 2i and 2i+1.
func doubleCounters(x uint64) uint64 {
	x = (x | x<<16) & 0x0000ffff0000ffff
	x = (x | x<<8) & 0x00ff00ff00ff00ff
	x = (x | x<<4) & 0x0f0f0f0f0f0f0f0f
	return x | x<<4
}

// estimate is how often h was asked for, as far as the sketch knows
// (never less than the truth since the last halving).
func (s *sketch) estimate(h uint64) int {
	least := 15
	for i := range sketchSeeds {
		w, sh := s.counter(h, i)
		least = min(least, int(s.words[w]>>sh&15))
	}
	return least
}
