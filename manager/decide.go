// Decide, and settling a model: staging, committing, handing over.

package manager

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// Decide applies one event to the state: a pure, deterministic function
// (no clock, no I/O), so tests replay scenarios event by event. It
// returns the next state (s is not changed), the actions to carry out,
// and for a refused Command the reason (the audit entry is among the
// actions either way).
//
// An event about one model (a validation's progress, an operator's call
// on it) copies and settles that model only: the next state shares every
// other model with s, unchanged, so what an event costs — here and in
// what the manager then writes — does not grow with the other models.
func Decide(s *State, ev Event, p Policy) (*State, []Action, error) {
	n := &State{Models: maps.Clone(s.Models), Shards: s.Shards, Routers: s.Routers, Cordoned: s.Cordoned}
	if n.Models == nil {
		n.Models = map[string]*ModelState{}
	}
	n.deciding = true // n is Decide's own until it returns: budgetTotal may keep its sum in it
	defer func() { n.deciding, n.replicaBytes = false, 0 }()
	touched := slices.Sorted(maps.Keys(s.Models))
	switch ev := ev.(type) {
	case Started:
		touched = []string{ev.Model}
	case Checked:
		touched = []string{ev.Model}
	case GatesChecked:
		touched = []string{ev.Model}
	case Command:
		if ev.Model != "" {
			touched = []string{ev.Model}
		}
	case Scanned:
		for name := range ev.Models {
			if s.Models[name] == nil {
				touched = append(touched, name)
			}
		}
		slices.Sort(touched)
	}
	for _, name := range touched {
		if m := s.Models[name]; m != nil {
			n.Models[name] = m.clone()
		}
	}
	var acts []Action
	var err error
	switch ev := ev.(type) {
	case Scanned:
		acts = n.scanned(ev, p)
	case Started:
		if v := n.version(ev.Model, ev.Version); v != nil && v.Phase == PhaseDiscovered {
			v.Phase = PhaseValidating
		}
	case Checked:
		n.checked(ev)
	case ShardsChanged:
		n.Shards = ev.Shards
	case RoutersChanged:
		n.Routers = ev.Routers
	case GatesChecked:
		n.gatesChecked(ev)
	case Command:
		acts, err = n.command(ev)
		if err != nil {
			return s, append(acts, audit(ev, err.Error())), err
		}
	default:
		panic(fmt.Sprintf("manager: unknown event %T", ev))
	}
	for _, name := range touched {
		if m := n.Models[name]; m != nil {
			n.settle(m, p)
			m.count(s.Models[name])
			if was := s.Models[name]; (was == nil || was.Live != m.Live) && m.Live != 0 && !p.Now.IsZero() {
				m.version(m.Live).LiveAt = p.Now
			}
		}
	}
	acts = append(acts, n.pending...)
	n.pending = nil
	if c, ok := ev.(Command); ok {
		result := "ok"
		if m := n.Models[c.Model]; c.Op == OpPrune {
			result = "ok: nothing to remove"
			for _, a := range acts {
				if r, ok := a.(Remove); ok {
					result = "ok: removed " + list(r.Versions)
				}
			}
		} else if m != nil {
			result = fmt.Sprintf("ok: live %d", m.Live)
			if m.Live == 0 {
				result = "ok: nothing live yet"
			}
			if m.Staged != 0 {
				result += fmt.Sprintf(", staged %d", m.Staged)
			}
			if c := m.Canary; c != nil {
				result += fmt.Sprintf(", canary %d at %g", c.Version, c.Fraction)
			}
		}
		acts = append(acts, audit(c, result))
	}
	return n, acts, nil
}

func audit(c Command, result string) AuditEntry {
	return AuditEntry{Time: c.At, Op: c.Op, Model: c.Model, Version: c.Version, From: c.From, Shard: c.Shard, Reason: c.Reason, Result: result}
}

