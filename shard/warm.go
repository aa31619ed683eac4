package shard

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// A new version of a model served from disk would go live with empty
// value caches, and serve every key from disk until they learned the
// hot ones again: seconds of a tail many times the steady one. So a
// version staged beside the live one is warmed first: for each of its
// partitions served from disk, the keys the live version's cache of
// that partition holds are read from the new file, most asked first, into
// a cache of the staged table, which the sketch's counts follow. The
// shard reports the staged version as held only once that is done (or
// warmTimeout passed), so the manager commits it warm.
//
// A warm cache takes the budget's room beside the live caches; where
// there is not room for both at their size, each live cache keeps its
// most asked half (resized in memory, nothing read) and the staged one
// gets the other half's room, filled with the most asked keys. Once
// live, a cache smaller than its share grows (maintainCaches), keeping
// what it holds. A delta staged on the
// live version's base shares its tables, and so its caches: nothing to
// warm.

// warmTimeout bounds how long warming a staged version may hold its
// report back: a slow disk delays a rollout by at most this.
const warmTimeout = 20 * time.Second

// warmChunk is the most asked keys warmLive reads into each cache
// first, before the others.
const warmChunk = 2048

// warmPair is a partition of a staged version to warm: its base table
// served from disk (to), the live version's (from), which has a cache.
type warmPair struct {
	p        int
	to, from *Table
}

// toWarm is the partitions of model name's staged version (in a) not yet
// warmed. Loader goroutine only.
func (s *Shard) toWarm(sn *snapshot, name string, a topo.Assignment) []warmPair {
	if s.opts.MemoryBudget == 0 || a.Staged == 0 || a.Live == 0 {
		return nil
	}
	sv, lv := sn.get(name, a.Staged), sn.get(name, a.Live)
	if sv == nil || lv == nil {
		return nil
	}
	var pairs []warmPair
	for p, l := range sv.layers {
		if p >= len(lv.layers) || len(l) == 0 || len(lv.layers[p]) == 0 {
			continue
		}
		to, from := l[len(l)-1], lv.layers[p][len(lv.layers[p])-1]
		if to != from && to.Mapped && !to.warmed && to.cache.Load() == nil && from.cache.Load() != nil {
			pairs = append(pairs, warmPair{p, to, from})
		}
	}
	return pairs
}

