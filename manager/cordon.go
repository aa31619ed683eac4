package manager

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"

	"github.com/cumulus-serving/cumulus/internal/topo"
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

// placement is where m's partitions go now, from where they are: on the
// trusted shards that are not cordoned, within their budgets, before
// limitMoves.
//
// A placement, once made, stands while its inputs do (the shards, their
// weights, zones and budgets, the model's size) and the replicas are on
// their way to it: each partition's replicas are among those it was
// placed from and those it is placed on. So a rebalance keeps one target
// while its moves are carried out a few at a time (Policy.MaxMoves), and
// the events meanwhile cost no placement (about 1 ms per model at 4,096
// partitions over 256 shards, on every event of a rebalance). A manager
// that takes over mid-way places afresh from where the replicas are,
// which moves no more than the first placement would have.
func (s *State) placement(m *ModelState, trusted []string, p Policy) [][]string {
	shards, fit := s.placeable(m, trusted), s.fit(m)
	key := placeKey(m, shards, s.Shards, p.Replicas, fit)
	if c := m.placed; c != nil && c.key == key && onTheWay(c.from, c.out, m.Replicas) {
		return c.out
	}
	out := Assign(m.Name, m.Replicas, m.Partitions, shards, s.Shards, p.Replicas, fit)
	m.placed = &placeMemo{key: key, from: m.Replicas, out: out}
	return out
}

// placeMemo is a placement and what it was made from (placeKey, and the
// replicas it started from). Never changed once made.
type placeMemo struct {
	key       string
	from, out [][]string
}

// onTheWay reports whether every partition's replicas in cur are among
// its replicas in from and in to.
func onTheWay(from, to, cur [][]string) bool {
	if len(cur) != len(to) || len(cur) != len(from) {
		return false
	}
	for p, reps := range cur {
		for _, id := range reps {
			if !slices.Contains(to[p], id) && !slices.Contains(from[p], id) {
				return false
			}
		}
	}
	return true
}

// placeKey fingerprints what Assign reads besides the current replicas.
func placeKey(m *ModelState, shards []string, infos map[string]topo.ShardInfo, replicas int, fit Fit) string {
	b := fmt.Appendf(nil, "%q/%d/%d/%d", m.Name, m.Partitions, replicas, fit.ReplicaBytes)
	for _, id := range shards {
		si := infos[id]
		b = fmt.Appendf(b, "|%q/%g/%q/%d", id, si.Weight, si.Zone, si.Budget) // (quoted: no zone can pass for another shard)
	}
	return string(b)
}

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

// limitMoves defers the moves of assign beyond max partitions of m
// loading at once onto any one shard (0: no bound), so that a rebalance
// does not load everything at once while the cluster serves: a
// partition whose move would exceed it keeps its current replicas that
// are still trusted, and moves once the shard has loaded what it was
// given. A partition with fewer trusted holders than replicas (a shard
// left, or was found holding other content) is never deferred. A
// partition counts as loading onto a shard it is newly assigned to until
// the shard holds every version kept of it. Deterministic: partitions in
// order.
func (s *State) limitMoves(kc *keptOf, m *ModelState, assign [][]string, trusted []string, replicas, max int) [][]string {
	prev := m.Replicas
	if max <= 0 || len(prev) != len(assign) || sameReplicas(prev, assign) {
		return assign // (nothing moves: nothing to limit)
	}
	all := kc.of(s, m)
	// holdsAll: id holds partition p of every kept version, by a report
	// that follows the latest placement (the shard has loaded it).
	holdsAll := func(id string, p int) bool { follows, _ := all(id, p); return follows }
	// reports: id's report lists partition p of every kept version, however
	// old the report (it holds it, if it may be about to drop it): a
	// partition with such a holder is moving, not being placed for the
	// first time. (Every placement change makes reports briefly older than
	// it: holdsAll would then see no holder at all, and let every move
	// through at once.)
	reports := func(id string, p int) bool { _, r := all(id, p); return r }
	isTrusted := setOf(trusted)
	// Moves under way: published (in prev and assign), not held yet. A
	// first placement (nothing held anywhere) is not a move. They are
	// counted only for the shards that partitions would move onto now,
	// the only counts read below: a rebalance moves onto a few shards,
	// and the count would cost a lookup for every replica of the model.
	targets := map[string]bool{}
	for p, reps := range assign {
		for _, id := range reps {
			if !slices.Contains(prev[p], id) {
				targets[id] = true
			}
		}
	}
	loading := map[string]int{}
	moving := func(p int, id string) bool {
		return !holdsAll(id, p) && slices.ContainsFunc(prev[p], func(o string) bool { return o != id && reports(o, p) })
	}
	for p, reps := range assign {
		for _, id := range reps {
			if targets[id] && slices.Contains(prev[p], id) && moving(p, id) {
				loading[id]++
			}
		}
	}
	out := slices.Clone(assign)
	for p, reps := range assign {
		if !slices.ContainsFunc(reps, func(id string) bool { return !slices.Contains(prev[p], id) }) {
			continue // nothing new onto it: nothing to defer
		}
		holders := slices.DeleteFunc(slices.Clone(prev[p]), func(o string) bool { return !isTrusted[o] || !reports(o, p) })
		var onto []string
		for _, id := range reps {
			if !slices.Contains(prev[p], id) && len(holders) > 0 {
				onto = append(onto, id)
			}
		}
		if len(holders) >= min(replicas, len(trusted)) && slices.ContainsFunc(onto, func(id string) bool { return loading[id] >= max }) {
			out[p] = holders
			continue
		}
		for _, id := range onto {
			loading[id]++
		}
	}
	return out
}

// Move is a change of a partition's replicas the manager makes or would
// make (Plan).
type Move struct {
	Model     string   `json:"model"`
	Partition uint32   `json:"partition"`
	From      []string `json:"from"` // the replicas published now
	To        []string `json:"to"`   // where placement puts it
}

// Plan lists, for every model, the partitions whose published replicas
// differ from where placement puts them now: moves under way, and moves
// waiting for a shard to finish loading (Policy.MaxMoves). It changes
// nothing.
func (s *State) Plan(p Policy) []Move {
	var out []Move
	for _, name := range slices.Sorted(maps.Keys(s.Models)) {
		m := s.Models[name]
		if m.Partitions == 0 || s.Shards == nil {
			continue
		}
		mc := *m // (placement keeps its result in the model: in a copy, as Plan changes nothing)
		target := s.placement(&mc, s.trusted(m), p)
		for i, to := range target {
			var from []string
			if i < len(m.Replicas) {
				from = m.Replicas[i]
			}
			if !slices.Equal(from, to) {
				out = append(out, Move{Model: name, Partition: uint32(i), From: append([]string{}, from...), To: to})
			}
		}
	}
	return out
}
