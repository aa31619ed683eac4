package shard

import (
	"maps"
	"slices"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// version is one model version as this shard holds it.
type version struct {
	m     *codec.Manifest
	parts []*Table // indexed by partition; nil where not held
}

// snapshot is the immutable set of everything loaded. Lookups read it
// through an atomic pointer; the loader replaces it whole.
type snapshot struct {
	models map[string]map[uint64]*version
}

func (s *snapshot) get(model string, v uint64) *version {
	return s.models[model][v]
}

// with returns a copy of s in which (model, version) holds partition p as t.
func (s *snapshot) with(m *codec.Manifest, p uint32, t *Table) *snapshot {
	n := s.clone()
	vs := maps.Clone(n.models[m.Name])
	if vs == nil {
		vs = map[uint64]*version{}
	}
	old := vs[m.Version]
	nv := &version{m: m, parts: make([]*Table, m.Partitions)}
	if old != nil {
		copy(nv.parts, old.parts)
	}
	nv.parts[p] = t
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
			nv := &version{m: ver.m, parts: make([]*Table, len(ver.parts))}
			held := false
			for p, t := range ver.parts {
				if t == nil {
					continue
				}
				if keep(name, v, uint32(p)) {
					nv.parts[p], held = t, true
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

func (s *snapshot) clone() *snapshot {
	return &snapshot{models: maps.Clone(s.models)}
}

// report lists what the snapshot holds, for the shard's registration.
func (s *snapshot) report() []topo.Loaded {
	var out []topo.Loaded
	for _, name := range slices.Sorted(maps.Keys(s.models)) {
		vs := s.models[name]
		for _, v := range slices.Sorted(maps.Keys(vs)) {
			ver := vs[v]
			l := topo.Loaded{Model: name, Version: v, Type: ver.m.Type, Dim: ver.m.Dim, Bias: ver.m.Bias,
				Partitions: ver.m.Partitions, Hash: ver.m.Hash}
			for p, t := range ver.parts {
				if t != nil {
					l.Have = append(l.Have, uint32(p))
				}
			}
			out = append(out, l)
		}
	}
	return out
}
