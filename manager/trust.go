// Trust and holdings: which shards report validated content, and what they hold.

package manager

import (
	"maps"
	"slices"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// trusted lists, sorted, the shards partitions of m may be assigned to:
// every live shard except those reporting content for m that differs from
// what the manager validated.
func (s *State) trusted(m *ModelState) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(s.Shards)) {
		if !s.mismatched(m, s.Shards[id]) {
			out = append(out, id)
		}
	}
	return out
}

// mismatched reports whether si holds or found content for m whose
// identity differs from the validated version's.
func (s *State) mismatched(m *ModelState, si topo.ShardInfo) bool {
	for _, l := range slices.Concat(si.Loaded, si.Mismatched) {
		if l.Model != m.Name {
			continue
		}
		v := m.version(l.Version)
		if v == nil || v.Info == nil {
			continue
		}
		for i, p := range l.Have {
			if int(p) >= len(v.Info.IDs) || i >= len(l.IDs) || l.IDs[i] != v.Info.IDs[p] {
				return true
			}
		}
	}
	return false
}

// Mismatches lists, per shard, the versions of model it holds or found
// with content other than the manager validated.
func (s *State) Mismatches(model string) map[string][]uint64 {
	out := map[string][]uint64{}
	if s.Models[model] == nil {
		return out
	}
	for id, si := range s.Shards {
		if vs := s.mismatchesOf(si, model)[model]; len(vs) > 0 {
			out[id] = vs
		}
	}
	return out
}

// mismatchesOf lists, per model (only's, or every model's if only is
// ""), the versions shard si holds or found with content other than the
// manager validated: one pass over its reports.
func (s *State) mismatchesOf(si topo.ShardInfo, only string) map[string][]uint64 {
	var out map[string][]uint64
	for _, list := range [][]topo.Loaded{si.Loaded, si.Mismatched} {
		for _, l := range list {
			if only != "" && l.Model != only {
				continue
			}
			m := s.Models[l.Model]
			if m == nil || slices.Contains(out[l.Model], l.Version) || !s.mismatched(m, topo.ShardInfo{Loaded: []topo.Loaded{l}}) {
				continue
			}
			if out == nil {
				out = map[string][]uint64{}
			}
			out[l.Model] = append(out[l.Model], l.Version)
		}
	}
	return out
}

// holding indexes the shards' reports of one model (shard → version →
// report), so that settling a model with many partitions and versions
// kept does not search every report for every pair.
type holding map[string]map[uint64]*topo.Loaded

func (s *State) holding(model string) holding {
	h := holding{}
	for id, si := range s.Shards {
		for i := range si.Loaded {
			l := &si.Loaded[i]
			if l.Model != model {
				continue
			}
			if h[id] == nil {
				h[id] = map[uint64]*topo.Loaded{}
			}
			if h[id][l.Version] == nil { // the first, as ShardInfo.Holds reads
				h[id][l.Version] = l
			}
		}
	}
	return h
}

// holdsIn reports whether shard id holds partition p of v with the
// validated content, by a report recent enough to trust: one that
// follows a record from which on neither the placement nor v's being kept
// has changed. An older report may list what the shard has since dropped
// on an intermediate record's word. It reads the reports from h.
func (s *State) holdsIn(h holding, m *ModelState, id string, v uint64, p int) bool {
	return s.holdsVersion(h, m, id, m.version(v), p)
}

// holdsVersion is holdsIn for version x (nil: unknown).
func (s *State) holdsVersion(h holding, m *ModelState, id string, x *Version, p int) bool {
	if x == nil || x.Info == nil || p >= len(x.Info.IDs) {
		return false
	}
	si, ok := s.Shards[id]
	if !ok {
		return false
	}
	if held := si.Held[m.Name]; held != nil {
		ks := keptSince(m, x)
		return held.Seq >= max(m.PlaceSeq, ks) && held.Holds(x.Version, ks, uint32(p))
	}
	if si.Applied[m.Name] < max(m.PlaceSeq, x.KeptSince) {
		return false
	}
	l := h[id][x.Version]
	return l != nil && x.Info.IDs[p] != "" && l.Identity(uint32(p)) == x.Info.IDs[p]
}

// allKept answers, for one set of kept versions, whether shard id holds
// partition p of every one of them: follows, by a report recent enough
// to hand over on (holdsVersion); reports, by any report (reported).
// For reports of schema 4 it reads each shard's report once, so a settle
// asks it for every partition at the cost of a lookup, not of a search
// per kept version.
type allKept func(id string, p int) (follows, reports bool)

