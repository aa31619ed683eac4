package manager

import (
	"fmt"
	"slices"
	"strings"
)

// passed reports whether v's last run of gate let it through: it
// passed, had nothing to check against, or failed on a version an
// operator accepted.
func (v *Version) passed(gate string) bool {
	for _, g := range v.Gates {
		if g.Gate == gate {
			return g.Outcome == "passed" || g.Outcome == "skipped" || g.Outcome == "accepted"
		}
	}
	return false
}

// stagedGates are the gates to run on v once staged, in order.
func (p Policy) stagedGates(m *ModelState, v *Version) []string {
	var out []string
	if v.Golden {
		out = append(out, GateGolden)
	}
	if slices.Contains(p.Holdout, m.Name) {
		out = append(out, GateHoldout)
	}
	return append(out, p.StagedGates...)
}

// gatesPass reports whether staged version v has passed every staged
// gate; if not, it asks for the ones it has not passed to run (once per
// staging: a failed gate rejects the version).
func (s *State) gatesPass(m *ModelState, v *Version, p Policy) bool {
	var run []string
	for _, g := range p.stagedGates(m, v) {
		if !v.passed(g) {
			run = append(run, g)
		}
	}
	if len(run) == 0 {
		return true
	}
	if !v.Gating {
		v.Gating = true
		s.pending = append(s.pending, RunGates{Model: m.Name, Version: v.Version, Live: m.Live, Gates: run})
	}
	if v.Reason == "" || strings.HasPrefix(v.Reason, reasonGating) {
		v.Reason = reasonGating + strings.Join(run, ", ")
	}
	return false
}

// The reasons a staged version waits on its gates with.
const (
	reasonGating    = "running gates: "
	reasonGateError = "a gate could not run (it is tried again): "
)

// gatesChecked records a staged version's gate outcomes: a failed gate
// rejects it, and the deltas built on it that are not served; settle
// then stages the next target (the live version serves untouched).
func (s *State) gatesChecked(ev GatesChecked) {
	m := s.Models[ev.Model]
	v := s.version(ev.Model, ev.Version)
	if v != nil {
		v.Gating = false // the run is over, whatever became of the version
	}
	if m == nil || v == nil || v.Phase != PhaseStaging {
		return // no longer staged: the outcome is moot
	}
	gates := slices.Clone(v.Gates) // shared with the state Decide was given
	var failed, errs []string
	for _, r := range ev.Results {
		if r.Outcome == "failed" && v.Accepted != nil && slices.Contains(v.Accepted.Gates, r.Gate) {
			r.Outcome, r.Reason = "accepted", r.Reason+" (accepted: "+v.Accepted.Reason+")"
		}
		gates = slices.DeleteFunc(gates, func(g GateResult) bool { return g.Gate == r.Gate })
		gates = append(gates, r)
		switch r.Outcome {
		case "failed":
			failed = append(failed, fmt.Sprintf("gate %s failed: %s", r.Gate, r.Reason))
		case "error":
			errs = append(errs, fmt.Sprintf("gate %s: %s", r.Gate, r.Reason))
		}
	}
	v.Gates = gates
	if strings.HasPrefix(v.Reason, reasonGating) || strings.HasPrefix(v.Reason, reasonGateError) {
		v.Reason = ""
	}
	if len(failed) == 0 && len(errs) > 0 {
		// Not the version's fault (the hold-out set unreadable, the
		// cluster unable to answer): settle asks for the gate again.
		v.Reason = reasonGateError + strings.Join(errs, "; ")
		return
	}
	if len(failed) == 0 {
		return
	}
	v.Phase, v.Reason, v.Info = PhaseRejected, strings.Join(failed, "; "), nil
	m.Staged = 0
	for changed := true; changed; {
		changed = false
		for i := range m.Versions {
			x := &m.Versions[i]
			if x.Kind == "delta" && (x.Phase == PhaseReady || x.Phase == PhaseStaging || x.Phase.pending()) {
				if pv := m.version(x.Parent); pv != nil && pv.Phase == PhaseRejected {
					x.Phase, x.Reason, x.Info, changed = PhaseRejected, parentRejected(x.Parent), nil, true
				}
			}
		}
	}
}

// accept accepts version c.Version, rejected by staged gates: it is
// validated again, and the gates that failed run again without
// rejecting it (their failures recorded as accepted, with c.Reason). The
// deltas rejected with it (their parent was) are validated again too.
// A version rejected for another reason — damaged files, the finite
// gate, whose non-finite parameters no shard loads — is refused.
func (m *ModelState) accept(c Command) ([]Action, error) {
	v := m.version(c.Version)
	switch {
	case v == nil:
		return nil, fmt.Errorf("%w: model %s has no version %d (versions: %s)", ErrConflict, m.Name, c.Version, list(m.numbers()))
	case strings.TrimSpace(c.Reason) == "":
		return nil, fmt.Errorf("%w: an accept needs a reason (it is audited)", ErrInvalid)
	case v.Phase != PhaseRejected:
		return nil, fmt.Errorf("%w: model %s version %d is %s, not rejected", ErrConflict, m.Name, c.Version, v.Phase)
	}
	var failed []string
	for _, g := range v.Gates {
		if g.Outcome == "failed" {
			failed = append(failed, g.Gate)
		}
	}
	switch {
	case slices.Contains(failed, GateFinite):
		return nil, fmt.Errorf("%w: model %s version %d failed the finite gate, which cannot be accepted: shards refuse to load non-finite parameters; publish a fixed version", ErrConflict, m.Name, c.Version)
	case len(failed) == 0 && v.Kind == "delta" && v.Reason == parentRejected(v.Parent):
		return nil, fmt.Errorf("%w: model %s version %d was rejected with its parent: accept version %d (the deltas on it are validated again with it)", ErrConflict, m.Name, c.Version, v.Parent)
	case len(failed) == 0:
		return nil, fmt.Errorf("%w: model %s version %d was not rejected by a gate but because %s; fix the cause (then rescan) rather than accept it", ErrConflict, m.Name, c.Version, v.Reason)
	}
	acts := []Action{m.rediscover(v)}
	v.Accepted = &Acceptance{Gates: failed, Reason: c.Reason}
	for changed := true; changed; {
		changed = false
		for i := range m.Versions {
			x := &m.Versions[i]
			if x.Kind == "delta" && x.Phase == PhaseRejected && x.Reason == parentRejected(x.Parent) {
				if pv := m.version(x.Parent); pv != nil && pv.Phase != PhaseRejected {
					acts, changed = append(acts, m.rediscover(x)), true
				}
			}
		}
	}
	return acts, nil
}

// rediscover sends v back to be validated from the start.
func (m *ModelState) rediscover(v *Version) Action {
	v.Phase, v.Reason, v.Checked = PhaseDiscovered, "", ""
	return Validate{Model: m.Name, Version: v.Version}
}

// parentRejected is the reason a delta is rejected with its parent.
func parentRejected(parent uint64) string {
	return fmt.Sprintf("parent version %d is rejected", parent)
}
