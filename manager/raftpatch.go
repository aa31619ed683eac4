package manager

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// A model's change as a raft entry carries it (raftEntry schema 2): its
// head (the state but for its versions), the versions added or changed,
// and those gone. A version's identities come relative to another
// version of the state (the newest of its chain that the state has
// after the change), listing only the partitions whose identity
// differs; a version whose identities did not change carries none. So
// an entry costs what the decision changed: a delta's phase moving
// writes a few hundred bytes, not the model's state (150 KB at 1,024
// partitions with the versions the keep policy allows, in schema 1).

// modelPatch is one model's change.
type modelPatch struct {
	// Head is the model's state without its versions and replicas
	// (ModelState JSON).
	Head json.RawMessage `json:"head"`
	// Replicas, when set, replace the model's (placement changed).
	Replicas *[][]string    `json:"replicas,omitempty"`
	Put      []patchVersion `json:"put,omitempty"` // ascending
	Drop     []uint64       `json:"drop,omitempty"`
}

// patchVersion is a version new or changed. Its Info is as in the state,
// but that SameInfo says it is the member's own (unchanged), and Base
// says Info.IDs lists only the partitions of Changed, the others being
// version Base's.
type patchVersion struct {
	Version
	SameInfo bool     `json:"same_info,omitempty"`
	Base     uint64   `json:"ids_base,omitempty"`
	Changed  []uint32 `json:"ids_changed,omitempty"`
}

// patchOf is the change from om (nil: none) to nm; ok is false when
// there is none.
func patchOf(om, nm *ModelState) (p modelPatch, ok bool) {
	head := *nm
	head.Versions, head.Replicas = nil, nil
	p.Head, _ = json.Marshal(head)
	if om != nil {
		was := *om
		was.Versions, was.Replicas = nil, nil
		if b, _ := json.Marshal(was); string(b) == string(p.Head) {
			p.Head = nil // unchanged: filled in below if anything else changed
		}
	}
	if om == nil || !reflect.DeepEqual(om.Replicas, nm.Replicas) {
		r := nm.Replicas
		p.Replicas = &r
	}
	for i := range nm.Versions {
		v := &nm.Versions[i]
		var ov *Version
		if om != nil {
			ov = om.version(v.Version)
		}
		if ov != nil && sameVersion(ov, v) {
			continue
		}
		pv := patchVersion{Version: *v}
		switch {
		case v.Info == nil:
		case ov != nil && ov.Info != nil && (ov.Info == v.Info || reflect.DeepEqual(*ov.Info, *v.Info)):
			pv.Info, pv.SameInfo = nil, true
		default:
			pv.Base, pv.Changed, pv.Info = relativeIDs(nm, v)
		}
		p.Put = append(p.Put, pv)
	}
	if om != nil {
		for _, v := range om.Versions {
			if nm.version(v.Version) == nil {
				p.Drop = append(p.Drop, v.Version)
			}
		}
	}
	if p.Head == nil && p.Replicas == nil && len(p.Put) == 0 && len(p.Drop) == 0 {
		return p, false
	}
	if p.Head == nil {
		p.Head, _ = json.Marshal(head)
	}
	return p, true
}

// sameVersion reports whether two records of a version are alike; their
// identities are compared by reference (a decision never edits an Info
// in place, it replaces it).
func sameVersion(a, b *Version) bool {
	x, y := *a, *b
	if x.Info != y.Info && (x.Info == nil || y.Info == nil || !reflect.DeepEqual(*x.Info, *y.Info)) {
		return false
	}
	x.Info, y.Info = nil, nil
	x.Gating, y.Gating = false, false // not persisted
	return reflect.DeepEqual(x, y)
}

// relativeIDs is v's Info with its identities relative to the newest
// version of its chain in m that has them (base 0: all of them).
func relativeIDs(m *ModelState, v *Version) (base uint64, changed []uint32, info *topo.VersionInfo) {
	in := *v.Info
	for _, c := range v.Info.Chain {
		if c == v.Version {
			continue
		}
		if b := m.version(c); b != nil && b.Info != nil && len(b.Info.IDs) == len(in.IDs) {
			r := topo.NewVersionRecord(m.Name, in, c, b.Info.IDs)
			if r.Base != 0 {
				return r.Base, r.Changed, &r.Info
			}
			break
		}
	}
	return 0, nil, &in
}

// applyPatch is the state p makes of om (nil: none), or an error for a
// patch that does not apply to it: every member holds the same state, so
// every member refuses it alike.
func applyPatch(name string, om *ModelState, p modelPatch) (*ModelState, error) {
	nm, err := topo.Decode[ModelState]("raft entry: model "+name, p.Head)
	if err != nil {
		return nil, err
	}
	if nm.Name != name {
		return nil, fmt.Errorf("model state %q filed under %q", nm.Name, name)
	}
	nm.Schema = ModelStateSchema
	nm.Versions, nm.Replicas = nil, nil
	if om != nil {
		nm.Versions, nm.Replicas = slices.Clone(om.Versions), om.Replicas
	}
	if p.Replicas != nil {
		nm.Replicas = *p.Replicas
	}
	for i, pv := range p.Put {
		if i > 0 && pv.Version.Version <= p.Put[i-1].Version.Version {
			return nil, fmt.Errorf("model %s: versions put out of order", name)
		}
		v := pv.Version
		switch {
		case pv.SameInfo:
			var ov *Version
			if om != nil {
				ov = om.version(v.Version)
			}
			if ov == nil || ov.Info == nil {
				return nil, fmt.Errorf("model %s version %d: its identities are said unchanged, but it has none", name, v.Version)
			}
			v.Info = ov.Info
		case pv.Base != 0:
			b := nm.version(pv.Base)
			if b == nil || b.Info == nil || v.Info == nil {
				return nil, fmt.Errorf("model %s version %d: its identities are based on version %d, which it lacks", name, v.Version, pv.Base)
			}
			ids, err := topo.ChangedIDs(b.Info.IDs, pv.Changed, v.Info.IDs)
			if err != nil {
				return nil, fmt.Errorf("model %s version %d: %w", name, v.Version, err)
			}
			info := *v.Info
			info.IDs = ids
			v.Info = &info
		}
		at, found := slices.BinarySearchFunc(nm.Versions, v.Version, func(x Version, n uint64) int { return cmp.Compare(x.Version, n) })
		if found {
			nm.Versions[at] = v
		} else {
			nm.Versions = slices.Insert(nm.Versions, at, v)
		}
	}
	drop := map[uint64]bool{}
	for _, d := range p.Drop {
		drop[d] = true
	}
	if len(drop) > 0 {
		nm.Versions = slices.DeleteFunc(nm.Versions, func(x Version) bool { return drop[x.Version] })
	}
	return &nm, nil
}

// patchNames are the models of patches, sorted.
func patchNames(ps map[string]modelPatch) []string { return slices.Sorted(maps.Keys(ps)) }
