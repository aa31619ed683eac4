// Package manager is the control plane: the one owner of what is served.
// It decides, per model, which version is live, which is staged, which
// are kept on standby for rollback, and which shards hold each partition,
// and publishes that as the serving map in etcd
// (/cumulus/CLUSTER/models/NAME). Shards and routers follow the map and
// never choose a version themselves.
//
// The decisions are one pure function, Decide(state, event) → (state,
// actions) in decide.go: events (events.go) are repository scans,
// validation results, shard reports and operator commands; actions are
// validations to run and audit entries. The records it reads and returns
// are in state.go; how versions enter (versions.go), their chains
// (chains.go), operators' commands (commands.go), the keep policy
// (keep.go), routers in a rollout (routers.go) and which shards are
// trusted and hold what (trust.go) each have a file. Every version has a phase (discovered, validating,
// rejected with its reason, ready, staging, live, canary, standby,
// retired) and every model the operator's intent (follow the newest valid
// version, or a pin, and perhaps a canary). A rollout stages the target, commits it once every assigned
// replica reports it with the content the manager validated, and keeps
// the previous version on standby; a rollback pins a standby version and,
// since it is loaded, commits at once: only the map changes. Moves are
// make before break. Tests replay scenarios event by event with no clock
// or socket (state_test.go).
//
// Gates (gatestate.go, gates.go, servedgates.go): a staged version is
// committed only once its gates pass — finite (checked with its files),
// golden requests and a hold-out set (sent to it where it is served, by
// a router of the manager's own that alone routes staged versions), and
// the operator's validator program. A failed gate rejects it; a gate that
// could not run is asked again. A canary (canary.go) is a version staged
// and gated like a rollout, then served to a share of the traffic beside
// the live version, which meanwhile stays where it is.
//
// Trust: shards report the content identity of each partition they
// verified (codec.PartitionIdentity); only reports matching the identity
// the manager validated count, and a shard reporting other content is
// assigned nothing of that model. A report counts only if it follows a map
// record at least as recent as the placement and the version's being kept
// (ModelState.Seq, ShardInfo.Applied), since an older one may list what
// the shard is about to drop.
//
// Runtime (manager.go): one goroutine applies events in order; validator
// goroutines check files off that loop; the gate runner (gates.go) runs
// one staged version's gates at a time, with its router started when a
// gate first needs it; watches follow the shards, the routers and the
// guard key. The state is persisted under
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
// With Options.Raft (raftmanager.go, raftstate.go, fence.go, members.go)
// the state is a raft group's instead: the leader commits each decision's
// result to the group's log (internal/raftgroup, on internal/raftstore's
// pebble) before it publishes the serving map, fenced by its term;
// followers apply the log to the same state machine; the audit log is
// kept by count and age. A group that holds nothing imports the state
// kept in etcd.
//
// Not yet here (later work): followers forwarding changes to the leader
// (they answer 503 naming it), draining a shard before it leaves.
package manager
