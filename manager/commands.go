// Operators' commands: rollback, pin, unpin, rescan, prune.

package manager

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// LiveMovedError refuses a call made against a live version that is no
// longer live. It is an ErrConflict.
type LiveMovedError struct {
	Model          string
	Live, Expected uint64
}

func (e *LiveMovedError) Error() string {
	now := "is live at " + strconv.FormatUint(e.Live, 10)
	if e.Live == 0 {
		now = "has nothing live"
	}
	return fmt.Sprintf("%v: model %s %s, not %s as the call expected: another call changed it; look again (cumulus admin show %s) before acting",
		ErrConflict, e.Model, now, versionName(e.Expected), e.Model)
}

func (e *LiveMovedError) Is(target error) bool { return target == ErrConflict }

// versionName is v, or "none" for 0.
func versionName(v uint64) string {
	if v == 0 {
		return "none"
	}
	return strconv.FormatUint(v, 10)
}

// Command operations.
const (
	OpRollback = "rollback"
	OpPin      = "pin"
	OpUnpin    = "unpin"
	OpRescan   = "rescan"
	OpPrune    = "prune"
	// OpAccept accepts a version the staged gates rejected: it is
	// validated again, and the gates that failed run again but do not
	// reject it.
	OpAccept = "accept"
	// OpCanary gives Version, once staged and gated, Fraction of the
	// model's unpinned requests; OpCanaryOff takes it away; OpPromote
	// makes the serving canary live.
	OpCanary    = "canary"
	OpCanaryOff = "canary-off"
	OpPromote   = "promote"
	// OpCordon gives shard Shard nothing new, and moves what it holds
	// to other shards (make before break); OpUncordon undoes it.
	OpCordon   = "cordon"
	OpUncordon = "uncordon"
)

// command applies an operator's call.
func (s *State) command(c Command) ([]Action, error) {
	switch c.Op {
	case OpCordon, OpUncordon:
		return nil, s.cordon(c)
	}
	if c.Op == OpRescan {
		var acts []Action
		for _, name := range slices.Sorted(maps.Keys(s.Models)) {
			m := s.Models[name]
			for i := range m.Versions {
				if v := &m.Versions[i]; v.Phase == PhaseRejected {
					acts = append(acts, m.rediscover(v))
				}
			}
		}
		return acts, nil
	}
	m := s.Models[c.Model]
	if m == nil {
		return nil, fmt.Errorf("%w: model %q", ErrNotFound, c.Model)
	}
	if c.Expect != nil && *c.Expect != m.Live {
		return nil, &LiveMovedError{Model: m.Name, Live: m.Live, Expected: *c.Expect}
	}
	switch c.Op {
	case OpPrune:
		return m.prune(c)
	case OpAccept:
		return m.accept(c)
	case OpCanary:
		return nil, m.setCanary(c)
	case OpCanaryOff:
		return nil, m.canaryOff()
	case OpPromote:
		return nil, m.promote()
	case OpUnpin:
		m.Pin = 0
	case OpPin:
		v := m.version(c.Version)
		switch {
		case v == nil && c.Version <= m.Floor:
			return nil, fmt.Errorf("%w: model %s version %d is retired: the manager no longer keeps it (see --keep-versions and --keep-deltas); publish its content as a new version to serve it again (versions kept: %s)", ErrConflict, m.Name, c.Version, list(m.numbers()))
		case v == nil:
			return nil, fmt.Errorf("%w: model %s has no version %d in the repository (versions: %s)", ErrConflict, m.Name, c.Version, list(m.numbers()))
		case !v.Phase.valid():
			why := v.Reason
			if why == "" {
				why = "not validated yet"
			}
			return nil, fmt.Errorf("%w: model %s version %d is %s: %s", ErrConflict, m.Name, c.Version, v.Phase, why)
		case v.Gone && c.Version != m.Live:
			return nil, fmt.Errorf("%w: model %s version %d was removed from the repository", ErrConflict, m.Name, c.Version)
		case v.Broken != "" && c.Version != m.Live:
			return nil, fmt.Errorf("%w: model %s version %d cannot be loaded: %s", ErrConflict, m.Name, c.Version, v.Broken)
		}
		m.Pin = c.Version
		m.dropCanary()
	case OpRollback:
		kept := m.Standby()
		to := c.Version
		if to == 0 {
			if to = m.RollbackTarget(); to == 0 {
				return nil, fmt.Errorf("%w: model %s has no standby version to roll back to (live %d; standby that cannot be loaded: %s)", ErrConflict, m.Name, m.Live, list(kept))
			}
		} else if !slices.Contains(kept, to) {
			why := "it is not kept for rollback"
			switch v := m.version(to); {
			case v == nil && to <= m.Floor:
				why = "it is retired (no longer kept; see --keep-versions and --keep-deltas)"
			case v == nil:
				why = "the repository has no such version"
			case v.Phase == PhaseRejected:
				why = "it was rejected: " + v.Reason
			case to == m.Live:
				why = "it is the live version"
			}
			return nil, fmt.Errorf("%w: model %s version %d: %s; standby versions: %s", ErrConflict, m.Name, to, why, list(kept))
		}
		if v := m.version(to); v.Gone || v.Broken != "" {
			why := cmp.Or(v.Broken, "it was removed from the repository")
			return nil, fmt.Errorf("%w: model %s version %d cannot be loaded: %s; standby versions: %s", ErrConflict, m.Name, to, why, list(kept))
		}
		m.Pin = to
		m.dropCanary()
	default:
		return nil, fmt.Errorf("%w: unknown operation %q", ErrInvalid, c.Op)
	}
	return nil, nil
}

// prune decides which version directories to remove: of the versions
// in the repository, every one outside the protected set (live, staged,
// pinned, standby, awaiting validation, ready and newer than the live
// one, and every version their chains need), keeping the c.Keep newest. A version above the floor that the
// state does not list is unknown yet (just published): never removed.
func (m *ModelState) prune(c Command) ([]Action, error) {
	if c.ReadOnly != "" {
		return nil, fmt.Errorf("%w: the manager cannot write to the repository (%s); prune needs write access", ErrConflict, c.ReadOnly)
	}
	if c.Keep < 0 {
		return nil, fmt.Errorf("%w: keep must be ≥ 0", ErrInvalid)
	}
	protected := map[uint64]bool{}
	need := func(v uint64) {
		for v != 0 && !protected[v] {
			protected[v] = true
			x := m.version(v)
			if x == nil {
				return
			}
			if x.Info != nil {
				for _, c := range x.Info.Chain {
					protected[c] = true
				}
				return
			}
			v = x.Parent
		}
	}
	for _, v := range append([]uint64{m.Live, m.Staged, m.Pin, m.canaryVersion()}, m.Standby()...) {
		need(v)
	}
	for _, v := range m.Versions {
		// Pending versions, and ready ones newer than the live one (what
		// the model follows once unpinned), are on their way to be served.
		if v.Phase.pending() || v.Phase == PhaseReady && v.Version > m.Live {
			need(v.Version)
		}
	}
	var removable []uint64
	for _, v := range slices.Sorted(slices.Values(c.Listed)) {
		if protected[v] || m.version(v) == nil && v > m.Floor {
			continue
		}
		removable = append(removable, v)
	}
	if len(removable) <= c.Keep {
		return nil, nil
	}
	return []Action{Remove{Model: m.Name, Versions: removable[:len(removable)-c.Keep]}}, nil
}
