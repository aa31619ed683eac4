package shard

import (
	"log/slog"
	"maps"
	"slices"
)

// ovKey names the overlay of the deltas on one base file.
type ovKey struct {
	model string
	base  uint64 // the base file's version
	p     uint32
	sha   string // the base file's SHA-256
}

// overlays is the shard's overlays: the loader goroutine's only.
type overlays struct {
	byKey map[ovKey]*overlay
	all   map[*overlay]bool // every overlay counted in bytes: byKey's, and those views still use after byKey moved on
}

// viewOf returns the view of a partition's stack (tables newest first,
// the base last) through the overlay of its base, merging the deltas it
// lacks, oldest first. It returns nil, and lookups walk the stack as
// before, when the stack has no delta, when a delta is mapped (it did not
// fit the memory budget: it is read where it lies), or when the overlay's
// growth would not fit the budget.
func (s *Shard) viewOf(model string, p uint32, layers []*Table) *view {
	deltas := layers[:len(layers)-1]
	if len(deltas) == 0 || slices.ContainsFunc(deltas, func(t *Table) bool { return t.Mapped }) {
		return nil
	}
	base := layers[len(layers)-1]
	k := ovKey{model: model, base: base.fv, p: p, sha: base.sha}
	ov := s.ovs.byKey[k]
	if ov != nil && !ov.inOrder(deltas) {
		// A delta was merged before its parent, which only a table loaded
		// again after its overlay outlived it can cause: a new overlay
		// for this chain, and the old one for the views that use it.
		ov = nil
	}
	fresh := ov == nil
	if fresh {
		ov = newOverlay()
	}
	n := 0 // records to merge
	for _, t := range deltas {
		if !ov.merged(t) {
			n += t.n
		}
	}
	var before int64 // what is counted of ov already
	if !fresh {
		before = ov.bytes
	}
	if !s.fits(ov.bytes - before + ov.growth(n)) {
		return nil
	}
	if fresh {
		s.ovs.byKey[k], s.ovs.all[ov] = ov, true
	}
	ls := make([]int, len(deltas))
	for i := len(deltas) - 1; i >= 0; i-- { // oldest first
		ls[i] = ov.merge(deltas[i])
	}
	s.overlayBytes.Add(ov.bytes - before)
	return newView(ov, ls, len(deltas))
}

// inOrder reports whether merging deltas (newest first) into o keeps
// each merged after the one before it: those o holds already are the
// oldest, in order.
func (o *overlay) inOrder(deltas []*Table) bool {
	prev, unmerged := -1, false
	for i := len(deltas) - 1; i >= 0; i-- {
		l, ok := o.layerOf[deltas[i]]
		switch {
		case !ok:
			unmerged = true
		case unmerged || l <= prev:
			return false
		default:
			prev = l
		}
	}
	return true
}

// merged reports whether t is one of o's layers.
func (o *overlay) merged(t *Table) bool { _, ok := o.layerOf[t]; return ok }

// moveInOverlays makes every overlay that names old name new: the same
// file's records, moved.
func (s *Shard) moveInOverlays(old, new *Table) {
	for o := range s.ovs.all {
		o.setTable(old, new)
	}
}

// An overlay is rebuilt without the layers no view holds (deltas of a
// branch abandoned after a rollback) once they hold more than a quarter
// as many entries as the layers in use, and at least ovGCFloor, or once
// there are more than ovGCLayers of them: a key's list may hold an entry
// of each, which a lookup walks past, and a dead layer's table, if small
// (on the Go heap), is kept alive by the overlay until then. Rebuilding
// costs the entries in use, so it is paid at most once per quarter of
// them dropped.
const (
	ovGCFloor  = 1 << 10
	ovGCLayers = 16
)

// tidyOverlays forgets the overlays no version held uses, and rebuilds
// those mostly made of layers no view holds. Loader goroutine only.
func (s *Shard) tidyOverlays() {
	snap := s.snap.Load()
	uses := map[*overlay][]*view{}
	for _, vs := range snap.models {
		for _, ver := range vs {
			for _, v := range ver.views {
				if v != nil {
					uses[v.ov] = append(uses[v.ov], v)
				}
			}
		}
	}
	for o := range s.ovs.all {
		if uses[o] == nil {
			delete(s.ovs.all, o)
			s.overlayBytes.Add(-o.bytes)
		}
	}
	maps.DeleteFunc(s.ovs.byKey, func(_ ovKey, o *overlay) bool { return !s.ovs.all[o] })
	replace := map[*view]*view{}
	for o, vs := range uses {
		var live []uint64
		for _, v := range vs {
			for len(live) < len(v.bits) {
				live = append(live, 0)
			}
			for i, b := range v.bits {
				live[i] |= b
			}
		}
		holds := func(l int) bool { return l>>6 < len(live) && live[l>>6]>>(l&63)&1 == 1 }
		inUse, dead, deadLayers := 0, 0, 0
		for l, n := range o.counts {
			if holds(l) {
				inUse += n
			} else {
				dead, deadLayers = dead+n, deadLayers+1
			}
		}
		if dead <= max(inUse/4, ovGCFloor) && deadLayers <= ovGCLayers {
			continue
		}
		n := newOverlay()
		moved := make([]int, len(o.counts))
		for l, t := range o.data.Load().tables {
			if holds(l) {
				moved[l] = n.merge(t)
			}
		}
		for _, v := range vs {
			var ls []int
			for l := range o.counts {
				if v.holds(uint32(l)) {
					ls = append(ls, moved[l])
				}
			}
			replace[v] = newView(n, ls, v.deltas)
		}
		var key ovKey
		for k, x := range s.ovs.byKey {
			if x == o {
				s.ovs.byKey[k], key = n, k
			}
		}
		delete(s.ovs.all, o)
		s.ovs.all[n] = true
		s.overlayBytes.Add(n.bytes - o.bytes)
		slog.Info("shard: overlay rebuilt without the deltas no version held uses", "shard", s.opts.ID, "model", key.model, "partition", key.p,
			"entries", inUse, "dropped", dead)
	}
	if len(replace) > 0 {
		s.install(snap.withViews(replace))
	}
}

// withViews returns a copy of s in which each view in replace is replaced
// by its value.
func (s *snapshot) withViews(replace map[*view]*view) *snapshot {
	return s.revised(func(ver *version) *version {
		var nv *version
		for p, x := range ver.views {
			if y := replace[x]; y != nil {
				if nv == nil {
					c := *ver
					c.views = slices.Clone(ver.views)
					nv = &c
				}
				nv.views[p] = y
			}
		}
		return nv
	})
}