// settle brings one model to where its state says it should be: versions
// whose chains are resolved become ready or rejected, the target is
// staged and committed once every assigned replica holds it, partitions
// are handed over make-before-break, and standby versions beyond the keep
// policy are retired.
func (s *State) settle(m *ModelState, p Policy) {
	resolve(m)
	if m.Partitions == 0 || s.Shards == nil {
		return // nothing to place yet, or no word from the shards yet: decide nothing on ignorance
	}
	trusted := s.trusted(m)
	h := s.holding(m.Name)
	kc := &keptOf{h: h}
	assign := s.limitMoves(kc, m, s.placement(m, trusted, p), trusted, p.Replicas, p.MaxMoves)
	liveServable := true // only a removed live version can stop being so (nobody can load it again)
	if lv := m.version(m.Live); lv != nil && (lv.Gone || lv.Broken != "") {
		liveServable = s.servable(m, m.Live, trusted)
		what := "removed from the repository"
		if !lv.Gone {
			what = lv.Broken
		}
		if liveServable {
			lv.Reason = what + "; still served by the shards that hold it"
		} else {
			lv.Reason = what + "; no longer held whole by the shards: the newest other valid version takes over"
		}
	}
	stage, canary, dropped := m.canaryStage(m.target(liveServable), liveServable)
	if dropped != "" {
		s.pending = append(s.pending, AuditEntry{Time: p.Now, Op: "canary-dropped", Model: m.Name, From: "manager", Result: dropped})
	}
	if m.Staged != 0 && m.Staged != stage {
		if v := m.version(m.Staged); v != nil && v.Phase == PhaseStaging {
			v.unstage()
		}
		m.Staged = 0
	}
	if stage != 0 && stage != m.Live {
		v := m.version(stage)
		m.Staged = stage
		v.Phase = PhaseStaging
		held := s.allHold(h, m, assign, stage)
		switch {
		case !held:
			v.HeldAt = time.Time{}
		case v.HeldAt.IsZero():
			v.HeldAt = p.Now
		}
		routersOK := s.routersScore(m, v, p) // either way: its reason stays current
		switch {
		case !held || !routersOK || !s.gatesPass(m, v, p):
		case canary:
			v.Phase, m.Staged, m.Canary.Serving = PhaseCanary, 0, true
		default:
			m.commit(stage)
		}
	}
	if lv := m.version(m.Live); lv != nil && strings.HasPrefix(lv.Reason, reasonWithoutRouters) && s.routersAllScore(m.Name, m.Live) {
		lv.Reason = "" // the routers it went live without can score it now
	}
	m.Replicas = s.handover(kc, m, assign, trusted)
	m.retire(p.KeepVersions, p.KeepDeltas)
	m.forget()
}

// count bumps Seq when m's serving map record differs from old's, and
// notes from which Seq on the placement and each kept version have stood
// unchanged: a shard's report that follows a record at least that recent
// describes what the shard keeps (see holds).
func (m *ModelState) count(old *ModelState) {
	if m.Partitions == 0 {
		return
	}
	var was topo.Assignment
	if old != nil {
		was = old.Assignment()
	}
	now := m.Assignment()
	if old != nil && sameAssignment(was, now) {
		return
	}
	m.Seq++
	if old == nil || !sameReplicas(was.Replicas, now.Replicas) {
		m.PlaceSeq = m.Seq
	}
	for _, v := range now.Kept() {
		// (A version kept from before KeptSince was recorded gets it too.)
		if x := m.version(v); !slices.Contains(was.Kept(), v) || x.KeptSince == 0 {
			x.KeptSince = m.Seq
		}
	}
}

