// Package shard is the parameter store: a process that holds some
// partitions of some model versions and answers batched lookups.
//
// Flow: the shard registers /cumulus/shards/ID in etcd under a lease,
// watches /cumulus/models/ for the manager's assignments, loads the
// partitions assigned to it (verified by the loader) into immutable
// Tables, and reports what it holds in its registration. Routers route
// only to what a shard reports. The previous version is dropped only
// once every assigned partition of the new one is loaded; a damaged file
// is refused, named in the registration's errors, and the old version
// keeps serving.
//
// Lookups (Service.Lookup) read an immutable snapshot through an atomic
// pointer: no locks on the request path. Goroutines: the gRPC server, the
// etcd watch, one loader, the lease keep-alive.
//
// Tests: shard_test.go starts a real shard against an embedded etcd; the
// router's integration tests run several.
package shard
