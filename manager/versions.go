// How versions enter the state: repository scans and validations.

package manager

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
)

// scanned records what the repository holds now: new versions are queued
// for validation, rejected ones whose files changed are queued again,
// and versions that left the repository are forgotten (a live one stays
// live, marked gone, until another version replaces it).
func (s *State) scanned(ev Scanned, p Policy) []Action {
	var acts []Action
	for _, name := range slices.Sorted(maps.Keys(ev.Models)) {
		if s.Models[name] == nil {
			s.Models[name] = &ModelState{Schema: ModelStateSchema, Name: name}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Models)) {
		m := s.Models[name]
		found := map[uint64]Found{}
		for _, f := range ev.Models[name] {
			found[f.Version] = f
		}
		kept := m.Versions[:0:0]
		for _, v := range m.Versions {
			if _, ok := found[v.Version]; ok {
				kept = append(kept, v)
				continue
			}
			switch {
			case v.Version == m.Live:
				v.Gone, v.Reason = true, "removed from the repository"
				kept = append(kept, v)
			case v.Version == m.Staged:
				m.Staged = 0
			}
		}
		m.Versions = kept
		if _, listed := ev.Models[name]; !listed && len(m.Versions) == 0 && m.Live == 0 {
			delete(s.Models, name) // its directory left, and nothing of it is served
			continue
		}
		for _, vn := range slices.Sorted(maps.Keys(found)) {
			f := found[vn]
			v := m.version(vn)
			if v == nil && vn <= m.Floor {
				continue // left the state
			}
			if v == nil {
				m.Versions = append(m.Versions, Version{Version: vn, Kind: f.Kind, Parent: f.Parent, Phase: PhaseDiscovered, Files: f.Files, PushedAt: sealedAt(f.Pushed)})
				m.pushed(f.Pushed, p)
				slices.SortFunc(m.Versions, func(a, b Version) int { return cmp.Compare(a.Version, b.Version) })
				v = m.version(vn)
			} else if v.Files == f.Files && !v.Phase.pending() {
				if v.Gone {
					v.Gone, v.Reason = false, ""
				}
				continue
			} else if v.Files != f.Files && v.Phase.valid() {
				// Files of a validated version changed under it. Shards
				// serve their own verified copies and refuse content other
				// than validated; check the files again to say what changed.
				v.Files, v.Gone, v.Reason = f.Files, false, "files changed after validation; checking them again (shards keep serving what they verified)"
				acts = append(acts, Validate{Model: name, Version: vn})
				continue
			}
			v.Files, v.Kind, v.Parent, v.Gone = f.Files, f.Kind, f.Parent, false
			if f.Err != "" {
				v.Phase, v.Reason, v.Checked, v.Info = PhaseRejected, f.Err, f.Files, nil
				continue
			}
			if v.Phase != PhaseValidating {
				v.Phase, v.Reason, v.Info = PhaseDiscovered, "", nil
			}
			acts = append(acts, Validate{Model: name, Version: vn})
		}
		if listed := ev.Listed[name]; listed != nil {
			acts = append(acts, m.checkChains(listed)...)
		}
	}
	return acts
}

// checked records a validation's result, unless the files changed since
// it started (a newer Validate is then on its way).
func (s *State) checked(ev Checked) {
	m := s.Models[ev.Model]
	v := s.version(ev.Model, ev.Version)
	if v == nil && m != nil && m.Chained[ev.Version] != "" {
		m.checkedChained(ev)
		return
	}
	if v == nil || v.Files != ev.Files {
		return
	}
	if v.Phase.valid() { // checked again after its files changed; what is served does not change
		switch {
		case ev.Err != "":
			v.Reason, v.Damaged = "files changed after validation and no longer match their manifest (shards keep serving what they verified): "+ev.Err, true
			m.breakChains(ev.Version)
		case ev.Info == nil || v.Info == nil || !slices.Equal(ev.Info.IDs, v.Info.IDs):
			v.Reason, v.Damaged = "the version's content was replaced after validation; shards serve and load only what was validated; publish new content as a new version", true
			m.breakChains(ev.Version)
		default:
			v.Reason, v.Checked, v.Damaged = "", ev.Files, false
		}
		return
	}
	if !v.Phase.pending() {
		return
	}
	v.Checked, v.Gates, v.Golden, v.Created = ev.Files, ev.Gates, ev.Golden, ev.Created
	if ev.Err != "" {
		v.Phase, v.Reason, v.Info = PhaseRejected, ev.Err, nil
		return
	}
	if ev.Info == nil {
		v.Phase, v.Reason = PhaseRejected, "validation gave no metadata"
		return
	}
	parts := uint32(len(ev.Info.IDs))
	if m.Partitions != 0 && parts != m.Partitions {
		v.Phase, v.Reason = PhaseRejected, fmt.Sprintf("has %d partitions; model %s has %d (fixed per model)", parts, m.Name, m.Partitions)
		return
	}
	info := *ev.Info
	v.Info, v.Bytes, v.Phase, v.Reason = &info, ev.Bytes, PhaseValidating, ""
}

// pushed raises the model's push marks to a new version's.
func (m *ModelState) pushed(marks map[string]codec.PushMark, p Policy) {
	if len(marks) == 0 {
		return
	}
	if m.Pushed == nil {
		m.Pushed = map[string]codec.PushMark{}
	}
	for name, mk := range marks {
		if mk.Seq > m.Pushed[name].Seq {
			m.Pushed[name] = mk
		}
	}
	trimMarks(m.Pushed, p.PushProducerTTL, cmp.Or(p.MaxPushProducers, codec.MaxPushProducers))
}

// sealedAt is when a delta with these marks was sealed: its newest
// mark's time (zero for none).
func sealedAt(marks map[string]codec.PushMark) time.Time {
	var at time.Time
	for _, mk := range marks {
		if mk.At.After(at) {
			at = mk.At
		}
	}
	return at
}
