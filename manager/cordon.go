package manager

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// An operator cordons a shard to empty it before it is stopped: it is
// given nothing new, and every partition it holds is placed elsewhere;
// the handover is make-before-break as for any move, so the shard serves
// its partitions until their new replicas hold them, then is assigned
// nothing (empty), and can be stopped with no request failing, even
// with one replica. Cordons are cluster-wide and persisted.

// cordon applies OpCordon and OpUncordon.
func (s *State) cordon(c Command) error {
	if c.Shard == "" || len(c.Shard) > 128 || strings.ContainsFunc(c.Shard, func(r rune) bool { return unicode.IsControl(r) || r == '/' }) {
		return fmt.Errorf("%w: shard %q is not a shard name", ErrInvalid, c.Shard)
	}
	on := slices.Contains(s.Cordoned, c.Shard)
	switch {
	case c.Op == OpCordon && on, c.Op == OpUncordon && !on:
		return nil // already so
	case c.Op == OpCordon:
		if len(s.Cordoned) >= maxCordons {
			return fmt.Errorf("%w: %d shards are cordoned already; uncordon some first", ErrConflict, len(s.Cordoned))
		}
		s.Cordoned = append(slices.Clone(s.Cordoned), c.Shard)
		slices.Sort(s.Cordoned)
	default:
		s.Cordoned = slices.DeleteFunc(slices.Clone(s.Cordoned), func(id string) bool { return id == c.Shard })
	}
	return nil
}

// maxCordons bounds the cordon record.
const maxCordons = 1024

// placeable is trusted without the cordoned shards: where m's partitions
// may go. With every trusted shard cordoned, a cordon cannot empty the
// cluster: the shards m is placed on now stay placeable (nothing moves),
// or all of them if it is placed on none.
func (s *State) placeable(m *ModelState, trusted []string) []string {
	if len(s.Cordoned) == 0 {
		return trusted
	}
	out := slices.DeleteFunc(slices.Clone(trusted), func(id string) bool { return slices.Contains(s.Cordoned, id) })
	if len(out) > 0 {
		return out
	}
	out = slices.DeleteFunc(slices.Clone(trusted), func(id string) bool {
		return !slices.ContainsFunc(m.Replicas, func(reps []string) bool { return slices.Contains(reps, id) })
	})
	if len(out) > 0 {
		return out
	}
	return trusted
}

// ShardState is a shard's state in placement: "active", "cordoned" (it
// still holds partitions assigned to it), or "empty" (cordoned, and
// assigned nothing: it can be stopped).
func (s *State) ShardState(id string) string {
	if !slices.Contains(s.Cordoned, id) {
		return "active"
	}
	for _, m := range s.Models {
		for _, reps := range m.Replicas {
			if slices.Contains(reps, id) {
				return "cordoned"
			}
		}
	}
	return "empty"
}
