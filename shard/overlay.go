package shard

import (
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/cumulus-serving/cumulus/codec"
)

// An overlay indexes the deltas of every chain held on one base file (a
// model's partition): each key any of them wrote, with the entries that
// wrote it, newest first. A version reads it through a view, the set of
// its chain's deltas: a key's answer is its newest entry in the view (a
// tombstone there deletes it), and a key with none falls through to what
// lies below the deltas (the base, resident or served from disk). So
// a lookup probes one index and the base, however long the chain: it no
// longer probes each delta's table in turn.
//
// The overlay holds no records: an entry names a delta's table and a
// record in it. The tables stay in the versions' stacks, counted and freed
// as before (reclaim.go); a view reads only the tables of its own chain,
// which its version holds.
//
// Merging a delta costs in proportion to that delta, off the request path:
// the loader (the only writer) appends its entries and links each in front
// of its key's list while lookups read. Lock-free readers are safe
// because nothing a reader can reach is ever changed, only added to:
//   - an entry is written before the head that reaches it is published,
//     and the entry storage (ovData) is published before both;
//   - a slot's key hash is published before its head, and a reader treats
//     a slot without a head as not holding the key (no view needs it yet);
//   - a rehash builds new slot arrays and publishes them whole; the old
//     ones are never written again;
//   - a version becomes visible (installed in a snapshot) only once every
//     delta of its view is merged, so whatever slots or entries a reader
//     loads after the snapshot hold its view's entries.
//
// A view is exact for any set of layers, not only for a prefix of a line
// of versions: a delta published on a version rolled back to branches the
// history, and both branches' views share the overlay. Within a key's
// list, entries are newest-merged first, and a delta is always merged
// after its parent (loadStack merges a chain oldest first), so the first
// entry of a view's layers is the newest in that chain.
type overlay struct {
	slots atomic.Pointer[ovSlots]
	data  atomic.Pointer[ovData]
	zero  atomic.Uint32 // head of the key whose hash is 0 (0 marks an empty slot)

	// Loader goroutine only:
	keys, entries int            // distinct keys, entries
	layerOf       map[*Table]int // each merged table's layer
	counts        []int          // entries per layer
	bytes         int64          // memory held: slots and entries
}

// ovSlots is an open-addressing index, linear probing, at most half
// full, behind a filter: most keys a lookup asks for are in no delta, and
// a small Bloom filter (8 bits a slot, so 16 to 32 a key; three bits of
// one 64-bit word a key, about 1% false positives) turns most of them
// away before they touch the slots, which are 12 bytes each and mostly
// out of cache. A key's slot is found from h's low bits, its filter word
// from its high bits, the three bits in it from bits 20–37.
type ovSlots struct {
	mask uint64
	n    int // slots
	// s holds slot i as s[2i], the key hash (0: empty), and s[2i+1],
	// the newest entry + 1 (0: none yet): side by side, one line.
	s      []atomic.Uint64
	filter []atomic.Uint64 // filterBits(h) set in word h >> fshift for every key held
	fshift uint
}

func (sl *ovSlots) mayHold(h uint64) bool {
	m := filterBits(h)
	return sl.filter[h>>sl.fshift].Load()&m == m
}

func (sl *ovSlots) addToFilter(h uint64) {
	w := &sl.filter[h>>sl.fshift]
	w.Store(w.Load() | filterBits(h)) // one writer
}

func filterBits(h uint64) uint64 { return 1<<(h>>20&63) | 1<<(h>>26&63) | 1<<(h>>32&63) }

// ovData is the entry storage and the tables the entries name. Chunks
// double in size, so a small overlay stays small and entries never move.
type ovData struct {
	chunks []*[]ovEntry
	tables []*Table // by layer
}

// ovEntry is one delta's record of a key.
type ovEntry struct {
	layer uint32  // the delta's layer in the overlay
	rec   uint32  // its record in tables[layer]
	next  uint32  // the key's entry merged before this one, + 1; 0: none
	w     float32 // the record's linear weight: an LR lookup reads no record
}

