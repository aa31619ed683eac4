package manager

import (
	"slices"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// Ready reports whether every assigned replica of a's target version
// reports holding its partition: the moment a rollout may commit.
func Ready(a topo.Assignment, shards map[string]topo.ShardInfo) bool {
	for p, reps := range a.Replicas {
		for _, id := range reps {
			if !holds(shards[id], a.Model, uint32(p), a.Version) {
				return false
			}
		}
	}
	return true
}

// holds reports whether si reports holding partition p of model at one
// of versions.
func holds(si topo.ShardInfo, model string, p uint32, versions ...uint64) bool {
	return slices.ContainsFunc(si.Loaded, func(l topo.Loaded) bool {
		return l.Model == model && slices.Contains(versions, l.Version) && slices.Contains(l.Have, p)
	})
}

// Handover is what to publish on the way from prev, the assignment last
// published, to target: make before break. While some shard target names
// for partition p does not yet report holding it, the shards prev named
// for p that still report holding it (at target's Version or Live) stay
// assigned too, so a partition moved when shards join or leave keeps a
// serving replica until its new holders have loaded it. A pure function,
// like Assign; with prev for a different partition count it is target.
func Handover(target, prev topo.Assignment, shards map[string]topo.ShardInfo) topo.Assignment {
	if prev.Model != target.Model || prev.Partitions != target.Partitions || len(prev.Replicas) != len(target.Replicas) {
		return target
	}
	out := target
	out.Replicas = make([][]string, len(target.Replicas))
	for p, reps := range target.Replicas {
		out.Replicas[p] = reps
		if !slices.ContainsFunc(reps, func(id string) bool { return !holds(shards[id], target.Model, uint32(p), target.Version) }) {
			continue // every new holder has it
		}
		for _, id := range prev.Replicas[p] {
			si, ok := shards[id]
			if ok && !slices.Contains(out.Replicas[p], id) && holds(si, target.Model, uint32(p), target.Version, target.Live) {
				out.Replicas[p] = append(slices.Clip(out.Replicas[p]), id)
			}
		}
	}
	return out
}
