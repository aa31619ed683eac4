// Routers in a rollout: a version goes live once every router can score it.

package manager

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// routersScore reports whether every router can score staged version v,
// or has been unable to for p.RouterWait since the shards came to hold
// it (v.HeldAt); v.Reason
// says which routers it waits for, or went live without. Routers not
// tracked (nil: the manager applies no shard report before the routers'
// first) hold nothing back.
//
// Only reasons of its own (reasonWaitingRouters, reasonWithoutRouters)
// are replaced or cleared: another reason (files changed, say) stays.
func (s *State) routersScore(m *ModelState, v *Version, p Policy) bool {
	if s.Routers == nil {
		return true
	}
	setReason := func(r string) {
		if v.Reason == "" || strings.HasPrefix(v.Reason, reasonWaitingRouters) || strings.HasPrefix(v.Reason, reasonWithoutRouters) {
			v.Reason = r
		}
	}
	var waiting, without []string
	for _, id := range slices.Sorted(maps.Keys(s.Routers)) {
		r := s.Routers[id]
		if r.CanScore(m.Name, v.Version) {
			continue
		}
		why := "it has not said it can score this version yet"
		for _, c := range r.Cannot {
			if c.Model == m.Name && c.Version == v.Version {
				why = c.Reason
			}
		}
		note := fmt.Sprintf("%s (%s)", id, why)
		if p.RouterWait > 0 && !p.Now.IsZero() && !v.HeldAt.IsZero() && p.Now.Sub(v.HeldAt) >= p.RouterWait {
			without = append(without, note)
		} else {
			waiting = append(waiting, note)
		}
	}
	switch {
	case len(waiting) > 0:
		setReason(reasonWaitingRouters + strings.Join(waiting, "; "))
		return false
	case len(without) > 0:
		setReason(fmt.Sprintf("%s %v no longer hold it back (they answer 503 for it until they can): %s", reasonWithoutRouters, p.RouterWait, strings.Join(without, "; ")))
	default:
		setReason("")
	}
	return true
}

// The reasons routersScore gives.
const (
	reasonWaitingRouters = "waiting for routers to be able to score it: "
	reasonWithoutRouters = "routers that could not score it within"
)

// routersAllScore reports whether every router tracked can score
// version v of model.
func (s *State) routersAllScore(model string, v uint64) bool {
	for _, r := range s.Routers {
		if !r.CanScore(model, v) {
			return false
		}
	}
	return true
}

// RouterDeadline is the earliest time a router's wait on a staged
// version runs out (zero: none is waited on), when Decide should run
// again: from the state itself (the shards hold the version, some router
// cannot score it), whatever its reason says. It may be past: the
// manager arms its timer only for one to come.
func (s *State) RouterDeadline(p Policy) time.Time {
	var first time.Time
	if p.RouterWait <= 0 {
		return first
	}
	for _, m := range s.Models {
		if v := m.version(m.Staged); v != nil && !v.HeldAt.IsZero() && !s.routersAllScore(m.Name, v.Version) {
			if t := v.HeldAt.Add(p.RouterWait); first.IsZero() || t.Before(first) {
				first = t
			}
		}
	}
	return first
}
