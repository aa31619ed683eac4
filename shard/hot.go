package shard

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
)

// A partition served from a mapped file keeps its hottest records in a
// small resident table — the hot tier — learned from traffic. Pages are
// the wrong unit to cache: records are placed by hash, so the hot keys of
// Zipf traffic are spread over every page, and caching a third of the
// pages keeps a third of the hot keys. The hot tier keeps exactly the hot
// keys, 12 bytes each for LR.

const (
	sampleEvery = 8       // one lookup key in 8 is sampled
	sampleRing  = 1 << 16 // samples held between drains
)

// sampler is a lock-free ring of sampled keys. Writers race benignly:
// a sample overwritten before it is drained is simply lost.
type sampler struct {
	ring [sampleRing]atomic.Uint64
	pos  atomic.Uint64
	read uint64 // drain position; drain's goroutine only
}

// Sample records some of keys if t is served from a mapped file, for
// the hot tier. It allocates nothing and takes no lock.
func (t *Table) Sample(keys []uint64) {
	s := t.sample
	if s == nil {
		return
	}
	// The first key sampled moves from call to call: a fixed stride from
	// 0 would see only the same positions of a repeated key order.
	for j := int(s.pos.Load() % sampleEvery); j < len(keys); j += sampleEvery {
		s.ring[(s.pos.Add(1)-1)%sampleRing].Store(keys[j])
	}
}

// drain adds the samples taken since the last drain to counts and
// returns how many there were.
func (s *sampler) drain(counts map[uint64]uint32) int {
	end := s.pos.Load()
	start := max(s.read, end-min(end, sampleRing))
	for i := start; i < end; i++ {
		counts[s.ring[i%sampleRing].Load()]++
	}
	s.read = end
	return int(end - start)
}

// heat is what the hot tier knows of one base's traffic.
type heat struct {
	counts     map[uint64]uint32
	sinceDecay int // samples since counts were last halved
	sinceBuild int // samples since the hot tier was last built
}

// add drains new samples. Old traffic fades by traffic, not by time: the
// counts are halved whenever as many samples have arrived as there are
// keys counted, so a quiet shard does not forget its hot set.
func (h *heat) add(s *sampler) {
	n := s.drain(h.counts)
	h.sinceDecay += n
	h.sinceBuild += n
	if h.sinceDecay > max(len(h.counts), sampleRing) {
		for key, c := range h.counts {
			if c /= 2; c == 0 {
				delete(h.counts, key)
			} else {
				h.counts[key] = c
			}
		}
		h.sinceDecay = 0
	}
}

// hotKeys returns up to k keys of counts, most frequent first.
func hotKeys(counts map[uint64]uint32, k int) []uint64 {
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b uint64) int {
		return cmp.Compare(counts[b], counts[a]) // most frequent first
	})
	return keys[:min(k, len(keys))]
}

// BuildHot makes a resident table of base's records for keys (those base
// holds), in base's format. It reads base, so for a mapped base it faults
// pages in: call it off the request path.
func BuildHot(base *Table, keys []uint64) (*Table, error) {
	idx := make([]int32, len(keys))
	base.Find(keys, idx)
	var ks []uint64
	var vals []float32
	v := make([]float32, base.width)
	for j, r := range idx {
		if r < 0 {
			continue
		}
		base.Decode(int(r), v)
		ks = append(ks, keys[j])
		vals = append(vals, v...)
	}
	hot, err := ResidentTable(base.width, base.enc, ks, vals)
	if err != nil {
		return nil, fmt.Errorf("shard: building the hot tier: %w", err)
	}
	hot.hotOf = base
	return hot, nil
}

// hotState is the hot tier's bookkeeping: the loader goroutine's only.
type hotState struct {
	heat map[*Table]*heat
}

// maintainHot drains samples and rebuilds the hot tier of every mapped
// base, sharing what the budget leaves after the resident tables.
func (s *Shard) maintainHot() {
	snap := s.snap.Load()
	var bases []*Table
	snap.tables(func(t *Table) {
		if t.Mapped {
			bases = append(bases, t)
		}
	})
	if len(bases) == 0 || s.opts.MemoryBudget == 0 {
		s.hot.heat = nil
		return
	}
	if s.hot.heat == nil {
		s.hot.heat = map[*Table]*heat{}
	}
	live := map[*Table]bool{}
	for _, b := range bases {
		live[b] = true
		if s.hot.heat[b] == nil {
			s.hot.heat[b] = &heat{counts: map[uint64]uint32{}}
		}
		s.hot.heat[b].add(b.sample)
	}
	for b := range s.hot.heat {
		if !live[b] {
			delete(s.hot.heat, b) // its version is gone
		}
	}
	share := (s.opts.MemoryBudget - s.residentBytes(false)) / int64(len(bases))
	rebuilt := false
	for _, b := range bases {
		h := s.hot.heat[b]
		k := int(share / b.recordBytes())
		if k <= 0 || h.sinceBuild == 0 {
			continue // no room, or nothing new to learn from
		}
		h.sinceBuild = 0
		hot, err := BuildHot(b, hotKeys(h.counts, k))
		if err != nil {
			slog.Warn("shard: hot tier not rebuilt", "shard", s.opts.ID, "err", err)
			continue
		}
		s.install(s.snap.Load().withHot(b, hot))
		rebuilt = true
	}
	if rebuilt {
		s.reclaim(reclaimWait) // the replaced hot tiers go now
	}
}

// Heat learns one mapped table's hot keys from the traffic sampled on
// it, as the shard's loader does; tools and benchmarks use it directly.
type Heat struct{ h heat }

// Observe drains base's samples. Call it often: base keeps only the last
// 65,536 samples between calls.
func (h *Heat) Observe(base *Table) {
	if h.h.counts == nil {
		h.h.counts = map[uint64]uint32{}
	}
	if base.sample != nil {
		h.h.add(base.sample)
	}
}

// Build makes a hot tier of the hottest records of base that fit in bytes.
func (h *Heat) Build(base *Table, bytes int64) (*Table, error) {
	if base.sample == nil {
		return nil, fmt.Errorf("shard: table is not mapped; it has no hot tier")
	}
	return BuildHot(base, hotKeys(h.h.counts, int(bytes/base.recordBytes())))
}