// sameAssignment is reflect.DeepEqual for two records of a model's map,
// at the cost of their fields: identities shared (as versions' records
// share them) are not compared one by one.
func sameAssignment(a, b topo.Assignment) bool {
	if a.Schema != b.Schema || a.Model != b.Model || a.Seq != b.Seq || a.Live != b.Live || a.Staged != b.Staged || a.Canary != b.Canary ||
		a.CanaryFraction != b.CanaryFraction || a.Partitions != b.Partitions || a.PlaceSeq != b.PlaceSeq ||
		!slices.Equal(a.Standby, b.Standby) || !maps.Equal(a.KeptSince, b.KeptSince) || !sameReplicas(a.Replicas, b.Replicas) ||
		len(a.Versions) != len(b.Versions) {
		return false
	}
	for i := range a.Versions {
		x, y := a.Versions[i], b.Versions[i]
		if !sameStrings(x.IDs, y.IDs) || !slices.Equal(x.Chain, y.Chain) {
			return false
		}
		x.IDs, y.IDs, x.Chain, y.Chain = nil, nil, nil, nil
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// sameStrings is slices.Equal, at once for the same slice.
func sameStrings(a, b []string) bool {
	if len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) {
		return true
	}
	return slices.Equal(a, b)
}

// sameReplicas reports whether two placements are equal.
func sameReplicas(a, b [][]string) bool {
	return slices.EqualFunc(a, b, func(x, y []string) bool { return slices.Equal(x, y) })
}

// resolve settles versions whose own files are verified: ready when
// their parent chain is valid, rejected when it is not.
func resolve(m *ModelState) {
	for i := range m.Versions {
		v := &m.Versions[i]
		if v.Phase != PhaseValidating || v.Info == nil {
			continue
		}
		if v.Kind == "delta" {
			pv := m.version(v.Parent)
			switch {
			case pv == nil && m.Chained[v.Parent] != "":
				// gone from the state, validated, and needed by a kept chain
			case pv == nil && v.Parent <= m.Floor:
				v.Phase, v.Reason, v.Info = PhaseRejected, fmt.Sprintf("parent version %d is retired (no longer kept); a delta must build on a version the manager keeps", v.Parent), nil
				continue
			case pv == nil:
				v.Phase, v.Reason, v.Info = PhaseRejected, fmt.Sprintf("parent version %d is not in the repository", v.Parent), nil
				continue
			case pv.Phase == PhaseRejected:
				v.Phase, v.Reason, v.Info = PhaseRejected, parentRejected(v.Parent), nil
				continue
			case !pv.Phase.valid():
				continue // wait for the parent's result
			}
		}
		if m.Partitions == 0 {
			m.Partitions = uint32(len(v.Info.IDs))
		}
		v.Phase = PhaseReady
	}
}

// target is the version that should be live: the pin while it is valid
// and in the repository, else the newest valid version in the repository;
// 0 when none. A live version whose directory was removed stays the
// target while liveServable (shards still hold every partition of it)
// and no newer one is valid: removing files is no way to roll back (that
// is what rollback is for). Once shards no longer hold it whole (one
// died, and none can load it again), the newest other valid version takes
// over rather than leave the model down.
func (m *ModelState) target(liveServable bool) uint64 {
	if m.Pin != 0 {
		if v := m.version(m.Pin); v != nil && v.Phase.valid() && (!v.Gone && v.Broken == "" || v.Version == m.Live && liveServable) {
			return m.Pin
		}
		if lv := m.version(m.Live); lv != nil && (lv.Gone || lv.Broken != "") && !liveServable {
			// The live version can be served no more: the most recently
			// live standby that can be loaded takes over, the pin staying
			// (it applies again once its version can be loaded).
			for _, sv := range m.Standby() {
				if x := m.version(sv); !x.Gone && x.Broken == "" {
					return sv
				}
			}
		}
		return m.Live
	}
	for i := len(m.Versions) - 1; i >= 0; i-- {
		if v := &m.Versions[i]; v.Phase.valid() && (!v.Gone && v.Broken == "" || v.Version == m.Live && liveServable) {
			return v.Version
		}
	}
	return m.Live
}

// servable reports whether every partition of version v has one of the
// trusted shards reporting it with the validated content (any report, however
// old: this asks whether anyone still has it, not whether to hand over).
func (s *State) servable(m *ModelState, v uint64, trusted []string) bool {
	x := m.version(v)
	if x == nil || x.Info == nil {
		return false
	}
	for p := range x.Info.IDs {
		if !slices.ContainsFunc(trusted, func(sid string) bool { return reported(s.Shards[sid], m, x, p) }) {
			return false
		}
	}
	return true
}
