package shard

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
)

// A partition served from disk learns its hot keys from traffic: lookups
// sample the keys they ask of it into a lock-free ring (sampler, one a
// shard), and the shard's loader drains the samples every HotInterval
// into each table's value cache (cache.go), which admits a key by
// frequency. Keys are the unit cached, not pages: records are placed by
// hash, so the hot keys of Zipf traffic are spread over every page, and
// caching a third of the pages keeps a third of the hot keys.

const (
	sampleRing = 1 << 17 // samples held between drains: 2 MiB a shard
	sampleCall = 1 << 14 // most samples one lookup takes, spread over its keys
	// sampleDrain is how many samples a drain aims for: past it, lookups
	// sample one key in every few, so that the loader's work does not
	// grow with the traffic. Counting a sample costs the loader about
	// 80 ns (the sketch's and the cache's lines); a whole ring a drain
	// took a shard 11 ms of CPU, and four shards on two cores stalled
	// every lookup for 30–50 ms each HotInterval.
	sampleDrain = 1 << 15
)

// sampler is a lock-free ring of sampled (table, key) pairs. Writers race
// benignly: a sample overwritten before it is drained is simply lost,
// and one torn between two writers names a key of another table, which
// that table lacks.
type sampler struct {
	ring   [sampleRing]sampleSlot
	pos    atomic.Uint64
	calls  atomic.Uint64
	stride atomic.Uint64 // keys a sample at least (0: every key); set by drain
	read   uint64        // drain position; drain's goroutine only
}

type sampleSlot struct {
	t   atomic.Pointer[Table]
	key atomic.Uint64
}

// Sample records some of keys if t is served from disk, for its value
// cache. It allocates nothing and takes no lock.
func (t *Table) Sample(keys []uint64) {
	s := t.sample
	if s == nil {
		return
	}
	// One reservation of ring slots a call (lookups run at once: a
	// shared counter bumped per key would bounce between cores). The
	// first key sampled moves from call to call: a fixed stride from 0
	// would see only the same positions of a repeated key order.
	// A call of fewer keys than the stride is sampled as often as its
	// share (first beyond its keys: none taken).
	every := max((len(keys)+sampleCall-1)/sampleCall, int(min(s.stride.Load(), sampleRing)))
	if len(keys) == 0 {
		return
	}
	first := int(s.calls.Add(1) % uint64(every))
	n := uint64((len(keys) - first + every - 1) / every)
	at := s.pos.Add(n) - n
	for j := first; j < len(keys); j += every {
		slot := &s.ring[at%sampleRing]
		slot.t.Store(t)
		slot.key.Store(keys[j])
		at++
	}
}

// drain calls fn on each sample taken since the last drain, and sets
// the stride so that the next drain finds about sampleDrain samples if
// the traffic holds.
func (s *sampler) drain(fn func(t *Table, key uint64)) {
	end := s.pos.Load()
	for i := max(s.read, end-min(end, sampleRing)); i < end; i++ {
		slot := &s.ring[i%sampleRing]
		if t := slot.t.Swap(nil); t != nil { // (not kept reachable once released)
			fn(t, slot.key.Load())
		}
	}
	asked := (end - s.read) * max(s.stride.Load(), 1) // keys the lookups had, about
	s.stride.Store(max((asked+sampleDrain-1)/sampleDrain, 1))
	s.read = end
}

// heard groups a drain's samples by table, in buffers the loader keeps
// from tick to tick (a ring's worth, 3 MiB a shard): growing new ones
// every tick was a megabyte of garbage a shard and tick.
type heard struct {
	drained []drainedSample
	keys    []uint64
	counts  map[*Table]int
	tables  map[*Table][]uint64 // slices of keys
}

type drainedSample struct {
	t   *Table
	key uint64
}

