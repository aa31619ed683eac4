package placement

import (
	"fmt"
	"testing"
)

// zonedShards are n shards of equal weight, shard-0000 on, in 4 zones
// round robin: the simulated cluster of the manager's scale tests.
func zonedShards(n int) []Shard {
	var shards []Shard
	for i := range n {
		shards = append(shards, Shard{ID: fmt.Sprintf("shard-%04d", i), Weight: 1, Zone: fmt.Sprintf("zone-%d", i%4)})
	}
	return shards
}

// BenchmarkPlaceShardLeaves: 4,096 partitions, replicas 2, over 256
// shards in 4 zones, placed again once one shard has left (what a
// manager does when a shard leaves).
func BenchmarkPlaceShardLeaves(b *testing.B) {
	shards := zonedShards(256)
	cur := Place("m0", nil, 4096, 2, shards)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		Place("m0", cur, 4096, 2, shards[1:])
	}
}

// BenchmarkPlaceShardJoins: the same cluster placed again once a 257th
// shard has joined (every other shard's quota shrinks: each ranks what
// it holds to choose what it gives up).
func BenchmarkPlaceShardJoins(b *testing.B) {
	shards := zonedShards(257)
	cur := Place("m0", nil, 4096, 2, shards[:256])
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		Place("m0", cur, 4096, 2, shards)
	}
}
