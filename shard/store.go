package shard

import (
	"cmp"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// version is one model version as this shard holds it: for each
// partition, the tables of its chain that have a file for it, newest
// first — the version's own file if it touches the partition, then its
// parents' down to a full version. A full version's stack has one table;
// a delta's lookups take the first layer that has a key. A delta that
// leaves a partition unchanged holds its parent's tables for it (the
// same tables, loaded once). Where a stack has deltas, lookups read them
// through one view of an overlay (overlay.go), not table by table.
type version struct {
	m      *codec.Manifest
	chain  []uint64   // versions of the layers, newest first
	layers [][]*Table // per partition; nil where not held
	views  []*view    // per partition: the view of the stack's deltas; nil: walk the stack
	ids    []string   // per partition: content identity (codec.PartitionIdentity) of what is held
	dense  *denseFile // the dense part, verified, for a type with one
}

// denseFile is a dense part's file as verified, shared by every version
// held that uses it.
type denseFile struct {
	sum string // SHA-256, as the serving map names it
	b   []byte
}

// denseFile finds a dense part already held, by SHA-256.
func (s *snapshot) denseFile(model, sum string) *denseFile {
	for _, ver := range s.models[model] {
		if ver.dense != nil && ver.dense.sum == sum {
			return ver.dense
		}
	}
	return nil
}

// snapshot is the immutable set of everything loaded. Lookups read it
// through an atomic pointer; the loader replaces it whole.
type snapshot struct {
	models  map[string]map[uint64]*version
	readers atomic.Int64 // lookups reading it now (reclaim.go)
}

func (s *snapshot) get(model string, v uint64) *version {
	return s.models[model][v]
}

// file finds a table already held for one partition file, whichever
// version's stack it is in, so chains share their common layers.
func (s *snapshot) file(model string, fileVersion uint64, p uint32) *Table {
	// Version fileVersion itself, if held, has the file's table on top.
	if ver := s.models[model][fileVersion]; ver != nil && int(p) < len(ver.layers) {
		if l := ver.layers[p]; len(l) > 0 && l[0].fv == fileVersion {
			return l[0]
		}
	}
	for _, ver := range s.models[model] {
		if int(p) < len(ver.layers) {
			if t := stackFile(ver.layers[p], fileVersion); t != nil {
				return t
			}
		}
	}
	return nil
}

// stackFile finds the table of file version fv in a stack, by a binary
// search: a stack is its chain's links newest first, and a delta is
// always newer than its parent, so file versions fall down it.
// Loading a version looks up each link of its chain for each of its
// partitions: a scan of each stack made that quadratic in the chain's
// length, a fifth of a shard's CPU at 200 deltas of a million keys a
// second.
func stackFile(stack []*Table, fv uint64) *Table {
	n := len(stack)
	if n == 0 {
		return nil
	}
	if base := stack[n-1]; base.fv == fv {
		return base
	}
	deltas := stack[:n-1]
	if i, ok := slices.BinarySearchFunc(deltas, fv, func(t *Table, fv uint64) int { return cmp.Compare(fv, t.fv) }); ok {
		return deltas[i]
	}
	return nil
}

// onDisk reports whether any of the version's partitions is served
// from disk.
func (v *version) onDisk() bool {
	for _, l := range v.layers {
		if len(l) > 0 && l[len(l)-1].Mapped {
			return true
		}
	}
	return false
}

// diskBytes is what the version's partitions served from disk would
// take resident, beyond what they take now.
func (v *version) diskBytes() int64 {
	var n int64
	for _, l := range v.layers {
		if len(l) > 0 && l[len(l)-1].Mapped {
			n += l[len(l)-1].Bytes() - l[len(l)-1].ResidentBytes()
		}
	}
	return n
}

// placed is one partition's stack, the view of its deltas, and its
// content identity.
type placed struct {
	p      uint32
	layers []*Table
	view   *view
	id     string
}

// with returns a copy of s in which version m (of chain) holds partition
// p as placed, and dense as its dense part (nil: the one it held, if any).
func (s *snapshot) with(m *codec.Manifest, chain []uint64, x placed, dense *denseFile) *snapshot {
	return s.withParts(m, chain, []placed{x}, dense)
}

// withParts is with for several partitions at once: one copy of the
// version's per-partition slices, however many come in.
func (s *snapshot) withParts(m *codec.Manifest, chain []uint64, parts []placed, dense *denseFile) *snapshot {
	n := &snapshot{models: maps.Clone(s.models)}
	vs := maps.Clone(n.models[m.Name])
	if vs == nil {
		vs = map[uint64]*version{}
	}
	nv := &version{m: m, chain: chain, layers: make([][]*Table, m.Partitions), views: make([]*view, m.Partitions), ids: make([]string, m.Partitions), dense: dense}
	if old := vs[m.Version]; old != nil {
		copy(nv.layers, old.layers)
		copy(nv.views, old.views)
		copy(nv.ids, old.ids)
		if dense == nil {
			nv.dense = old.dense
		}
	}
	for _, x := range parts {
		nv.layers[x.p], nv.views[x.p], nv.ids[x.p] = x.layers, x.view, x.id
	}
	vs[m.Version] = nv
	n.models[m.Name] = vs
	return n
}

// keepOnly returns a copy of s holding only the (model, version,
// partition) triples keep allows, and whether anything was dropped.
func (s *snapshot) keepOnly(keep func(model string, v uint64, p uint32) bool) (*snapshot, bool) {
	n := &snapshot{models: map[string]map[uint64]*version{}}
	dropped := false
	for name, vs := range s.models {
		for v, ver := range vs {
			nv := &version{m: ver.m, chain: ver.chain, layers: make([][]*Table, len(ver.layers)), views: make([]*view, len(ver.layers)), ids: ver.ids, dense: ver.dense}
			held := false
			for p, l := range ver.layers {
				if l == nil {
					continue
				}
				if keep(name, v, uint32(p)) {
					nv.layers[p], nv.views[p], held = l, ver.views[p], true
				} else {
					dropped = true
				}
			}
			if held {
				if n.models[name] == nil {
					n.models[name] = map[uint64]*version{}
				}
				n.models[name][v] = nv
			}
		}
	}
	return n, dropped
}

// revised returns a copy of s in which fn has revised the versions it
// changes (returning the new version; nil leaves one as it is): models
// and versions it leaves alone are shared, not copied.
func (s *snapshot) revised(fn func(ver *version) *version) *snapshot {
	n := &snapshot{models: maps.Clone(s.models)}
	for name, vs := range s.models {
		var nvs map[uint64]*version
		for v, ver := range vs {
			if nv := fn(ver); nv != nil {
				if nvs == nil {
					nvs = maps.Clone(vs)
				}
				nvs[v] = nv
			}
		}
		if nvs != nil {
			n.models[name] = nvs
		}
	}
	return n
}

// restacked returns a copy of s in which fn has rewritten the stacks it
// changes; versions and models it leaves alone are shared, not copied.
// fn returns nil to leave a stack as it is.
func (s *snapshot) restacked(fn func(l []*Table) []*Table) *snapshot {
	return s.revised(func(ver *version) *version {
		var nv *version
		for p, l := range ver.layers {
			if nl := fn(l); nl != nil {
				if nv == nil {
					c := *ver
					c.layers = slices.Clone(ver.layers)
					nv = &c
				}
				nv.layers[p] = nl
			}
		}
		return nv
	})
}

// replaced returns a copy of s in which every stack holding old holds new
// in its place.
func (s *snapshot) replaced(old, new *Table) *snapshot {
	return s.restacked(func(l []*Table) []*Table {
		i := slices.Index(l, old)
		if i < 0 {
			return nil
		}
		nl := slices.Clone(l)
		nl[i] = new
		return nl
	})
}

// report lists what the snapshot holds, for the shard's registration.
func (s *snapshot) report() []topo.Loaded {
	var out []topo.Loaded
	for _, name := range slices.Sorted(maps.Keys(s.models)) {
		vs := s.models[name]
		for _, v := range slices.Sorted(maps.Keys(vs)) {
			ver := vs[v]
			l := topo.Loaded{Model: name, Version: v}
			for p, t := range ver.layers {
				if t != nil {
					l.Have, l.IDs = append(l.Have, uint32(p)), append(l.IDs, ver.ids[p])
				}
			}
			out = append(out, l)
		}
	}
	return out
}
