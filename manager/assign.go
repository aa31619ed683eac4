package manager

import (
	"github.com/cespare/xxhash/v2"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// Model is what Assign needs to know of a model.
type Model struct {
	Name       string
	Version    uint64
	Partitions uint32
}

// Assign decides which shards hold each partition of each model: a pure
// function of its inputs, so every manager replica and every test replays
// it identically. shards must be sorted. Partition p of a model goes to
// shards[(offset + p + r) mod S] for replica r, where offset spreads
// different models' first partitions across shards. Replicas beyond the
// number of shards are not made.
func Assign(models []Model, shards []string, replicas int) []topo.Assignment {
	if len(shards) == 0 {
		return nil
	}
	replicas = max(1, min(replicas, len(shards)))
	out := make([]topo.Assignment, 0, len(models))
	for _, m := range models {
		a := topo.Assignment{Model: m.Name, Version: m.Version, Partitions: m.Partitions, Replicas: make([][]string, m.Partitions)}
		offset := int(xxhash.Sum64String(m.Name) % uint64(len(shards)))
		for p := range int(m.Partitions) {
			for r := range replicas {
				a.Replicas[p] = append(a.Replicas[p], shards[(offset+p+r)%len(shards)])
			}
		}
		out = append(out, a)
	}
	return out
}
