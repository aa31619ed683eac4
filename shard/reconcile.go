package shard

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// reconcile brings what the shard holds to what the serving map asks of
// it: load what is missing (live first, then staged, then standby), warm
// the value caches of a staged version served from disk, drop
// what the map no longer keeps, then promote mapped partitions of live
// versions while the memory budget allows. The shard never chooses a
// version itself.
func (s *Shard) reconcile(ctx context.Context, as map[string]topo.Assignment) {
	s.reclaim(0)
	s.passLoads = 0
	want := s.wanted(as)
	// From here on the report follows these records: nothing they keep
	// here is dropped before a newer record says so.
	s.cur = as
	s.applied = make(map[string]uint64, len(as))
	for name, a := range as {
		s.applied[name] = a.Seq
	}
	// A mismatch stays reported while the map keeps the version: the
	// manager assigns this shard nothing of it meanwhile.
	for k, l := range s.mismatched {
		if a, ok := as[l.Model]; !ok || !slices.Contains(a.Kept(), l.Version) {
			delete(s.mismatched, k)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		a := as[name]
		for _, v := range a.Kept() {
			if s.superseded(ctx) {
				return
			}
			s.loadVersion(ctx, a, v, want[name][v])
		}
	}
	// A version rolled back to is warmed from the one it replaced, at
	// once; a staged version is reported held once warm: committed, it
	// serves its hot keys from memory at once.
	s.warmLive(ctx, as)
	s.warmStaged(ctx, as)
	s.report() // what was loaded, before promotions that may take long
	// Failures of versions the map no longer keeps on this shard will
	// never be retried: forget them.
	s.forget(func(f *failure) bool { _, ok := want[f.model][f.version]; return !ok })
	s.retire(want)
	s.promote(ctx, as)
	s.report()
}

// superseded reports whether reconcile should stop between two loads:
// the shard closes, or a newer serving map waits (it may withdraw what is
// being loaded; with a bounded load rate, finishing first could take
// minutes) and this reconcile has loaded something (so that maps coming
// faster than a load cannot starve loading). The next reconcile, on the
// newer map, goes on from there.
func (s *Shard) superseded(ctx context.Context) bool {
	return ctx.Err() != nil || len(s.pending) > 0 && s.passLoads > 0
}

// wanted is, per model and version the map keeps, the partitions
// assigned to this shard.
func (s *Shard) wanted(as map[string]topo.Assignment) map[string]map[uint64][]uint32 {
	want := map[string]map[uint64][]uint32{}
	for name, a := range as {
		var mine []uint32
		for p, reps := range a.Replicas {
			if slices.Contains(reps, s.opts.ID) {
				mine = append(mine, uint32(p))
			}
		}
		if len(mine) == 0 {
			continue
		}
		want[name] = map[uint64][]uint32{}
		for _, v := range a.Kept() {
			want[name][v] = mine
		}
	}
	return want
}

// loadVersion loads the partitions parts of version v of a's model that
// the shard does not hold yet. The repository's manifests must describe
// exactly the content the map expects (the same chain, the same identity
// per partition): a shard pointed at another repository, or at files
// changed since the manager validated them, refuses rather than serve
// other parameters under the same name and version.
func (s *Shard) loadVersion(ctx context.Context, a topo.Assignment, v uint64, parts []uint32) {
	name := a.Model
	info := a.Info(v)
	held := s.snap.Load().get(name, v)
	missing := slices.DeleteFunc(slices.Clone(parts), func(p uint32) bool { return held != nil && held.layers[p] != nil })
	if len(missing) == 0 {
		// Held whole: whatever failed before no longer matters (a
		// failure remembered would be retried, and the shard woken, for
		// ever).
		s.forget(func(f *failure) bool { return f.model == name && f.version == v })
		return
	}
	vkey := fmt.Sprintf("%s/%d", name, v)
	if s.waiting(vkey) {
		return
	}
	chain, err := s.opts.Repo.Chain(name, v)
	if err != nil {
		s.refuse(name, v, vkey, err)
		return
	}
	versions := codec.ChainVersions(chain)
	if err := matchesMap(chain, versions, a, info); err != nil {
		// Another repository, or one changed since the manager validated
		// it: say what this shard would have served, so the manager stops
		// assigning it the model.
		wrong := topo.Loaded{Model: name, Version: v}
		for _, p := range missing {
			if p < chain[0].Partitions {
				wrong.Have, wrong.IDs = append(wrong.Have, p), append(wrong.IDs, codec.PartitionIdentity(chain, p))
			}
		}
		s.mismatched[vkey] = wrong
		s.refuse(name, v, vkey, err)
		return
	}
	// A version is served from disk whole unless all it needs fits the
	// budget. Beside the live one (staged, or standby again), filling
	// the budget's headroom with part of it would raise memory while
	// nothing serves it; live, the budget serves more lookups as value
	// caches of the hottest keys of every partition than as some
	// partitions whole, cold keys and all. Once it fits (the old
	// version's tables gone), promote brings it into resident memory a
	// partition at a time. A version already served from disk takes new
	// partitions (a rebalance) onto disk too.
	mapped := !s.fits(s.bytesToLoad(chain, missing)) || (held != nil && held.onDisk())
	// A type with a dense part: the shard holds it (verified against the
	// map's SHA-256) with the version, for routers to fetch.
	var dense *denseFile
	if info.Dense != "" && (held == nil || held.dense == nil) {
		if dense = s.snap.Load().denseFile(name, info.Dense); dense == nil {
			b, err := s.opts.Repo.DenseFile(chain, info.Dense)
			if err != nil {
				s.refuse(name, v, vkey, err)
				return
			}
			dense = &denseFile{sum: info.Dense, b: b}
		}
	}
	var wrong topo.Loaded
	t0, files0 := time.Now(), s.passLoads
	var batch []placed
	installed, shared := 0, 0
	// Partitions are installed in batches, a snapshot swap (and a
	// progress report, at most every reportEvery) each reportEvery of
	// loading: a large version's partitions, seconds apart, each come in
	// as they are loaded; a delta's, loaded in a moment or shared with
	// its parent, in one swap, not one each.
	flush := func() {
		if len(batch) == 0 {
			return
		}
		s.install(s.snap.Load().withParts(chain[0], versions, batch, dense))
		s.unplaced = 0 // counted by install now
		installed += len(batch)
		batch = batch[:0]
		if time.Since(s.reported) >= reportEvery {
			s.report()
			s.reported = time.Now()
		}
	}
	cut := false
	defer func() {
		flush()
		if installed > 0 {
			what := "loaded"
			switch {
			case cut && ctx.Err() != nil:
				what = "loading (cut short: the shard closes)"
			case cut:
				what = "loading (cut short by a newer map)"
			}
			slog.Info(fmt.Sprintf("shard: %s version %d of %s: %d partitions, %d of them unchanged from versions held; %d files read", what, v, name,
				installed, shared, s.passLoads-files0),
				"shard", s.opts.ID, "model", name, "version", v, "took", time.Since(t0).Round(time.Millisecond))
		}
	}()
	last := time.Now() // the last swap, or the loop's start
	var ids []string   // the chain's partition identities, once a partition is to be loaded
	for _, p := range missing {
		if s.superseded(ctx) {
			cut = true
			return
		}
		pkey := fmt.Sprintf("%s/%d", vkey, p)
		if s.waiting(pkey) {
			continue
		}
		if ids == nil {
			ids = s.identities.Identities(chain)
		}
		id := ids[p]
		if id != info.IDs[p] {
			wrong.Have, wrong.IDs = append(wrong.Have, p), append(wrong.IDs, id)
			continue
		}
		var layers []*Table
		var err error
		if s.opts.BeforeLoad != nil {
			err = s.opts.BeforeLoad(ctx, name, v, p)
		}
		before := s.passLoads
		var view *view
		if err == nil {
			layers, view, err = s.loadStack(chain, p, mapped)
		}
		if err != nil {
			if ctx.Err() != nil {
				cut = true // the shard closes: nothing was refused
				return
			}
			s.refuse(name, v, pkey, err)
			continue
		}
		if s.passLoads == before {
			shared++
		}
		delete(s.failed, pkey)
		batch = append(batch, placed{p: p, layers: layers, view: view, id: id})
		if time.Since(last) >= reportEvery {
			flush()
			last = time.Now()
		}
	}
	flush()
	if len(wrong.Have) > 0 {
		wrong.Model, wrong.Version = name, v
		s.mismatched[vkey] = wrong
		s.refuse(name, v, vkey, fmt.Errorf("shard: the repository's partitions %v differ from the content the serving map expects; not loading them", wrong.Have))
		return
	}
	delete(s.failed, vkey)
	delete(s.mismatched, vkey)
}

// matchesMap checks a version's chain (got: its versions) against the
// map's record of it.
func matchesMap(chain []*codec.Manifest, got []uint64, a topo.Assignment, info *topo.VersionInfo) error {
	m := chain[0]
	switch {
	case m.Partitions != a.Partitions:
		return fmt.Errorf("shard: manifest has %d partitions, the serving map %d", m.Partitions, a.Partitions)
	case !slices.Equal(got, info.Chain):
		return fmt.Errorf("shard: the repository's chain %v differs from the serving map's %v", got, info.Chain)
	case m.Shape != info.Shape || m.Hash != info.Hash:
		return fmt.Errorf("shard: manifest describes %s (hash %s), the serving map %s (hash %s)", m.Shape, m.Hash, info.Shape, info.Hash)
	}
	if _, e, _ := codec.ChainExtra(chain, codec.RoleDense); e.SHA256 != info.Dense {
		return fmt.Errorf("shard: the repository's dense part is %q, the serving map's %q", e.SHA256, info.Dense)
	}
	return nil
}

// retire drops every partition the map does not keep on this shard, and
// the overlays only they used.
func (s *Shard) retire(want map[string]map[uint64][]uint32) {
	after, dropped := s.snap.Load().keepOnly(func(name string, v uint64, p uint32) bool {
		return slices.Contains(want[name][v], p)
	})
	if dropped {
		s.install(after)
		s.report()
		s.reclaim(reclaimWait)
	}
	s.tidyOverlays()
}

// promote moves mapped partitions of live versions into resident memory
// while the budget allows, one at a time: the same version's bytes
// replace each other, so lookups never see a mix of versions, and memory
// grows by at most one partition before the mapping is released.
func (s *Shard) promote(ctx context.Context, as map[string]topo.Assignment) {
	for _, name := range slices.Sorted(maps.Keys(as)) {
		a := as[name]
		if a.Live == 0 || a.Staged != 0 {
			continue
		}
		v := s.snap.Load().get(name, a.Live)
		if v == nil || !v.onDisk() {
			continue
		}
		// Whole or not at all: a version half resident leaves its other
		// half's lookups no cache (see loadVersion).
		if need := v.diskBytes(); !s.fits(need) {
			s.makeRoom(need, as)
			if !s.fits(need) {
				continue
			}
		}
		for p, l := range v.layers {
			// Deltas are small and loaded resident; the base is what may
			// be mapped.
			if s.superseded(ctx) {
				return // a newer map first (a rollback need not wait for promotions)
			}
			if l == nil || !l[len(l)-1].Mapped {
				continue
			}
			if need := l[len(l)-1].Bytes(); !s.fits(need) {
				s.makeRoom(need, as)
				if !s.fits(need) {
					continue
				}
			}
			base, err := s.opts.Repo.Manifest(name, v.chain[len(v.chain)-1])
			var pt *codec.Partition
			if err == nil {
				// ReadPartition verifies the SHA-256 of the bytes it read,
				// so a file changed since the load is refused here.
				s.cacheRoom(l[len(l)-1].Bytes())
				pt, err = s.readPartition(base, uint32(p))
			}
			if f, _ := base.File(uint32(p)); err == nil && f.SHA256 != l[len(l)-1].sha {
				err = fmt.Errorf("shard: the repository's file now differs from the one loaded")
			}
			if err != nil {
				slog.Warn("shard: promoting a mapped partition failed; it stays mapped", "shard", s.opts.ID, "model", name, "partition", p, "err", err)
				continue
			}
			layers := append(slices.Clone(l[:len(l)-1]), NewTable(pt))
			layers[len(layers)-1].sha, layers[len(layers)-1].fv = l[len(l)-1].sha, base.Version
			s.install(s.snap.Load().with(v.m, v.chain, placed{p: uint32(p), layers: layers, view: v.views[p], id: v.ids[p]}, nil))
			s.reclaim(reclaimWait) // the mapping goes before the next partition comes in
			s.passLoads++
			slog.Info("shard: partition now resident", "shard", s.opts.ID, "model", name, "version", a.Live, "partition", p)
		}
	}
}

// reportEvery is how often a load in progress updates the shard's
// registration.
const reportEvery = 100 * time.Millisecond

// reclaimWait bounds how long the loader waits for lookups under way
// to leave a replaced snapshot before it frees what only that snapshot
// held (what is not freed then is on a later pass).
const reclaimWait = 2 * time.Second

// makeRoom moves resident tables that only standby versions use to
// mapped copies of their files, least recently live first, until n more
// bytes fit the budget or none is left: the live version comes first in
// resident memory; standby versions stay loaded, served from the page
// cache, for a rollback.
func (s *Shard) makeRoom(n int64, as map[string]topo.Assignment) {
	snap := s.snap.Load()
	serving := map[*Table]bool{}
	for name, a := range as {
		for _, v := range []uint64{a.Live, a.Staged} {
			if ver := snap.get(name, v); ver != nil {
				for _, l := range ver.layers {
					for _, t := range l {
						serving[t] = true
					}
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(as)) {
		standby := as[name].Standby
		for i := len(standby) - 1; i >= 0; i-- {
			ver := snap.get(name, standby[i])
			if ver == nil {
				continue
			}
			for p, l := range ver.layers {
				// The base only: deltas are small, and a version's
				// deltas stay resident, read through its overlay.
				for _, t := range l[max(0, len(l)-1):] {
					if s.fits(n) {
						return
					}
					if t.Mapped || serving[t] {
						continue
					}
					if err := s.demote(name, t.fv, uint32(p), t); err != nil {
						slog.Warn("shard: could not map a standby partition to make room; it stays resident",
							"shard", s.opts.ID, "model", name, "version", t.fv, "partition", p, "err", err)
						continue
					}
					serving[t] = true // replaced; do not look at it again
				}
			}
		}
	}
}

// demote replaces resident table t, partition p of the file of version
// fileVersion, by a mapping of the shard's own verified copy of that file.
func (s *Shard) demote(model string, fileVersion uint64, p uint32, t *Table) error {
	m, err := s.opts.Repo.Manifest(model, fileVersion)
	if err != nil {
		return err
	}
	if f, ok := m.File(p); !ok || f.SHA256 != t.sha {
		return fmt.Errorf("shard: the repository's file now differs from the one loaded")
	}
	pt, err := s.mapCopy(m, p)
	if err != nil {
		return err
	}
	mt := NewTable(pt)
	mt.sha, mt.fv, mt.sample = t.sha, t.fv, s.samples
	s.moveInOverlays(t, mt)
	s.install(s.snap.Load().replaced(t, mt))
	s.reclaim(reclaimWait) // the resident copy goes before the live partition comes in
	slog.Info("shard: standby partition now mapped, making room for the live version", "shard", s.opts.ID, "model", model,
		"version", fileVersion, "partition", p, "bytes", t.Bytes())
	return nil
}

// bytesToLoad is the size of the files of chain's partitions parts not
// already held.
func (s *Shard) bytesToLoad(chain []*codec.Manifest, parts []uint32) int64 {
	var n int64
	snap := s.snap.Load()
	for _, c := range chain {
		for _, p := range parts {
			f, ok := c.File(p)
			if !ok {
				continue
			}
			if t := snap.file(c.Name, c.Version, p); t == nil || t.sha != f.SHA256 {
				n += f.Size
			}
		}
	}
	return n
}

// loadStack returns partition p's tables for a version's chain, newest
// first — one per link with a file for p (codec.Layers) — reusing tables
// already held for any link, and the view of its deltas (nil: none, or
// the stack is walked); with mapped, what it loads is mapped.
func (s *Shard) loadStack(chain []*codec.Manifest, p uint32, mapped bool) ([]*Table, *view, error) {
	links := codec.Layers(chain, p)
	layers := make([]*Table, len(links))
	for i, c := range links {
		f, _ := c.File(p)
		if t := s.snap.Load().file(c.Name, c.Version, p); t != nil && t.sha == f.SHA256 {
			layers[i] = t
			continue
		}
		t0 := time.Now()
		// Served from disk, a version keeps its deltas resident all the
		// same (small, and read through its overlay): only its base, the
		// last link, is read from disk.
		t, err := s.loadPartition(c, p, mapped && i == len(links)-1)
		if err != nil {
			for _, t := range layers[:i] {
				if t.refs == 0 { // loaded here, held nowhere
					s.unplace(t)
					t.release()
				}
			}
			return nil, nil, err
		}
		t.sha, t.fv = f.SHA256, c.Version
		layers[i] = t
		s.place(t)
		s.metrics.loads.Inc()
		s.passLoads++
		slog.Debug("shard: loaded partition", "shard", s.opts.ID, "model", c.Name, "version", c.Version, "kind", c.Kind, "partition", p,
			"keys", t.Len(), "bytes", t.Bytes(), "mapped", t.Mapped, "took", time.Since(t0).Round(time.Millisecond))
	}
	return layers, s.viewOf(chain[0].Name, p, layers), nil
}

// place counts a resident table loaded but not yet installed, so that
// fits sees it (loadVersion installs partitions in batches); install
// counts it from then on. unplace takes back a table that will not be
// installed. Loader goroutine only.
func (s *Shard) place(t *Table) {
	if !t.Mapped {
		s.unplaced += t.Bytes()
	}
}

func (s *Shard) unplace(t *Table) {
	if !t.Mapped {
		s.unplaced -= t.Bytes()
	}
}

// failure is a refused load and when to try it again: a failure is not
// remembered forever, its cause (a file being copied, a disk full) may go.
type failure struct {
	model    string
	version  uint64
	err      error
	attempts int
	next     time.Time
}

// forget drops the failures drop picks.
func (s *Shard) forget(drop func(*failure) bool) {
	maps.DeleteFunc(s.failed, func(_ string, f *failure) bool { return drop(f) })
}

// Backoff of failed loads: doubling from minRetry up to maxRetry.
const (
	minRetry = time.Second
	maxRetry = time.Minute
)

// waiting reports whether key failed and its backoff has not passed.
func (s *Shard) waiting(key string) bool {
	f := s.failed[key]
	return f != nil && time.Now().Before(f.next)
}

// nextRetry is how long until the earliest failed load may be tried
// again (an hour when none failed), and never less than retryFloor: a
// failure that stays due cannot make the shard spin.
func (s *Shard) nextRetry(now time.Time) time.Duration {
	d := time.Hour
	for _, f := range s.failed {
		d = min(d, max(f.next.Sub(now), retryFloor))
	}
	return d
}

// retryFloor is the shortest wait between two passes woken by retries.
const retryFloor = 100 * time.Millisecond

func (s *Shard) refuse(model string, version uint64, key string, err error) {
	f := s.failed[key]
	if f == nil {
		f = &failure{model: model, version: version}
		s.failed[key] = f
	}
	f.err, f.attempts = err, f.attempts+1
	f.next = time.Now().Add(min(minRetry<<min(f.attempts-1, 10), maxRetry))
	slog.Error("shard: refusing partition; keeping what is loaded", "shard", s.opts.ID, "partition", key, "err", err, "retry_in", time.Until(f.next).Round(time.Second))
	s.metrics.loadFails.Inc()
	s.report()
}
