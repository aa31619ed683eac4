// Package router answers batched predict calls by fanning out to shards.
//
// Per request (Predict): validate → dedup feature ids across the whole
// batch, shared features included (a pooled open-addressing index) →
// group the distinct ids by partition (counting sort) → pick one replica
// per partition, rotating → one encoded lookup per shard, run on a
// bounded ants pool (the last on the caller's goroutine) → scatter the
// values into a zeroed slab → score LR or FM, computing the shared
// features' sums once for all rows.
//
// Routing state is an immutable table swapped atomically when etcd
// changes (watch in router.go, table.go); requests never lock. A model is
// served at its assigned version when every partition has a shard
// reporting it, otherwise at the newest complete version.
//
// A shard call answered FailedPrecondition, Unavailable or Canceled is
// asked again of another replica; failing that, the request runs again on
// the next routing table (Predict, lookup).
//
// Errors wrap one of ErrInvalidArgument, ErrNotFound, ErrUnavailable.
// Memory: the caller owns the Request; the Response is new per call.
//
// Tests: router_test.go runs the whole path on a dev cluster (real etcd,
// real sockets) against internal/reference's pairwise scorer;
// scale_test.go adds a shard under traffic and injects shard faults
// through Options.Dial.
package router
