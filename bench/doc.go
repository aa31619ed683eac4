// Package bench holds Cumulus's workloads and load generator.
//
// Workloads (rank200, small) draw feature ids Zipf-distributed over the
// ranks of a model made by `cumulus model gen`, whose manifest records how
// ranks map to ids (codec.GenInfo). Run drives closed-loop load at a
// KServe gRPC endpoint with raw tensor contents: Concurrency callers, one
// request in flight each, for a bounded Duration or request count, and
// reports QPS, p50/p99/p999 latency and request size.
//
// Benchmarks are measurements, never tests: nothing in the test suite
// depends on timing. Peer baselines (Go map, Redis) join here with the
// storage-engine work.
package bench
