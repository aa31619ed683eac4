// Package placement decides which shards hold the replicas of a model's
// partitions: a pure, deterministic function (the same inputs give the
// same answer on every manager), which takes the current placement as an
// input and moves only what must move.
//
// Each shard gets a quota of the model's replica slots in proportion to
// its weight (largest remainder, ties spread by a hash of the model and
// the shard, so that different models round onto different shards).
// Current replicas stay where they are while their shard is within its
// quota and the partition's replicas stay on distinct shards (and
// distinct zones, where there are enough); the rest go to the shards
// furthest below their quota. So adding one shard of N moves about 1/(N+1)
// of the replicas, all to the new one, and removing a shard moves only its
// own.
//
// A shard may be bounded by its room (what fits in its memory budget
// beside other models): its quota is then at most its room while other
// shards have room; the replicas that fit nowhere are shared by weight
// all the same.
//
// Which replicas an over-quota shard gives up, and ties among shards
// with equal room, go by a rank: rendezvous hashing, each shard's hash of
// the model and its ID mixed with the partition (SplitMix64's finaliser).
//
// Cost: O(partitions × replicas × shards) for what must be placed anew,
// O(partitions × replicas) for what stays, on shard indexes, not names.
// A zone may force a replica past a shard's quota, which the next pass
// trims: a join at 4,096 partitions over 257 shards in 4 zones takes 7
// passes, each after the first costing only what it changes (again). On
// this project's 2-core machine under load: 10,000 partitions over 100
// shards placed from nothing 8–17 ms (BenchmarkPlace10k); 4,096 over 256
// in 4 zones after one shard left 0.6–0.7 ms
// (BenchmarkPlaceShardLeaves), after one joined 0.6–0.7 ms
// (BenchmarkPlaceShardJoins). Tests: movement bounds over random shard
// names and at 4,096 partitions, weighted balance, zones, determinism
// (placement_test.go); later passes as whole ones (again_test.go).
package placement
