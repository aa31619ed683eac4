package manager

import (
	"cmp"
	"encoding/json"
	"fmt"
)

// A canary is a valid version an operator gives a share of a model's
// unpinned traffic (OpCanary) beside the live version, which the routers
// then call the stable one. It is staged and gated like a version about
// to go live, and served to its share only once every shard holds it,
// the routers can score it and its gates pass. While it is set the live
// version does not move on by itself: new versions are validated and
// wait. OpPromote makes it live; OpCanaryOff, a pin or a rollback drop
// it; a canary that can no longer be served (rejected by its gates, its
// files gone) is dropped.

// Canary is a model's canary.
type Canary struct {
	Version  uint64  `json:"version"`
	Fraction float64 `json:"fraction"`
	// Serving: it has been staged and gated, and has its share (until
	// then it is the staged version, served to no one).
	Serving bool `json:"serving,omitempty"`
}

// MaxCanaryFraction bounds a canary's share of the traffic.
const MaxCanaryFraction = 0.5

// canarySchema is the schema of a ModelState with a canary: a manager of
// schema 2 would ignore the canary and move the live version on.
const canarySchema = 3

// MarshalJSON writes m with the schema its content needs (see
// topo.Schema): ModelStateSchema, or canarySchema when a canary is set.
func (m ModelState) MarshalJSON() ([]byte, error) {
	type plain ModelState
	p := plain(m)
	p.Schema = ModelStateSchema
	if m.Canary != nil {
		p.Schema = canarySchema
	}
	return json.Marshal(p)
}

// setCanary applies OpCanary: version c.Version gets c.Fraction of the
// traffic once staged and gated; a canary already serving that version
// only changes its share.
func (m *ModelState) setCanary(c Command) error {
	v := m.version(c.Version)
	switch {
	case !(c.Fraction > 0 && c.Fraction <= MaxCanaryFraction):
		return fmt.Errorf("%w: a canary's fraction must be above 0 and at most %g, not %v", ErrInvalid, MaxCanaryFraction, c.Fraction)
	case m.Live == 0:
		return fmt.Errorf("%w: model %s has nothing live: its first version goes live without a canary", ErrConflict, m.Name)
	case v == nil:
		return fmt.Errorf("%w: model %s has no version %d (versions: %s)", ErrConflict, m.Name, c.Version, list(m.numbers()))
	case c.Version == m.Live:
		return fmt.Errorf("%w: model %s version %d is the live version", ErrConflict, m.Name, c.Version)
	case !v.Phase.valid() || v.Phase == PhaseRetired:
		why := v.Reason
		if why == "" {
			why = "not validated yet"
		}
		return fmt.Errorf("%w: model %s version %d is %s: %s", ErrConflict, m.Name, c.Version, v.Phase, why)
	case v.Gone || v.Broken != "":
		return fmt.Errorf("%w: model %s version %d cannot be loaded: %s", ErrConflict, m.Name, c.Version, cmp.Or(v.Broken, "it was removed from the repository"))
	}
	if m.Canary != nil && m.Canary.Version == c.Version {
		m.Canary.Fraction = c.Fraction
		return nil
	}
	m.dropCanary()
	m.Canary = &Canary{Version: c.Version, Fraction: c.Fraction}
	return nil
}

// dropCanary takes the canary's share away; its version stays valid.
func (m *ModelState) dropCanary() {
	if m.Canary == nil {
		return
	}
	if v := m.version(m.Canary.Version); v != nil && v.Phase == PhaseCanary {
		v.Phase = PhaseReady
		if v.LiveSeq != 0 {
			v.Phase = PhaseStandby
		}
	}
	m.Canary = nil
}

// promote applies OpPromote: the serving canary goes live (the live
// version to standby, for rollback), and a pin moves to it.
func (m *ModelState) promote() error {
	switch {
	case m.Canary == nil:
		return fmt.Errorf("%w: model %s has no canary", ErrConflict, m.Name)
	case !m.Canary.Serving:
		return fmt.Errorf("%w: model %s's canary, version %d, is not serving yet (staged and gated first: see its reason)", ErrConflict, m.Name, m.Canary.Version)
	}
	v := m.Canary.Version
	m.Canary = nil
	m.commit(v)
	if m.Pin != 0 {
		m.Pin = v
	}
	return nil
}

// canaryStage returns the version settle stages given the target, and
// whether it is the canary: with a canary set, the live version does not
// move on by itself, and the canary is staged until it serves. A canary
// that can no longer be served is dropped first.
func (m *ModelState) canaryStage(target uint64, liveServable bool) (stage uint64, canary bool) {
	if m.Canary == nil {
		return target, false
	}
	v := m.version(m.Canary.Version)
	if v == nil || !v.Phase.valid() || v.Phase == PhaseRetired || v.Gone || v.Broken != "" || v.Version == m.Live {
		m.dropCanary()
		return target, false
	}
	if liveServable && m.Live != 0 {
		target = m.Live
	}
	if !m.Canary.Serving && target == m.Live {
		return v.Version, true
	}
	return target, false
}