// group drains s and returns each table's samples.
func (h *heard) group(s *sampler) map[*Table][]uint64 {
	if h.tables == nil {
		h.drained, h.keys = make([]drainedSample, 0, sampleRing), make([]uint64, sampleRing)
		h.counts, h.tables = map[*Table]int{}, map[*Table][]uint64{}
	}
	s.drain(func(t *Table, key uint64) { h.drained = append(h.drained, drainedSample{t, key}) })
	// A lookup's samples lie together, so the maps are asked once a run
	// of one table's, not once a sample.
	runs := func(fn func(run []drainedSample)) {
		for i := 0; i < len(h.drained); {
			j := i + 1
			for j < len(h.drained) && h.drained[j].t == h.drained[i].t {
				j++
			}
			fn(h.drained[i:j])
			i = j
		}
	}
	runs(func(run []drainedSample) { h.counts[run[0].t] += len(run) })
	at := 0
	for t, n := range h.counts {
		h.tables[t] = h.keys[at : at : at+n]
		at += n
	}
	runs(func(run []drainedSample) {
		keys := h.tables[run[0].t]
		for _, d := range run {
			keys = append(keys, d.key)
		}
		h.tables[run[0].t] = keys
	})
	return h.tables
}

// release forgets the tables grouped, so that none is kept reachable.
func (h *heard) release() {
	clear(h.drained)
	h.drained = h.drained[:0]
	clear(h.counts)
	clear(h.tables)
}

// learn counts keys, sampled lookups of t, in its cache's sketch, and
// reads (with r's turns) and caches those the cache lacks and admits.
// The loader's only (one goroutine a table).
func (t *Table) learn(ctx context.Context, r *ColdReads, keys []uint64) {
	c := t.cache.Load()
	if c == nil {
		return
	}
	// Count every sample, keeping those the cache lacks (in place: each
	// key is looked at before it is overwritten). Served Zipf traffic is
	// mostly hits, so what is left to sort is a few of the samples, not
	// all: sorting all of them was half the loader's CPU.
	missed := keys[:0]
	for _, key := range keys {
		h := codec.KeyHash(key)
		if c.freq.add(h); !c.has(h) {
			missed = append(missed, key)
		}
	}
	// Then the keys to read: each once, those the cache would admit now
	// (its sketch counting this drain), at most as many as it has slots
	// empty or an eighth of them, so that learning takes few of the
	// disk's turns from lookups.
	slices.Sort(missed)
	missed = slices.Compact(missed)
	most := max(len(c.hs)-c.Len(), len(c.hs)/8)
	want := missed[:0]
	for _, key := range missed {
		if h := codec.KeyHash(key); c.admits(h) >= 0 {
			if want = append(want, key); len(want) == most {
				break
			}
		}
	}
	if len(want) == 0 {
		return
	}
	vals := make([]byte, len(want)*t.vlen)
	out := make([]int32, len(want))
	// What was read before an error (the loader's deadline, a slow disk)
	// is admitted all the same: out marks it.
	t.readCold(ctx, want, out, vals, nil, r)
	for q, k := range want {
		h := codec.KeyHash(k)
		if out[q] < 0 || c.has(h) {
			continue
		}
		if i := c.admits(h); i >= 0 {
			c.put(i, h, vals[q*t.vlen:(q+1)*t.vlen])
		}
	}
}

// useCache returns t's value cache, registered as read until its done,
// or nil.
func (t *Table) useCache() *valueCache {
	for {
		c := t.cache.Load()
		if c == nil {
			return nil
		}
		c.readers.Add(1)
		if t.cache.Load() == c {
			return c
		}
		c.readers.Add(-1) // dropped meanwhile: it may be freed
	}
}

func (c *valueCache) done() { c.readers.Add(-1) }

// dropCache takes t's value cache away; its memory goes once no lookup
// reads it. Loader goroutine only.
// Callers free the dropped caches (freeCaches) when done dropping.
func (s *Shard) dropCache(t *Table) {
	if c := t.cache.Swap(nil); c != nil {
		s.deadCaches = append(s.deadCaches, c)
	}
	t.abandonGrowth()
}

// freeCaches frees the dropped caches no lookup reads, waiting up to
// wait for those read; the others are freed on a later call.
func (s *Shard) freeCaches(wait time.Duration) {
	deadline := time.Now().Add(wait)
	kept := s.deadCaches[:0]
	for _, c := range s.deadCaches {
		for c.readers.Load() != 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond) // a lookup copying from it: microseconds
		}
		if c.readers.Load() == 0 {
			c.free()
		} else {
			kept = append(kept, c)
		}
	}
	clear(s.deadCaches[len(kept):])
	s.deadCaches = kept
}

