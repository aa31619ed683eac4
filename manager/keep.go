// The keep policy: commit, retire and forget.

package manager

import (
	"cmp"
	"slices"
)

// unstage sends a version that is no longer staged (or no longer the
// canary) back to ready, or to standby if it was live before (a rollback
// target: the keep policy decides); a gate run under way is moot.
func (v *Version) unstage() {
	v.Phase, v.Gating = PhaseReady, false
	if v.LiveSeq != 0 {
		v.Phase = PhaseStandby
	}
}

// commit makes v live; the previous live version becomes standby (or is
// forgotten, if it left the repository).
func (m *ModelState) commit(v uint64) {
	if old := m.version(m.Live); old != nil {
		if old.Gone {
			m.Versions = slices.DeleteFunc(m.Versions, func(x Version) bool { return x.Version == m.Live })
		} else {
			old.Phase = PhaseStandby
		}
	}
	m.LiveSeq++
	nv := m.version(v)
	nv.Phase, nv.LiveSeq = PhaseLive, m.LiveSeq
	m.Live, m.Staged = v, 0
}

// retire keeps the standby versions built on the live version's full
// version and on the keep most recently live other full versions, and of
// the deltas on each of those the newest keepDeltas; the rest are
// retired.
func (m *ModelState) retire(keep, keepDeltas int) {
	bases := map[uint64]bool{m.base(m.Live): true}
	standby := m.Standby()
	for _, v := range standby {
		b := m.base(v)
		if !bases[b] && keep > 0 {
			bases[b] = true
			keep--
		}
		if !bases[b] {
			m.version(v).Phase = PhaseRetired
		}
	}
	deltas := map[uint64]int{}
	for _, v := range slices.Backward(slices.Sorted(slices.Values(standby))) {
		x := m.version(v)
		if x.Phase != PhaseStandby || x.Kind != "delta" {
			continue
		}
		if b := m.base(v); deltas[b] < keepDeltas {
			deltas[b]++
		} else {
			x.Phase = PhaseRetired
		}
	}
}

// forget drops from the state what can no longer be served, staged or
// rolled back to, raising Floor so that scans do not find it again:
// retired versions; ready versions older than the live one that no
// pending delta builds on; of the other ready versions, all but the
// newest few (pin targets); and rejected versions beyond the newest
// keepRejected. The live, staged and pinned versions always stay.
func (m *ModelState) forget() {
	parents := map[uint64]bool{}
	for _, v := range m.Versions {
		if v.Phase.pending() && v.Kind == "delta" {
			parents[v.Parent] = true
		}
	}
	ready, rejected := 0, 0
	drop := func(v Version) bool {
		if v.Version == m.Live || v.Version == m.Staged || v.Version == m.Pin || v.Version == m.canaryVersion() || parents[v.Version] {
			return false
		}
		switch v.Phase {
		case PhaseRetired:
			return true
		case PhaseReady:
			ready++
			return v.Version < m.Live || ready > keepReady
		case PhaseRejected:
			rejected++
			return rejected > keepRejected
		}
		return false
	}
	kept := m.Versions[:0:0]
	var dropped []Version
	for _, v := range slices.Backward(m.Versions) {
		if drop(v) {
			m.Floor = max(m.Floor, v.Version)
			dropped = append(dropped, v)
			continue
		}
		kept = append(kept, v)
	}
	if len(kept) != len(m.Versions) {
		slices.Reverse(kept)
		m.Versions = kept
	}
	// Remember, by fingerprint, what kept chains need of what left.
	need := map[uint64]bool{}
	for _, v := range m.Versions {
		if v.Info != nil {
			for _, c := range v.Info.Chain {
				need[c] = true
			}
		}
	}
	for _, v := range dropped {
		if need[v.Version] {
			if m.Chained == nil {
				m.Chained = map[uint64]string{}
			}
			var ids []string
			if v.Info != nil {
				ids = v.Info.IDs
			}
			m.Chained[v.Version] = chainedEntry(cmp.Or(v.Checked, v.Files), ids)
		}
	}
	for c := range m.Chained {
		if !need[c] || m.version(c) != nil {
			delete(m.Chained, c)
		}
	}
	if len(m.Chained) == 0 {
		m.Chained = nil
	}
}

// keepReady is how many ready versions newer than the live one a model
// keeps (the newest): what it would follow, and pin targets.
const keepReady = 10
