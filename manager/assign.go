package manager

import (
	"github.com/cespare/xxhash/v2"
)

// Assign decides which shards hold each partition of a model: a pure
// function of its inputs, so every manager replica and every test replays
// it identically. shards must be sorted. Partition p goes to
// shards[(offset + p + r) mod S] for replica r, where offset spreads
// different models' first partitions across shards. Replicas beyond the
// number of shards are not made; with no shards, every list is empty.
func Assign(model string, partitions uint32, shards []string, replicas int) [][]string {
	out := make([][]string, partitions)
	if len(shards) == 0 {
		return out
	}
	replicas = max(1, min(replicas, len(shards)))
	offset := int(xxhash.Sum64String(model) % uint64(len(shards)))
	for p := range out {
		for r := range replicas {
			out[p] = append(out[p], shards[(offset+p+r)%len(shards)])
		}
	}
	return out
}
