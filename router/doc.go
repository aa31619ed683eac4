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
// changes (watch in router.go, table.go); requests never lock. The router
// follows the serving map: unpinned requests go to the live version, or
// to a canary for the share of keys the map gives it (canary.go: the
// same key, the same arm, on every router), requests pinned to a version
// to the live, canary or a standby one, never to a staged one — but in
// the manager's own gate router (Options.Staged), which routes staged
// versions to pinned requests for the validation gates. A partition goes only to shards the map assigns it to that
// are registered and report exactly the content identity the map
// expects. One watch covers the whole cluster prefix, so shard reports and
// the map arrive in etcd's revision order.
//
// A shard call answered FailedPrecondition, Unavailable, ResourceExhausted
// or Canceled is asked again of another replica; failing that, a request
// one of whose unanswered partitions some replica answered
// FailedPrecondition for (the table lags the cluster) runs again on the
// next routing table, whatever the others answered, and any other fails
// at once (Predict, lookup, work.strandedError).
//
// Deadlines: a request's is the shorter of its context's and
// DefaultTimeout, and travels with every shard call. Errors wrap one of
// ErrInvalidArgument, ErrNotFound, ErrUnavailable, ErrDeadlineExceeded,
// ErrResourceExhausted, ErrInternal (errors.go), or context.Canceled.
// Memory: the caller owns the Request; the Response is new per call.
//
// Tests: router_test.go runs the whole path on a dev cluster (real etcd,
// real sockets) against internal/reference's pairwise scorer;
// scale_test.go adds a shard under traffic and injects shard faults
// through Options.Dial.
package router