// warmStaged warms the caches of the versions as stages beside their live
// ones. Loader goroutine only.
func (s *Shard) warmStaged(ctx context.Context, as map[string]topo.Assignment) {
	var pairs []warmPair
	sn := s.snap.Load()
	for _, name := range slices.Sorted(maps.Keys(as)) {
		pairs = append(pairs, s.toWarm(sn, name, as[name])...)
	}
	if len(pairs) == 0 {
		return
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	// The room is the staged caches' first: the caches of versions not
	// served go (the newest standby's, kept for a rollback the rollout
	// is about to make moot), but for those already warmed as staged.
	served, staged := s.servedTables(), s.stagedTables()
	s.dropCachesBut(func(t *Table) bool { return served[t] || staged[t] })
	var want int64 // caches the size of the live ones
	for _, pr := range pairs {
		want += pr.from.cache.Load().Bytes()
	}
	halve := s.opts.MemoryBudget-s.residentBytes(true)-s.unplaced < want
	keys := 0
	for i, pr := range pairs {
		if s.superseded(ctx) {
			break // a newer map (a rollback, say) first
		}
		pr.to.warmed = true // once: a version staged long is not read again every map
		from := pr.from.cache.Load()
		size := from.Bytes()
		if halve {
			// No room for both: the live cache keeps its most asked
			// half, the staged one gets the other half's room. The live
			// one's old memory goes before the staged one's comes.
			size /= 2
			if b := s.resize(pr.from, from, size); b > 0 {
				s.freeCaches(reclaimWait)
				s.residentHot.Add(b - from.Bytes())
			}
		}
		room := s.opts.MemoryBudget - s.residentBytes(true) - s.unplaced
		c := newValueCache(min(size, room/int64(len(pairs)-i)), pr.to.vlen, pr.to.n)
		if c == nil {
			continue
		}
		// In turn with the process's other shards' loads and warming
		// (cumulus dev's: they share its cores with the lookups). The
		// wait counts in warmTimeout: past it, the partition goes live
		// as cold as it is, as one whose reads were cut short does.
		if done, err := s.turn(wctx); err == nil {
			keys += pr.to.fill(wctx, c, hotKeys(pr.from.cache.Load()), s.cold)
			done()
		}
		pr.to.cache.Store(c)
		s.residentHot.Add(c.Bytes())
	}
	slog.Info("shard: warmed the value caches of a staged version", "shard", s.opts.ID, "partitions", len(pairs),
		"keys", keys, "took", time.Since(start).Round(time.Millisecond), "complete", wctx.Err() == nil)
}

// hotKey is a key a cache holds, with how often its sketch says it was
// asked for.
type hotKey struct {
	h uint64
	f int
}

// hotKeys is the keys c holds, most asked first (those lookups offer
// meanwhile may be missed). The loader's only.
func hotKeys(c *valueCache) []hotKey {
	var hs []hotKey
	for i := range c.hs {
		if h := c.hs[i].Load(); h != 0 {
			hs = append(hs, hotKey{h, c.freq.estimate(h)})
		}
	}
	slices.SortFunc(hs, func(a, b hotKey) int { return cmp.Compare(b.f, a.f) })
	return hs
}

// fill reads into c, from t's file, the keys of hs (hotKeys), in turn,
// as many as c has slots, and counts each in c's sketch as often as hs
// says. It returns how many it cached; what was read before ctx ended is
// kept. The loader's only.
func (t *Table) fill(ctx context.Context, c *valueCache, hs []hotKey, r *ColdReads) int {
	hs = hs[:min(len(hs), len(c.hs))]
	// What c holds already (a cache warmed again, or grown) is counted,
	// not read again.
	want := make([]hotKey, 0, len(hs))
	for _, k := range hs {
		if c.has(k.h) {
			c.freq.addTimes(k.h, k.f)
		} else {
			want = append(want, k)
		}
	}
	ids := make([]uint64, len(want))
	for i, k := range want {
		ids[i] = codec.KeyUnhash(k.h)
	}
	vals := make([]byte, len(ids)*t.vlen)
	out := make([]int32, len(ids))
	t.readSpans(ctx, ids, out, vals, r) // what was read before an error is kept
	n := 0
	for q, k := range want {
		c.freq.addTimes(k.h, k.f)
		if out[q] < 0 || c.has(k.h) {
			continue // not in the new version, not read in time, or offered by a lookup meanwhile (the cache may be in use)
		}
		if i := c.admits(k.h); i >= 0 {
			c.put(i, k.h, vals[q*t.vlen:(q+1)*t.vlen])
			n++
		}
	}
	return n
}

// warmLive gives each partition of a live version served from disk
// whose value cache is missing (or a quarter as full) one warmed from
// the cache another version of the model held for that partition, one
// neither live, canary nor staged. That is a rollback's case: the version rolled
// back to stood by, its caches given back (idleAfter), and goes live at
// once, so it cannot be warmed before its commit. The keys the version
// live until then was asked for are read from the new live version's
// files instead, in a fraction of a second rather than the seconds
// learning them again takes, and the old version's cache, asked no more,
// gives up its room first. Loader goroutine only.
func (s *Shard) warmLive(ctx context.Context, as map[string]topo.Assignment) {
	if s.opts.MemoryBudget == 0 {
		return
	}
	sn := s.snap.Load()
	var pairs []warmPair
	for _, name := range slices.Sorted(maps.Keys(as)) {
		a := as[name]
		lv := sn.get(name, a.Live)
		if lv == nil {
			continue
		}
		for p, l := range lv.layers {
			if len(l) == 0 || !l[len(l)-1].Mapped {
				continue
			}
			to, from, most := l[len(l)-1], (*Table)(nil), 0
			for v, ver := range sn.models[name] {
				if v == a.Live || v == a.Canary || v == a.Staged || p >= len(ver.layers) || len(ver.layers[p]) == 0 {
					continue
				}
				t := ver.layers[p][len(ver.layers[p])-1]
				if c := t.cache.Load(); t != to && c != nil && c.Len() > most {
					from, most = t, c.Len()
				}
			}
			if c := to.cache.Load(); from != nil && (c == nil || c.Len() < most/4) {
				pairs = append(pairs, warmPair{p, to, from})
			}
		}
	}
	if len(pairs) == 0 {
		return
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	// The old caches go first, then each new one is made and put in
	// use empty, and filled in two turns: every partition's warmChunk
	// most asked keys first, so that they are hits within milliseconds of
	// the commit, then the rest (read in spans of the file: readSpans).
	type filling struct {
		to   *Table
		c    *valueCache
		hot  []hotKey
		size int64 // the old cache's
	}
	fills := make([]filling, 0, len(pairs))
	for _, pr := range pairs {
		from := pr.from.cache.Load()
		fills = append(fills, filling{to: pr.to, hot: hotKeys(from), size: from.Bytes()})
		s.dropCache(pr.from)
		s.residentHot.Add(-from.Bytes()) // freed, or in deadCaches: maintainCaches makes no cache while any is
	}
	s.freeCaches(reclaimWait)
	room := s.opts.MemoryBudget - s.residentBytes(true) - s.unplaced
	for _, c := range s.deadCaches {
		room -= c.Bytes()
	}
	for i := range fills {
		f := &fills[i]
		size := min(f.size, room/int64(len(fills)-i))
		if old := f.to.cache.Load(); old != nil {
			// Its cache as the newest standby: grown, keeping what it
			// holds (it took only room the live cache left, so both fit).
			if b := s.resize(f.to, old, size); b > 0 {
				room -= b
				s.residentHot.Add(b)
			}
			f.c = f.to.cache.Load()
		} else if f.c = newValueCache(size, f.to.vlen, f.to.n); f.c != nil {
			room -= f.c.Bytes()
			f.to.cache.Store(f.c)
			s.residentHot.Add(f.c.Bytes())
		}
		if f.c == nil {
			continue
		}
		f.hot = f.hot[:min(len(f.hot), len(f.c.hs))]
		f.to.heardAt = time.Now() // live: not idle before its first lookups are counted
	}
	keys := 0
	for _, turn := range [][2]int{{0, warmChunk}, {warmChunk, math.MaxInt}} {
		for _, f := range fills {
			if lo, hi := min(turn[0], len(f.hot)), min(turn[1], len(f.hot)); f.c != nil && lo < hi && wctx.Err() == nil {
				keys += f.to.fill(wctx, f.c, f.hot[lo:hi], s.cold)
			}
		}
	}
	slog.Info("shard: warmed the value caches of a version gone live cold (a rollback)", "shard", s.opts.ID,
		"partitions", len(pairs), "keys", keys, "took", time.Since(start).Round(time.Millisecond), "complete", wctx.Err() == nil)
}

// growSlots bounds the slots a tick copies into larger caches (grow): a
// quarter of a million, about 2ms at BenchmarkGrow's pace. A live cache
// grows at every switch to a version that stood by (a rollback, or a
// rollout's staged version, warmed in the room the live cache left it):
// copied whole in a tick, before copyGrown, that took 16–48ms of every
// shard's loader at the switch on 2 cores (bench rollback, 16
// partitions), a burst the lookups waited behind. A bound in slots, not
// in time: on a busy machine the loader's time passes waiting for a
// core and faulting in new pages, and a growth bounded by it took 8
// ticks over what the benchmark copies in a few milliseconds.
const growSlots = 1 << 18

// growth is a larger copy of cache from being made for its table: to
// holds from's slots before next. Nothing reads to until it is done and
// takes from's place.
type growth struct {
	from, to *valueCache
	next     int
}

// grow replaces t's cache c by a larger one of at most bytes if one of
// twice c's size fits, as resize does, but copying c's slots over ticks,
// as many a call as *slots allows (taken from it), c serving meanwhile
// (what it admits once its slots are copied is not carried over:
// learning admits it again). It returns the bytes of the new cache,
// done or in the making, or 0. Loader goroutine only.
func (s *Shard) grow(t *Table, c *valueCache, bytes int64, slots *int) int64 {
	if g := t.growth; g != nil && (g.from != c || g.to.Bytes() > bytes) {
		t.abandonGrowth() // c was replaced, or the room shrank
	}
	if t.growth == nil {
		if *slots == 0 || cacheBytes(2*int(c.mask+1), c.vlen) > bytes {
			return 0 // (no copying left this tick: none begun, to sit idle)
		}
		g := resized(t, c, bytes)
		if g == nil {
			return 0
		}
		t.growth = &growth{from: c, to: g}
	}
	g := t.growth
	n := min(*slots, len(c.hs)-g.next)
	*slots -= n
	if g.next = copySlots(g.to, c, g.next, n); g.next < len(c.hs) {
		return g.to.Bytes()
	}
	t.growth = nil
	return s.replaceCache(t, c, g.to)
}

// copyGrown is copySlots into a cache of as many sets or more. Sets are
// a power of two and a key's set is the low bits of its h, so each of
// c's sets spreads over sets of g that take keys from no other: a key
// goes to the first empty slot of its set, with no eviction to weigh
// and no count to read, c's slots read in order. c's sketch is carried
// over whole once the last slot is copied (sketch.spreadFrom). A copy
// of a million slots, its new cache's pages in memory, took 7ms this
// way against 59ms for copyAdmitting (BenchmarkGrow, 2 cores).
func copyGrown(g, c *valueCache, from, n int) int {
	placed := 0
	for i := from; i < from+n; i++ {
		h := c.hs[i].Load()
		if h == 0 {
			continue
		}
		for j, end := g.set(h), g.set(h)+cacheWays; j < end; j++ {
			if g.hs[j].Load() == 0 {
				if g.copySlot(j, c, i, h) {
					placed++
				}
				break
			}
		}
	}
	g.n.Add(int64(placed))
	if from+n == len(c.hs) {
		g.freq.spreadFrom(&c.freq)
	}
	return from + n
}

// abandonGrowth frees the cache grow was making for t, if any: nothing
// has read it. Loader goroutine only.
func (t *Table) abandonGrowth() {
	if t.growth != nil {
		t.growth.to.free()
		t.growth = nil
	}
}

// growthBytes is the memory of the cache grow is making for t.
func (t *Table) growthBytes() int64 {
	if t.growth == nil {
		return 0
	}
	return t.growth.to.Bytes()
}

// copySlots puts into g what it admits of c's n slots from slot from on,
// with their sketch counts, read from c (which lookups may be writing);
// it returns the first slot not copied.
func copySlots(g, c *valueCache, from, n int) int {
	if g.mask >= c.mask {
		return copyGrown(g, c, from, n)
	}
	return copyAdmitting(g, c, from, n)
}

// copyAdmitting is copySlots into a cache of any size: g weighs each key
// by its count, carried over, against those its set holds.
func copyAdmitting(g, c *valueCache, from, n int) int {
	val := make([]byte, c.vlen)
	for i := from; i < from+n; i++ {
		h := c.hs[i].Load()
		if h == 0 || !c.get(h, val) {
			continue
		}
		g.freq.addTimes(h, c.freq.estimate(h))
		if j := g.admits(h); j >= 0 {
			g.put(j, h, val)
		}
	}
	return from + n
}

// resize replaces t's cache c by the largest of at most bytes, larger or
// smaller, holding what of c's keys it admits (the most asked, where
// smaller: c's sketch counts come along), read from c, not the disk; c
// is dropped. It returns the new cache's bytes, or 0 (c kept) if that
// would be c's size or no cache fits. Loader goroutine only.
func (s *Shard) resize(t *Table, c *valueCache, bytes int64) int64 {
	g := resized(t, c, bytes)
	if g == nil {
		return 0
	}
	copySlots(g, c, 0, len(c.hs))
	return s.replaceCache(t, c, g)
}

// resized is an empty cache for t of at most bytes, or nil if none fits
// or it would be c's size.
func resized(t *Table, c *valueCache, bytes int64) *valueCache {
	g := newValueCache(bytes, t.vlen, t.n)
	if g != nil && g.Bytes() == c.Bytes() {
		g.free()
		return nil
	}
	return g
}

// replaceCache makes g, filled from c, t's cache in c's place, and
// returns its bytes; c is freed once no lookup reads it (freeCaches).
func (s *Shard) replaceCache(t *Table, c, g *valueCache) int64 {
	t.cache.Store(g)
	s.deadCaches = append(s.deadCaches, c)
	return g.Bytes()
}

// A rollback makes the newest standby version live at once. Served
// from disk with no cache, it answered from disk until warmLive had
// read its hot keys again: on a loaded shard, a few hundred milliseconds
// of a tail tens of times the steady one, and of refused requests. So
// the newest standby version keeps a cache too, in the room the live
// caches leave: a cache's sets are a power of two, so a share leaves up
// to half of itself unused. Once the live caches are made and grown, it
// is warmed, as a staged version is, from the live cache's hot keys
// read from its own file, and it is kept while that room holds it; it
// never takes room the live caches would grow into. Rolled back to, a
// version whose cache holds what the replaced one's did is not warmed
// again (warmLive), and one that holds less keeps what it holds.

// standbyPairs is, for each model's newest standby version (none while
// the model has a version staged), its
// partitions served from disk that no served version shares (a delta's
// base is its standby's too), each with the live version's table of the
// partition, whose cache it is warmed from. Loader goroutine only.
func (s *Shard) standbyPairs(served map[*Table]bool) []warmPair {
	var pairs []warmPair
	sn := s.snap.Load()
	for _, name := range slices.Sorted(maps.Keys(s.cur)) {
		a := s.cur[name]
		if len(a.Standby) == 0 || a.Live == 0 || a.Staged != 0 {
			continue // (a rollout's staged version warms in the room: once committed, the live one stands by instead)
		}
		sv, lv := sn.get(name, a.Standby[0]), sn.get(name, a.Live)
		if sv == nil || lv == nil {
			continue
		}
		for p, l := range sv.layers {
			if p >= len(lv.layers) || len(l) == 0 || len(lv.layers[p]) == 0 {
				continue
			}
			if to := l[len(l)-1]; to.Mapped && !served[to] {
				pairs = append(pairs, warmPair{p, to, lv.layers[p][len(lv.layers[p])-1]})
			}
		}
	}
	return pairs
}

// Warming a standby cache is background work, spread over ticks rather
// than taking the loader, the disk and the CPU for a few hundred
// milliseconds at once (measured: that refused requests after every
// rollout): keepStandby reads for standbyWork a tick, a shard, in
// chunks of standbyChunk keys in file order, so that its reads still
// come in spans, and standbyReaders at a time. A read of a file in the
// page cache is a copy in the kernel, unseen by the Go scheduler: with
// the lookups' 64 readers (s.cold), a tick's 10ms of warming could take
// every core for those 10ms. Measured with bench rollback at 16
// partitions on 2 cores (docs/storage.md): requests over 20ms between
// switches, 1.7–2.5% of them with 64 readers, 1.0–1.6% with one.
const (
	standbyWork    = 10 * time.Millisecond
	standbyChunk   = 1024
	standbyEvery   = 10 // HotIntervals between warmings of one standby cache
	standbyReaders = 1
)

// keepStandby keeps the caches of the newest standby versions' tables
// (standbyPairs) in the room the budget leaves beside total bytes of
// caches and growing bytes the live ones are about to take, and warms
// one where the room has come (the live caches grown and what they
// replaced freed), for at most standbyWork a tick. Each table keeps its
// part of the room or nothing. It returns total with the caches it
// kept. Loader goroutine only.
func (s *Shard) keepStandby(ctx context.Context, pairs []warmPair, total, growing int64) int64 {
	room := s.opts.MemoryBudget - s.residentBytes(false) - total - growing
	settled := growing == 0 && len(s.deadCaches) == 0
	until := time.Now().Add(standbyWork)
	for i, pr := range pairs {
		part := room / int64(len(pairs)-i)
		c := pr.to.cache.Load()
		switch from := pr.from.cache.Load(); {
		case c != nil && c.Bytes() > part:
			s.dropCache(pr.to) // the room is the live caches' now
		case settled && from != nil && from.Len() > 0 && time.Now().Before(until) && ctx.Err() == nil && (c == nil || pr.to.standbyPlan != nil ||
			from.Len() != pr.to.standbyFrom && time.Since(pr.to.standbyAt) >= standbyEvery*s.opts.HotInterval):
			// Warmed until done, and again (what it lacks) once the live
			// cache holds another number of keys, at most every
			// standbyEvery ticks; or made again, dropped (cacheRoom).
			if c == nil {
				if c = newValueCache(min(part, from.Bytes()), pr.to.vlen, pr.to.n); c == nil {
					break
				}
				pr.to.cache.Store(c)
				pr.to.standbyPlan = nil // (one for a cache dropped, here or elsewhere, is not this one's)
			}
			if pr.to.standbyPlan == nil {
				pr.to.standbyFrom = from.Len()
				hot := hotKeys(from)
				hot = hot[:min(len(hot), len(c.hs))]
				slices.SortFunc(hot, func(a, b hotKey) int { return cmp.Compare(a.h, b.h) })
				pr.to.standbyPlan = hot
			}
			for len(pr.to.standbyPlan) > 0 && time.Now().Before(until) && ctx.Err() == nil {
				n := min(standbyChunk, len(pr.to.standbyPlan))
				chunk := pr.to.standbyPlan[:n]
				pr.to.fill(ctx, c, chunk, s.background)
				pr.to.standbyPlan = pr.to.standbyPlan[n:]
				if ctx.Err() != nil {
					// The tick ended mid-chunk: what it did not read stays
					// planned for the next. Skipped, it would be missing
					// until the live cache changed size (a re-plan); one
					// read at a time on a busy machine, a chunk can
					// outlast a tick.
					unread := slices.DeleteFunc(chunk, func(k hotKey) bool { return c.has(k.h) })
					pr.to.standbyPlan = append(unread, pr.to.standbyPlan...)
				}
			}
			if len(pr.to.standbyPlan) == 0 {
				pr.to.standbyAt, pr.to.standbyPlan = time.Now(), nil
			}
		}
		b := pr.to.CacheBytes()
		room -= b
		total += b
	}
	// One line once every partition has been warmed, not one a
	// partition: a shard may hold hundreds.
	warm, keys := len(pairs) > 0, 0
	for _, pr := range pairs {
		warm = warm && pr.to.cache.Load() != nil && pr.to.standbyPlan == nil && !pr.to.standbyAt.IsZero()
		keys += pr.to.CachedKeys()
	}
	if warm && !s.standbyWarm {
		slog.Info("shard: warmed the value caches of the newest standby version", "shard", s.opts.ID, "partitions", len(pairs), "keys", keys)
	}
	s.standbyWarm = warm
	return total
}

// stagedTables is the tables served from disk of the versions staged
// beside live ones, whose warm caches maintainCaches keeps though no
// lookup asks them. Loader goroutine only.
func (s *Shard) stagedTables() map[*Table]bool {
	var staged map[*Table]bool
	sn := s.snap.Load()
	for name, a := range s.cur {
		v := sn.get(name, a.Staged)
		if a.Staged == 0 || a.Live == 0 || v == nil {
			continue
		}
		for _, l := range v.layers {
			if len(l) > 0 && l[len(l)-1].warmed {
				if staged == nil {
					staged = map[*Table]bool{}
				}
				staged[l[len(l)-1]] = true
			}
		}
	}
	return staged
}

// servedTables is the tables served from disk of the versions lookups
// are sent to: live and canary ones. Loader goroutine only.
func (s *Shard) servedTables() map[*Table]bool {
	served := map[*Table]bool{}
	sn := s.snap.Load()
	for name, a := range s.cur {
		for _, v := range []uint64{a.Live, a.Canary} {
			if ver := sn.get(name, v); v != 0 && ver != nil {
				for _, l := range ver.layers {
					for _, t := range l {
						if t.Mapped {
							served[t] = true
						}
					}
				}
			}
		}
	}
	return served
}

// coldParts is the partitions of model name's staged version still to be
// warmed: not reported held yet, so that the manager commits the version
// warm. Loader goroutine only.
func (s *Shard) coldParts(sn *snapshot, name string, a topo.Assignment) map[int]bool {
	var cold map[int]bool
	for _, w := range s.toWarm(sn, name, a) {
		if cold == nil {
			cold = map[int]bool{}
		}
		cold[w.p] = true
	}
	return cold
}
