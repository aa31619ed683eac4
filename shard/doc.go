// Package shard is the parameter store: a process that holds some
// partitions of some model versions and answers batched lookups.
//
// Flow: the shard registers /cumulus/shards/ID in etcd under a lease,
// watches /cumulus/models/ for the manager's assignments, loads the
// partitions assigned to it (verified by the loader) into immutable
// Tables, and reports what it holds in its registration. Routers route
// only to what a shard reports. It keeps the committed (live) version and
// the target version's partitions and drops the rest, so a rollout never
// removes what routers still serve; a damaged file is refused, named in
// the registration's errors, and the live version keeps serving.
//
// Tables (table.go) are partition files used in place: resident on huge
// pages while Options.MemoryBudget allows, otherwise read-only mappings of
// the shard's own copies of the files in Options.DataDir (datadir.go),
// never of the repository's, which the shard does not control. A version
// staged beside the live one may be mapped; after the manager commits it,
// the old version is retired and the new one promoted to resident memory
// a partition at a time. docs/storage.md has the layout, the lookup and
// the measurements.
//
// Lookups (Service.Lookup) read an immutable snapshot through an atomic
// pointer: no locks on the request path. Goroutines: the gRPC server, the
// etcd watch, one loader, the lease keep-alive.
//
// Tests: shard_test.go starts a real shard against an embedded etcd; the
// router's integration tests run several.
package shard