// quietAfter is how long a served partition not asked keeps its value
// cache in the room the partitions asked leave them (maintainCaches).
const quietAfter = 30 * time.Second

// idleAfter is how long without a lookup a table served from disk keeps
// its value cache (or 3 HotIntervals, if longer): a standby version's,
// or a retired one's, gives its memory to those serving.
const idleAfter = 2 * time.Second

// maintainCaches sizes and feeds the value cache of every partition
// served from disk that lookups asked lately (idleAfter) of a version
// served (live or canary; one not asked keeps its cache for quietAfter
// in the room the others leave, and all keep theirs while none is
// asked), sharing what the budget leaves after the
// resident tables and the warm caches of staged versions (warm.go). A
// table of another version asked lately (the version a rollout or a
// rollback replaced, whose last lookups are still counted, or one a
// pinned request asks) keeps its cache while the budget has room beside
// the served ones', and gets none: it must not halve their shares. A
// cache is made once and kept while its share holds, and grows, keeping what it holds, while twice
// its size fits its share and the budget's room; one over its share is
// dropped (and its memory given back once no lookup reads it) before
// another is made, so caches never take more than the budget.
//
// It costs the tables served from disk (onDisk) and the samples, not
// everything held: a shard with none on disk does nothing.
func (s *Shard) maintainCaches(ctx context.Context) {
	if len(s.onDisk) == 0 && len(s.deadCaches) == 0 && s.residentHot.Load() == 0 {
		s.served = nil // nothing on disk: keeps no retired table reachable
		return
	}
	heard := s.heard.group(s.samples)
	defer s.heard.release()
	staged, served := s.stagedTables(), s.servedTables()
	wasServed := s.served
	s.served = served
	standby := s.standbyPairs(served)
	kept := map[*Table]bool{}
	for _, pr := range standby {
		kept[pr.to] = true
	}
	var active, lingering, quiet, idle []*Table
	var warm int64 // the warm caches of staged versions: kept, not shared
	now := time.Now()
	for t := range s.onDisk {
		// A cache that has gone live since the last tick (a staged
		// version's, warmed; a standby's, rolled back to) counts as
		// asked: a drain may hold none of its lookups yet (a shard of
		// hundreds of partitions samples each only now and then), and a
		// cache idle since its load would be dropped, cold, at the first
		// tick after the commit.
		if len(heard[t]) > 0 || served[t] && !wasServed[t] && t.cache.Load() != nil {
			t.heardAt = now
		}
		if served[t] {
			t.standbyFrom, t.standbyAt, t.standbyPlan = 0, time.Time{}, nil // warmed afresh once it stands by again
		}
		recent := now.Sub(t.heardAt) <= max(idleAfter, 3*s.opts.HotInterval)
		switch c := t.cache.Load(); {
		case recent && s.opts.MemoryBudget > 0 && served[t]:
			active = append(active, t)
		case kept[t] && s.opts.MemoryBudget > 0:
			// keepStandby's
		case staged[t] && c != nil && s.opts.MemoryBudget > 0:
			warm += c.Bytes()
		case recent && s.opts.MemoryBudget > 0 && c != nil:
			lingering = append(lingering, t)
		case served[t] && s.opts.MemoryBudget > 0 && c != nil:
			quiet = append(quiet, t)
		default:
			idle = append(idle, t)
		}
	}
	for _, t := range idle {
		s.dropCache(t)
	}
	if len(active) == 0 {
		for _, t := range lingering {
			s.dropCache(t)
		}
		for _, pr := range standby {
			s.dropCache(pr.to) // its room kept for the served caches, kept as they are
		}
		// No partition asked lately: those served keep what their caches
		// learned for the next lookups (traffic that comes in bursts),
		// as none needs the room, while the budget holds them.
		total := warm
		for _, t := range quiet {
			t.abandonGrowth()
			if c := t.cache.Load(); s.residentBytes(false)+total+c.Bytes() <= s.opts.MemoryBudget {
				total += c.Bytes()
			} else {
				s.dropCache(t)
			}
		}
		s.freeCaches(reclaimWait)
		s.residentHot.Store(total)
		return
	}
	share := (s.opts.MemoryBudget - s.residentBytes(false) - warm) / int64(len(active))
	for _, t := range active {
		if c := t.cache.Load(); c != nil && c.Bytes() > share {
			s.dropCache(t)
		}
	}
	// Served partitions not asked lately keep their caches for
	// quietAfter in the room the asked ones leave (a cache to be made
	// counted at its share), ahead of the standby's: the first tick of
	// a burst may hear only some of the partitions it goes on to ask.
	// The asked ones grow into that room once they are dropped.
	reserved := s.residentBytes(false) + warm
	for _, t := range active {
		if c := t.cache.Load(); c != nil {
			reserved += c.Bytes()
		} else {
			reserved += share
		}
	}
	var quietBytes int64
	for _, t := range quiet {
		if c := t.cache.Load(); now.Sub(t.heardAt) <= quietAfter && reserved+quietBytes+c.Bytes() <= s.opts.MemoryBudget {
			t.abandonGrowth()
			quietBytes += c.Bytes()
		} else {
			s.dropCache(t)
		}
	}
	// Caches are made only once those dropped are freed: the budget
	// holds them all.
	if s.freeCaches(reclaimWait); len(s.deadCaches) > 0 {
		return
	}
	total := warm
	var growing int64 // what the live caches will take to grow, below
	for _, t := range active {
		if t.cache.Load() == nil {
			if c := newValueCache(share, t.vlen, t.n); c != nil {
				t.cache.Store(c)
			}
		}
		if c := t.cache.Load(); c != nil {
			total += c.Bytes()
			if b := cacheFit(share, t.vlen, t.n); b >= 2*c.Bytes() {
				growing += b
			}
		}
	}
	total += quietBytes
	total = s.keepStandby(ctx, standby, total, growing)
	for _, t := range lingering {
		if c := t.cache.Load(); s.residentBytes(false)+total+c.Bytes() <= s.opts.MemoryBudget {
			total += c.Bytes()
		} else {
			s.dropCache(t)
		}
	}
	// Grow caches made small (warmed beside the live ones, or made when
	// more partitions shared the budget), while the budget holds the old
	// beside the new until the old is freed; growSlots of copying a tick
	// (grow).
	slots := growSlots
	for _, t := range active {
		if c := t.cache.Load(); c != nil {
			room := s.opts.MemoryBudget - s.residentBytes(false) - total
			total += s.grow(t, c, min(share, room), &slots)
		}
	}
	s.residentHot.Store(total)
	for _, t := range active {
		t.learn(ctx, s.cold, heard[t])
	}
}