const (
	ovFirstChunk = 64 // entries in chunk 0; chunk c holds ovFirstChunk << c
	ovMinSlots   = 64
	// ovEntryBytes and ovSlotBytes are what an entry and a slot cost, for
	// the memory budget.
	ovEntryBytes = int64(unsafe.Sizeof(ovEntry{}))
	ovSlotBytes  = 17 // a key hash, a head, 8 bits of filter
)

// chunkOf returns the chunk holding entry e (from 0) and e's place in it.
func chunkOf(e uint32) (c int, i uint32) {
	c = bits.Len32(e/ovFirstChunk+1) - 1
	return c, e - ovFirstChunk*(1<<c-1)
}

func newOverlay() *overlay {
	o := &overlay{layerOf: map[*Table]int{}}
	o.slots.Store(newSlots(ovMinSlots))
	o.data.Store(&ovData{})
	o.bytes = ovMinSlots * ovSlotBytes
	return o
}

// newSlots makes an empty index of n slots, a power of 2 ≥ 64.
func newSlots(n int) *ovSlots {
	return &ovSlots{mask: uint64(n - 1), n: n, s: make([]atomic.Uint64, 2*n),
		filter: make([]atomic.Uint64, n/8), fshift: uint(64 - bits.Len(uint(n/8)-1))}
}

// entry returns entry e (from 0).
func (d *ovData) entry(e uint32) *ovEntry {
	c, i := chunkOf(e)
	return &(*d.chunks[c])[i]
}

// has reports whether d's chunks hold entry e (from 0).
func (d *ovData) has(e uint32) bool {
	c, _ := chunkOf(e)
	return c < len(d.chunks)
}

// growth is how many bytes merging tables of n more records would
// allocate: the chunks their entries need and, if the slots would be
// over half full, the doubled slots.
func (o *overlay) growth(n int) int64 {
	var b int64
	c, _ := chunkOf(uint32(max(o.entries+n, 1) - 1))
	for i := len(o.data.Load().chunks); i <= c; i++ {
		b += int64(ovFirstChunk<<i) * ovEntryBytes
	}
	if need := 2 * (o.keys + n); need > o.slots.Load().n {
		size := ovMinSlots
		for size < need {
			size *= 2
		}
		b += int64(size) * ovSlotBytes
	}
	return b
}

// merge adds table t's records as a new layer, unless t is merged
// already, and returns t's layer. Loader goroutine only.
func (o *overlay) merge(t *Table) int {
	if l, ok := o.layerOf[t]; ok {
		return l
	}
	old := o.data.Load()
	layer := len(old.tables)
	// Storage first: the entries' chunks and the new table are published
	// before any head can reach them.
	d := &ovData{chunks: old.chunks, tables: append(old.tables[:len(old.tables):len(old.tables)], t)}
	for need := o.entries + t.n; ; {
		c, _ := chunkOf(uint32(max(need, 1) - 1))
		if c < len(d.chunks) {
			break
		}
		ch := make([]ovEntry, ovFirstChunk<<len(d.chunks))
		d.chunks = append(d.chunks[:len(d.chunks):len(d.chunks)], &ch)
		o.bytes += int64(len(ch)) * ovEntryBytes
	}
	o.data.Store(d)
	if sl := o.slots.Load(); 2*(o.keys+t.n) > sl.n {
		o.rehash(sl, 2*(o.keys+t.n))
	}
	sl := o.slots.Load()
	t.eachHash(func(i int, h uint64) { o.insert(sl, d, h, uint32(layer), uint32(i), t.weightAt(i)) })
	o.layerOf[t] = layer
	o.counts = append(o.counts, t.n)
	return layer
}

