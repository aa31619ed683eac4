package manager

import (
	"encoding/json"
	"fmt"
)

// A canary is a valid version an operator gives a share of a model's
// unpinned traffic (OpCanary) beside the live version, which the routers
// then call the stable one. It is staged and gated like a version about
// to go live, and served to its share only once every shard holds it,
// the routers can score it and its gates pass. While it is set the live
// version does not move on by itself: new versions are validated and
// wait. A canary ends pinned, so that nothing moves without the
// operator: OpPromote makes it live and pins it; OpCanaryOff pins the
// live version; a pin or a rollback replace it with theirs; a canary
// that can no longer be served (rejected by its gates, its files gone)
// is dropped, the live version pinned, and the drop audited.

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

// gatesSchema is the schema of a ModelState with a canary, golden
// requests or an accepted version: a manager of schema 2 would ignore
// the canary and move the live version on, commit a version without its
// golden gate, or reject an accepted one again.
const gatesSchema = 3

// MarshalJSON writes m with the schema its content needs (see
// topo.Schema): ModelStateSchema, or gatesSchema.
func (m ModelState) MarshalJSON() ([]byte, error) {
	type plain ModelState
	p := plain(m)
	p.Schema = ModelStateSchema
	if m.needsGatesSchema() {
		p.Schema = gatesSchema
	}
	return json.Marshal(p)
}

func (m *ModelState) needsGatesSchema() bool {
	if m.Canary != nil {
		return true
	}
	for _, v := range m.Versions {
		if v.Golden || v.Accepted != nil {
			return true
		}
	}
	return false
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
	case v.Phase.pending():
		return fmt.Errorf("%w: model %s version %d is not validated yet", ErrConflict, m.Name, c.Version)
	}
	if why := m.canaryUnservable(v); why != "" {
		return fmt.Errorf("%w: model %s version %d cannot be a canary: %s", ErrConflict, m.Name, c.Version, why)
	}
	if m.Canary != nil && m.Canary.Version == c.Version {
		m.Canary.Fraction = c.Fraction
		return nil
	}
	m.dropCanary()
	m.Canary = &Canary{Version: c.Version, Fraction: c.Fraction}
	return nil
}

// canaryOff applies OpCanaryOff: the canary is dropped and the live
// version pinned.
func (m *ModelState) canaryOff() error {
	if m.Canary == nil {
		return fmt.Errorf("%w: model %s has no canary", ErrConflict, m.Name)
	}
	m.dropCanary()
	m.Pin = m.Live
	return nil
}

// dropCanary takes the canary's share away; its version stays valid.
func (m *ModelState) dropCanary() {
	if m.Canary == nil {
		return
	}
	if v := m.version(m.Canary.Version); v != nil && v.Phase == PhaseCanary {
		v.unstage()
	}
	m.Canary = nil
}

// promote applies OpPromote: the serving canary goes live (the live
// version to standby, for rollback), pinned: following the newest valid
// version would otherwise move it on, or back, at once.
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
	m.Pin = v
	return nil
}

// canaryStage returns the version settle stages given the target, and
// whether it is the canary: with a canary set, the live version does not
// move on by itself, and the canary is staged until it serves. A canary
// that can no longer be served is dropped first, the live version
// pinned, and why is returned (dropped).
func (m *ModelState) canaryStage(target uint64, liveServable bool) (stage uint64, canary bool, dropped string) {
	if m.Canary == nil {
		return target, false, ""
	}
	if why := m.canaryUnservable(m.version(m.Canary.Version)); why != "" {
		dropped = fmt.Sprintf("canary %d dropped: %s; live version %d pinned", m.Canary.Version, why, m.Live)
		m.dropCanary()
		m.Pin = m.Live
		return m.target(liveServable), false, dropped
	}
	if liveServable && m.Live != 0 {
		target = m.Live
	}
	if !m.Canary.Serving && target == m.Live {
		return m.Canary.Version, true, ""
	}
	return target, false, ""
}

// canaryUnservable says why version v cannot be a canary ("" if it can).
func (m *ModelState) canaryUnservable(v *Version) string {
	switch {
	case v == nil:
		return "it left the state"
	case v.Version == m.Live:
		return "it is the live version"
	case v.Phase == PhaseRejected:
		return "it was rejected: " + v.Reason
	case !v.Phase.valid() || v.Phase == PhaseRetired:
		return fmt.Sprintf("it is %s", v.Phase)
	case v.Gone:
		return "it was removed from the repository"
	case v.Broken != "":
		return v.Broken
	}
	return ""
}
