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
// registrations' Weight and Zone), within its slice of their memory
// budgets (fit; a shard reporting none is not bounded).
// Replicas beyond the number of shards are not made; with no shards,
// every list is empty.
func Assign(model string, current [][]string, partitions uint32, shards []string, infos map[string]topo.ShardInfo, replicas int, fit Fit) [][]string {
	ps := make([]placement.Shard, len(shards))
	weights := make([]float64, len(shards))
	for i, id := range shards {
		si := infos[id]
		ps[i] = placement.Shard{ID: id, Weight: si.Weight, Zone: si.Zone}
		if !(ps[i].Weight > 0) || ps[i].Weight > 1<<20 {
			ps[i].Weight = 1 // a report that says nothing usable: an equal share
		}
		if len(ps[i].Zone) > 64 {
			ps[i].Zone = ps[i].Zone[:64]
		}
		weights[i] = ps[i].Weight
	}
	// A shard's report is not trusted to claim the cluster: a weight is
	// held to maxWeightRatio times the median, and so is a budget.
	slices.Sort(weights)
	if len(weights) > 0 {
		limit := maxWeightRatio * weights[len(weights)/2]
		for i := range ps {
			ps[i].Weight = min(ps[i].Weight, limit)
		}
	}
	var budgets []float64
	for _, id := range shards {
		if b := infos[id].Budget; b > 0 {
			budgets = append(budgets, float64(b))
		}
	}
	if fit.ReplicaBytes > 0 && len(budgets) > 0 {
		slices.Sort(budgets)
		limit := maxWeightRatio * budgets[len(budgets)/2]
		for i, id := range shards {
			if b := infos[id].Budget; b > 0 {
				// This model's slice of the budget, in partitions.
				room := min(float64(b), limit) * float64(partitions) / float64(fit.ReplicaBytes)
				ps[i].Bounded, ps[i].Room = true, int(min(room, float64(partitions)))
			}
		}
	}
	return placement.Place(model, current, int(partitions), replicas, ps)
}

// Fit is what a model's placement must fit, for the shards that report
// a memory budget: ReplicaBytes is the bytes of one replica of every
// model, of which the model placed gets its share of each budget (see
// budget.go). The zero Fit bounds nothing.
type Fit struct {
	ReplicaBytes int64
}

// maxWeightRatio bounds a shard's weight against the median shard's.
const maxWeightRatio = 16
