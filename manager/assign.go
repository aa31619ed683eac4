package manager

import (
	"slices"

	"github.com/cumulus-serving/cumulus/internal/placement"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// Assign decides which shards hold each partition of a model: a pure
// function of its inputs, so every manager replica and every test replays
// it identically (see internal/placement). It starts from current, the
// placement as last published (a move in progress lists its target
// first), and moves only what must move: to take in shards that joined,
// to leave shards that went, or to follow the shards' weights (their
// registrations' Weight and Zone), within their memory budgets (fit).
// Replicas beyond the number of shards are not made; with no shards,
// every list is empty.
func Assign(model string, current [][]string, partitions uint32, shards []string, infos map[string]topo.ShardInfo, replicas int, fit Fit) [][]string {
	ps := make([]placement.Shard, len(shards))
	weights := make([]float64, len(shards))
	for i, id := range shards {
		si := infos[id]
		ps[i] = placement.Shard{ID: id, Weight: si.Weight, Zone: si.Zone}
		if si.Budget > 0 && fit.PartitionBytes > 0 {
			ps[i].Bounded = true
			ps[i].Room = int(min(max(0, si.Budget-fit.Used[id])/fit.PartitionBytes, int64(partitions)))
		}
		if !(ps[i].Weight > 0) || ps[i].Weight > 1<<20 {
			ps[i].Weight = 1 // a report that says nothing usable: an equal share
		}
		if len(ps[i].Zone) > 64 {
			ps[i].Zone = ps[i].Zone[:64]
		}
		weights[i] = ps[i].Weight
	}
	// A shard's report is not trusted to claim the cluster: a weight is
	// held to maxWeightRatio times the median.
	slices.Sort(weights)
	if len(weights) > 0 {
		limit := maxWeightRatio * weights[len(weights)/2]
		for i := range ps {
			ps[i].Weight = min(ps[i].Weight, limit)
		}
	}
	return placement.Place(model, current, int(partitions), replicas, ps)
}

// Fit is what a model's placement must fit beside, for the shards that
// report a memory budget: the bytes one replica of one of its partitions
// takes, and the bytes other models' replicas take on each shard. The
// zero Fit bounds nothing.
type Fit struct {
	PartitionBytes int64
	Used           map[string]int64
}

// maxWeightRatio bounds a shard's weight against the median shard's.
const maxWeightRatio = 16