func (s *State) allKept(h holding, m *ModelState, kept []*Version) allKept {
	// For the shards with a report of schema 4, the answers are laid out
	// by partition (held[at[p]:at[p+1]]): a settle asks for every replica
	// of every partition, and a scan of a partition's few holders costs
	// less than a lookup by shard and a search of its parts.
	type answer struct {
		view             int32 // in views
		follows, reports bool
	}
	n := int(m.Partitions)
	type shardView struct {
		id               string
		held             *topo.Held
		follows, reports bool
		lacking          map[uint32]bool // partitions a kept version lacks
	}
	var views []shardView
	schema4 := map[string]bool{}
	at := make([]int, n+1)
	for id, si := range s.Shards {
		held := si.Held[m.Name]
		if held == nil {
			continue
		}
		schema4[id] = true
		x := shardView{id: id, held: held, reports: true}
		for _, v := range kept {
			if v == nil || v.Info == nil {
				x.reports = false
				continue
			}
			if ks := keptSince(m, v); held.Seq < ks {
				x.reports = false
			}
			for _, e := range held.Except {
				if e.Version == v.Version {
					if x.lacking == nil {
						x.lacking = map[uint32]bool{}
					}
					for _, p := range e.Missing {
						x.lacking[p] = true
					}
				}
			}
		}
		x.follows = x.reports && held.Seq >= m.PlaceSeq
		views = append(views, x)
		for _, p := range held.Parts {
			if int(p) < n && !x.lacking[p] {
				at[p+1]++
			}
		}
	}
	for p := range n {
		at[p+1] += at[p]
	}
	held := make([]answer, at[n])
	next := slices.Clone(at[:n])
	for v, x := range views {
		for _, p := range x.held.Parts {
			if int(p) < n && !x.lacking[p] {
				held[next[p]] = answer{int32(v), x.follows, x.reports}
				next[p]++
			}
		}
	}
	return func(id string, p int) (follows, reports bool) {
		if p >= 0 && p < n {
			for _, a := range held[at[p]:at[p+1]] {
				if views[a.view].id == id {
					return a.follows, a.reports
				}
			}
		}
		if schema4[id] {
			return false, false
		}
		si, ok := s.Shards[id]
		if !ok {
			return false, false
		}
		follows = !slices.ContainsFunc(kept, func(x *Version) bool { return !s.holdsVersion(h, m, id, x, p) })
		reports = !slices.ContainsFunc(kept, func(x *Version) bool { return !reported(si, m, x, p) })
		return follows, reports
	}
}

// keptOf is allKept for a model's kept versions, made once while they
// stand: limitMoves and handover ask for the same versions in one settle
// unless a commit between them changed which are kept.
type keptOf struct {
	h   holding
	vs  []uint64
	all allKept
}

func (kc *keptOf) of(s *State, m *ModelState) allKept {
	vs := m.kept()
	if kc.all != nil && slices.Equal(vs, kc.vs) {
		return kc.all
	}
	var kept []*Version
	for _, v := range vs {
		kept = append(kept, m.version(v))
	}
	kc.vs, kc.all = vs, s.allKept(kc.h, m, kept)
	return kc.all
}

// reported reports whether si says it holds partition p of version x of
// m with the validated content, however old its report: whether it has
// it, not whether to hand over on it (holdsVersion).
func reported(si topo.ShardInfo, m *ModelState, x *Version, p int) bool {
	if x == nil || x.Info == nil || p >= len(x.Info.IDs) {
		return false
	}
	if held := si.Held[m.Name]; held != nil {
		return held.Holds(x.Version, keptSince(m, x), uint32(p))
	}
	return si.Holds(m.Name, x.Version, uint32(p), x.Info.IDs[p])
}

// keptSince is the Seq since which m keeps x, as readers of its map
// take it (topo.KeptFrom).
func keptSince(m *ModelState, x *Version) uint64 { return topo.KeptFrom(x.KeptSince, m.Seq) }

// heldCount is how many partitions of version x of m si reports.
func heldCount(si topo.ShardInfo, m *ModelState, x *Version) int {
	if x == nil {
		return 0
	}
	if held := si.Held[m.Name]; held != nil {
		return held.Count(x.Version, keptSince(m, x))
	}
	for _, l := range si.Loaded {
		if l.Model == m.Name && l.Version == x.Version {
			return len(l.Have)
		}
	}
	return 0
}

// allHold reports whether every replica assign names holds its partition
// of v: the moment a rollout may commit. A shard counts only for the
// partitions the map last published gives it: a report of anything else
// may be about to go (the shard drops what an earlier map took from it).
func (s *State) allHold(h holding, m *ModelState, assign [][]string, v uint64) bool {
	if len(m.Replicas) != len(assign) {
		return false
	}
	for p, reps := range assign {
		if len(reps) == 0 {
			return false
		}
		for _, id := range reps {
			if !slices.Contains(m.Replicas[p], id) || !s.holdsIn(h, m, id, v, p) {
				return false
			}
		}
	}
	return true
}

// handover is what to publish on the way from the replicas last
// published to assign: make before break. Until every shard assign names
// for partition p holds every version the map keeps (live, staged and
// standby: a rollback must find its version loaded) by a report
// that follows the newest record (an older report may list what the shard
// has since dropped), the shards last published for p stay assigned too,
// if they are still trusted (registered, reporting nothing false), so a
// partition moved when shards join or leave keeps its serving replicas
// until its new holders have loaded it.
func (s *State) handover(kc *keptOf, m *ModelState, assign [][]string, trusted []string) [][]string {
	prev := m.Replicas
	if len(prev) != len(assign) || sameReplicas(prev, assign) {
		return assign // (nothing moves: every holder stays)
	}
	all := kc.of(s, m)
	isTrusted := setOf(trusted)
	out := make([][]string, len(assign))
	for p, reps := range assign {
		out[p] = reps
		ready := !slices.ContainsFunc(reps, func(id string) bool {
			follows, _ := all(id, p)
			return !slices.Contains(prev[p], id) || !follows
		})
		if ready {
			continue
		}
		for _, id := range prev[p] {
			if !slices.Contains(out[p], id) && isTrusted[id] {
				out[p] = append(slices.Clip(out[p]), id)
			}
		}
	}
	return out
}

// setOf is ids as a set.
func setOf(ids []string) map[string]bool {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}
