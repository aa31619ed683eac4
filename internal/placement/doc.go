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
// Cost: O(partitions × replicas × shards) for what must be placed anew,
// O(partitions × replicas) for what stays (a rank is hashed only where
// a shard is over its quota); 10,000 partitions over 100 shards placed
// from nothing take 13–17 ms (BenchmarkPlace10k), 4,096 over 256 in 4
// zones after one shard left about 7 ms (BenchmarkPlaceShardLeaves),
// both on this project's 2-core machine under load. Tests: movement bounds
// over random shard names, weighted balance, zones, determinism
// (placement_test.go).
package placement