// EnableCache gives a table served from disk a value cache of at most
// bytes, as a shard's loader does, and a sample ring of its own; tools
// and benchmarks use it with Learn, not on a table a shard serves. It
// reports whether one fits.
func (t *Table) EnableCache(bytes int64) bool {
	if !t.Mapped {
		return false
	}
	if t.sample == nil {
		t.sample = new(sampler)
	}
	c := newValueCache(bytes, t.vlen, t.n)
	if old := t.cache.Swap(c); old != nil {
		old.free() // tools' use: no lookup under way
	}
	return c != nil
}

// Learn feeds the keys sampled since the last call to t's value cache,
// as the shard's loader does every HotInterval. Call it often: t keeps
// only the last 131,072 samples between calls. For tools: a table a
// shard loaded shares its samples with the shard's other tables.
func (t *Table) Learn() {
	var keys []uint64
	t.sample.drain(func(_ *Table, key uint64) { keys = append(keys, key) })
	t.learn(context.Background(), nil, keys)
}

// ResidentBytes is the table's resident memory: all of it, or for a
// table served from disk its directory, value cache apart.
func (t *Table) ResidentBytes() int64 {
	if t.Mapped {
		return int64(len(t.dir))
	}
	return t.size
}

// CacheBytes is the memory of t's value cache, if it has one.
func (t *Table) CacheBytes() int64 {
	if c := t.cache.Load(); c != nil {
		return c.Bytes()
	}
	return 0
}

// CachedKeys is how many keys t's value cache holds.
func (t *Table) CachedKeys() int {
	if c := t.cache.Load(); c != nil {
		return c.Len()
	}
	return 0
}
