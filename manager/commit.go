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
			si, ok := shards[id]
			if !ok || !slices.ContainsFunc(si.Loaded, func(l topo.Loaded) bool {
				return l.Model == a.Model && l.Version == a.Version && slices.Contains(l.Have, uint32(p))
			}) {
				return false
			}
		}
	}
	return true
}
