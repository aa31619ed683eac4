// Package manager is the control plane: it decides which version of each
// model is served and which shards hold each partition, and publishes
// that to etcd (/cumulus/models/NAME).
//
// Flow: scan the repository (on a timer, on Rescan, and when the set of
// live shards changes); for each model take the newest version that
// passes the validation gate (valid manifest, every file matching its
// checksums; results cached per version); Assign partitions to the live
// shards, a pure deterministic function; write the assignments that
// changed, in one etcd transaction, so routers see the serving map change
// at once.
//
// Moves are make before break: when shards join or leave, Assign moves
// partitions, and Handover (also pure) keeps each moved partition's
// previous holders assigned until every new holder reports having it.
//
// Rollouts are staged, committed, retired: an assignment names the target
// Version and the committed Live version; Ready (a pure function of the
// assignment and the shards' reports) decides when every replica holds the
// target, and then Live becomes the target. The manager reads Live back
// from etcd when it starts.
//
// Not yet here (later work): raft-replicated manager state, rollback and
// labels through an admin API, draining a shard before it leaves.
package manager
