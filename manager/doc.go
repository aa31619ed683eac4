// Package manager is the control plane: the one owner of what is served.
// It decides, per model, which version is live, which is staged, which
// are kept on standby for rollback, and which shards hold each partition,
// and publishes that as the serving map in etcd
// (/cumulus/CLUSTER/models/NAME). Shards and routers follow the map and
// never choose a version themselves.
//
// The decisions are one pure function, Decide(state, event) → (state,
// actions) in state.go: events are repository scans, validation results,
// shard reports and operator commands; actions are validations to run and
// audit entries. Every version has a phase (discovered, validating,
// rejected with its reason, ready, staging, live, standby, retired) and
// every model the operator's intent (follow the newest valid version, or
// a pin). A rollout stages the target, commits it once every assigned
// replica reports it with the content the manager validated, and keeps
// the previous version on standby; a rollback pins a standby version and,
// since it is loaded, commits at once: only the map changes. Moves are
// make before break. Tests replay scenarios event by event with no clock
// or socket (state_test.go).
//
// Trust: shards report the content identity of each partition they
// verified (codec.PartitionIdentity); only reports matching the identity
// the manager validated count, and a shard reporting other content is
// assigned nothing of that model. A report counts only if it follows a map
// record at least as recent as the placement and the version's being kept
// (ModelState.Seq, ShardInfo.Applied), since an older one may list what
// the shard is about to drop.
//
// Runtime (manager.go): one goroutine applies events in order; a
// validator goroutine checks files off that loop; a watch follows the
// shards, another the guard key. The state is persisted under
// /cumulus/CLUSTER/manager/ in the same etcd transaction as the map it
// derives, conditional on the guard key's revision (store.go), so a
// manager with a stale view cannot overwrite a newer map: its write fails,
// it reads again and decides again. A manager restarted at any point
// carries on from what was persisted.
//
// The admin API (admin.go) serves /admin/v1/ (bearer token), /metrics and
// /healthz; state-changing calls are applied one at a time by the loop
// and audited.
//
// Not yet here (later work): raft-replicated manager state (the next
// control-plane step), canary labels, draining a shard before it leaves.
package manager
