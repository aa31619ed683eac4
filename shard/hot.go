package shard

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
)

// A partition served from disk learns its hot keys from traffic: lookups
// sample the keys they ask of it into a lock-free ring (sampler), and
// the shard's loader drains the samples every HotInterval into the
// table's value cache (cache.go), which admits a key by frequency. Keys
// are the unit cached, not pages: records are placed by hash, so the hot
// keys of Zipf traffic are spread over every page, and caching a third
// of the pages keeps a third of the hot keys.

const (
	sampleEvery = 2       // one lookup key in 2 is sampled
	sampleRing  = 1 << 16 // samples held between drains
)

// sampler is a lock-free ring of sampled keys. Writers race benignly:
// a sample overwritten before it is drained is simply lost.
type sampler struct {
	ring  [sampleRing]atomic.Uint64
	pos   atomic.Uint64
	calls atomic.Uint64
	read  uint64 // drain position; drain's goroutine only
}

// Sample records some of keys if t is served from a mapped file, for
// its value cache. It allocates nothing and takes no lock.
func (t *Table) Sample(keys []uint64) {
	s := t.sample
	if s == nil {
		return
	}
	// The first key sampled moves from call to call: a fixed stride from
	// 0 would see only the same positions of a repeated key order.
	for j := int(s.calls.Add(1) % sampleEvery); j < len(keys); j += sampleEvery {
		s.ring[(s.pos.Add(1)-1)%sampleRing].Store(keys[j])
	}
}

// drain calls fn on each key sampled since the last drain.
func (s *sampler) drain(fn func(key uint64)) {
	end := s.pos.Load()
	for i := max(s.read, end-min(end, sampleRing)); i < end; i++ {
		fn(s.ring[i%sampleRing].Load())
	}
	s.read = end
}

// learn drains t's samples into its cache: each counts in the cache's
// sketch, and those the cache lacks and admits are read (with r's
// turns) and cached. keys is scratch, returned for reuse. The loader's
// only (one goroutine a table).
func (t *Table) learn(ctx context.Context, r *ColdReads, keys []uint64) []uint64 {
	c := t.cache.Load()
	if c == nil || t.sample == nil {
		return keys
	}
	keys = keys[:0]
	t.sample.drain(func(key uint64) {
		h := codec.KeyHash(key)
		c.freq.add(h)
		if !c.has(h) && c.admits(h) >= 0 {
			keys = append(keys, key)
		}
	})
	if len(keys) == 0 {
		return keys
	}
	// Read each key once, admitted or not by then (a key sampled twice,
	// or two keys wanting one slot).
	vals := make([]byte, len(keys)*t.vlen)
	out := make([]int32, len(keys))
	if _, err := t.readCold(ctx, keys, out, vals, nil, r); err != nil {
		return keys
	}
	for q, k := range keys {
		h := codec.KeyHash(k)
		if out[q] < 0 || c.has(h) {
			continue
		}
		if i := c.admits(h); i >= 0 {
			c.put(i, h, vals[q*t.vlen:(q+1)*t.vlen])
		}
	}
	return keys
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
func (s *Shard) dropCache(t *Table) {
	if c := t.cache.Swap(nil); c != nil {
		s.deadCaches = append(s.deadCaches, c)
		s.freeCaches(reclaimWait)
	}
}

// freeCaches frees the dropped caches no lookup reads, waiting up to
// wait for those read; the others are freed on a later call.
func (s *Shard) freeCaches(wait time.Duration) {
	deadline := time.Now().Add(wait)
	kept := s.deadCaches[:0]
	for _, c := range s.deadCaches {
		for c.readers.Load() != 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
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

// maintainCaches sizes and feeds the value cache of every partition
// served from disk, sharing what the budget leaves after the resident
// tables. A cache is made once and kept while its share holds; one over
// its share is dropped (and its memory given back) before another is
// made, so caches never take more than the budget, even for a moment.
func (s *Shard) maintainCaches(ctx context.Context) {
	snap := s.snap.Load()
	var bases []*Table
	snap.tables(func(t *Table) {
		if t.Mapped && t.sample != nil {
			bases = append(bases, t)
		}
	})
	if len(bases) == 0 || s.opts.MemoryBudget == 0 {
		s.residentHot.Store(0)
		return
	}
	share := (s.opts.MemoryBudget - s.residentBytes(false)) / int64(len(bases))
	for _, b := range bases {
		if c := b.cache.Load(); c != nil && c.Bytes() > share {
			s.dropCache(b)
		}
	}
	s.freeCaches(0)
	var total int64
	for _, b := range bases {
		if b.cache.Load() == nil {
			if c := newValueCache(share, b.vlen, b.n); c != nil {
				b.cache.Store(c)
			}
		}
		if c := b.cache.Load(); c != nil {
			total += c.Bytes()
		}
	}
	s.residentHot.Store(total)
	for _, b := range bases {
		s.learnKeys = b.learn(ctx, s.cold, s.learnKeys)
	}
}

// EnableCache gives a table served from disk a value cache of at most
// bytes, as a shard's loader does; tools and benchmarks use it with
// Learn. It reports whether one fits.
func (t *Table) EnableCache(bytes int64) bool {
	if t.sample == nil {
		return false
	}
	c := newValueCache(bytes, t.vlen, t.n)
	if old := t.cache.Swap(c); old != nil {
		old.free() // tools' use: no lookup under way
	}
	return c != nil
}

// Learn feeds the keys sampled since the last call to t's value cache,
// as the shard's loader does every HotInterval. Call it often: t keeps
// only the last 65,536 samples between calls.
func (t *Table) Learn() { t.learn(context.Background(), nil, nil) }

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