// insert links a new entry for h in front of its list.
func (o *overlay) insert(sl *ovSlots, d *ovData, h uint64, layer, rec uint32, w float32) {
	e := uint32(o.entries)
	o.entries++
	en := d.entry(e)
	en.layer, en.rec, en.w = layer, rec, w
	if h == 0 {
		en.next = o.zero.Load()
		o.zero.Store(e + 1)
		if en.next == 0 {
			o.keys++
		}
		return
	}
	for i := h & sl.mask; ; i = (i + 1) & sl.mask {
		switch sl.s[2*i].Load() {
		case h:
			en.next = uint32(sl.s[2*i+1].Load())
			sl.s[2*i+1].Store(uint64(e + 1))
			return
		case 0:
			en.next = 0
			sl.addToFilter(h)
			sl.s[2*i].Store(h)
			sl.s[2*i+1].Store(uint64(e + 1))
			o.keys++
			return
		}
	}
}

// rehash publishes slot arrays of at least n slots holding every key.
func (o *overlay) rehash(old *ovSlots, n int) {
	size := ovMinSlots
	for size < n {
		size *= 2
	}
	sl := newSlots(size)
	for i := range old.n {
		h, head := old.s[2*i].Load(), old.s[2*i+1].Load()
		if h == 0 || head == 0 {
			continue
		}
		j := h & sl.mask
		for sl.s[2*j].Load() != 0 {
			j = (j + 1) & sl.mask
		}
		sl.addToFilter(h)
		sl.s[2*j].Store(h)
		sl.s[2*j+1].Store(head)
	}
	o.bytes += int64(size-old.n) * ovSlotBytes
	o.slots.Store(sl)
}

// setTable makes the layer of old name new instead: the same file's
// records, moved (a resident table mapped to make room). Readers may use
// either until old is freed, which reclaim does only once no snapshot
// that could reach old through a view is read.
func (o *overlay) setTable(old, new *Table) bool {
	l, ok := o.layerOf[old]
	if !ok {
		return false
	}
	d := o.data.Load()
	tables := append([]*Table(nil), d.tables...)
	tables[l] = new
	o.data.Store(&ovData{chunks: d.chunks, tables: tables})
	delete(o.layerOf, old)
	o.layerOf[new] = l
	return true
}

// view is a version's view of an overlay: the layers of its chain.
type view struct {
	ov     *overlay
	bits   []uint64 // layer l is in the view if bit l is set
	deltas int      // the stack's top deltas layers are the view's; lookups take the rest below
}

// newView returns a view of ov's layers, which must be in chain order:
// each merged after the one before (an older delta).
func newView(ov *overlay, layers []int, deltas int) *view {
	v := &view{ov: ov, deltas: deltas}
	for _, l := range layers {
		for len(v.bits) <= l>>6 {
			v.bits = append(v.bits, 0)
		}
		v.bits[l>>6] |= 1 << (l & 63)
	}
	return v
}

func (v *view) holds(layer uint32) bool {
	w := int(layer >> 6)
	return w < len(v.bits) && v.bits[w]>>(layer&63)&1 == 1
}

// find sets, for each key j the view has, tbl[j] to the layer of its
// newest entry in the view, rec[j] to the record and, when w is not nil,
// w[j] to the record's linear weight; it sets tbl[j] = -1 for the others.
// It returns the tables the layers name. It allocates nothing.
func (v *view) find(keys []uint64, tbl, rec []int32, w []float32) []*Table {
	sl := v.ov.slots.Load()
	// Loaded after the slots: any head read from them is reachable in it,
	// unless a merge went on since, which find notices and reloads for.
	d := v.ov.data.Load()
	for j, k := range keys {
		h := codec.KeyHash(k)
		var head uint32
		if h == 0 {
			head = v.ov.zero.Load()
		} else if sl.mayHold(h) {
			for i := h & sl.mask; ; i = (i + 1) & sl.mask {
				x := sl.s[2*i].Load()
				if x == h {
					head = uint32(sl.s[2*i+1].Load())
					break
				}
				if x == 0 {
					break
				}
			}
		}
		tbl[j] = -1
		for e := head; e != 0; {
			if !d.has(e - 1) {
				d = v.ov.data.Load()
			}
			en := d.entry(e - 1)
			if v.holds(en.layer) {
				tbl[j], rec[j] = int32(en.layer), int32(en.rec)
				if w != nil {
					w[j] = en.w
				}
				break
			}
			e = en.next
		}
	}
	return d.tables
}
