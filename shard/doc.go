// Package shard is the parameter store: a process that holds some
// partitions of some model versions and answers batched lookups.
//
// Flow: the shard registers /cumulus/CLUSTER/shards/ID in etcd under a
// lease, watches the serving map (/cumulus/CLUSTER/models/), and for the
// partitions the map assigns it loads the live version, then the staged
// one, then the standby ones, and drops everything else (reconcile.go).
// It never chooses a version. Before loading, it checks that its
// repository's manifests describe exactly the content the map expects
// (the chain and each partition's identity, codec.PartitionIdentity): a
// shard pointed at another repository, or at files changed since the
// manager validated them, refuses and reports the mismatch rather than
// serve other parameters under the same name. It reports what it holds,
// with each partition's identity and the map record it follows (Applied).
// A refused load is retried with backoff (1 s doubling to 1 min), since
// its cause may go.
//
// Tables (table.go) are partition files used in place: resident on huge
// pages while Options.MemoryBudget allows, otherwise read-only mappings of
// the shard's own copies of the files in Options.DataDir (datadir.go),
// never of the repository's, which the shard does not control. A version
// staged beside the live one may be mapped; after the manager commits it,
// the old version is retired and the new one promoted to resident memory
// a partition at a time. A version's deltas are read through its view of
// one overlay per base partition (overlay.go, views.go), so a lookup
// costs the same at any chain length. docs/storage.md has the layout, the
// lookup and the measurements.
//
// Lookups (Service.Lookup) read an immutable snapshot through an atomic
// pointer: no locks on the request path. Goroutines: the gRPC server, the
// etcd watch, one loader, the lease keep-alive.
//
// Readiness and stopping (drain.go): gRPC health says SERVING only while
// the shard holds every partition of the live versions the map assigns
// it and its registration in etcd says so; a rolling restart waits for
// it before stopping the next shard. Drain stops without failing a
// lookup: NOT_SERVING, leave etcd, answer what still comes until a quiet
// moment, finish what is under way, stop.
//
// Tests: shard_test.go starts a real shard against an embedded etcd; the
// router's integration tests run several.
package shard
