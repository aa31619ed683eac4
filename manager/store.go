package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// store keeps the manager's state in etcd, beside the serving map it
// derives:
//
//	MANAGER/guard          guardRecord: bumped by every write
//	MANAGER/models/NAME/…  ModelState, in records that change with what changed (storerecords.go)
//	MANAGER/audit/SEQ      AuditEntry (the newest maxAudit)
//	MANAGER/cordons        cordonRecord: the cordoned shards
//
// Every write is one transaction conditional on the guard's revision as
// this manager last read or wrote it, so a manager with a stale view (a
// second manager, or one that was partitioned away) cannot overwrite a
// newer map: its write fails, it reads again and decides again.
type store struct {
	cli     *clientv3.Client
	cluster topo.Cluster
	writer  string // who writes, recorded in the guard
	rev     int64  // the guard's mod revision as last seen; 0: absent
	audit   uint64 // sequence number of the newest audit entry
	txns    int    // transactions the last commit took
	// group: this manager is a raft member, reading the state kept in
	// etcd only to import it.
	group bool
	// layout: the models whose state etcd holds as records of their own
	// (storerecords.go), as last read or written.
	layout map[string]*stored
}

type guardRecord struct {
	Schema int    `json:"schema"`
	Writer string `json:"writer"`
	Audit  uint64 `json:"audit"`
}

type cordonRecord struct {
	Schema int      `json:"schema"`
	Shards []string `json:"shards"`
}

// recordSchema is the schema of the guard, audit and cordon records (see
// topo.Schema); ModelStateSchema is the models' own.
const recordSchema = 1

// maxAudit is how many audit entries are kept.
const maxAudit = 1000

// ErrRaftCluster is returned when a manager without Options.Raft finds
// that the cluster's managers are a raft group (it has published).
var ErrRaftCluster = errors.New("manager: this cluster's managers are a raft group (it publishes the serving map): start this one with --raft-addr and --raft-dir and add it to the group")

// ErrStale is returned by commit when another writer changed the state
// since this store last read it.
var ErrStale = errors.New("manager: state changed by another writer; re-read")

func (st *store) guardKey() string         { return st.cluster.ManagerPrefix() + "guard" }
func (st *store) modelsPrefix() string     { return st.cluster.ManagerPrefix() + "models/" }
func (st *store) auditPrefix() string      { return st.cluster.ManagerPrefix() + "audit/" }
func (st *store) auditKey(n uint64) string { return fmt.Sprintf("%s%020d", st.auditPrefix(), n) }
func (st *store) cordonKey() string        { return st.cluster.ManagerPrefix() + "cordons" }
func (st *store) termKey() string          { return st.cluster.ManagerPrefix() + "term" }

// load reads the persisted models and cordons, and the guard's revision.
// A record that does not decode is reported: starting without it would
// forget what is live, or what is cordoned.
func (st *store) load(ctx context.Context) (*State, error) {
	resp, err := st.cli.Get(ctx, st.cluster.ManagerPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("manager: reading state: %w", err)
	}
	var models map[string]*ModelState
	recs := map[string]*modelRecords{}
	var cordoned []string
	st.rev, st.audit = 0, 0
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		switch {
		case key == st.termKey() && !st.group:
			return nil, ErrRaftCluster
		case key == st.guardKey():
			g, err := topo.Decode[guardRecord](key, kv.Value)
			if err != nil {
				return nil, fmt.Errorf("manager: %w", err)
			}
			st.rev, st.audit = kv.ModRevision, g.Audit
		case strings.HasPrefix(key, st.modelsPrefix()):
			if err := addRecord(recs, strings.TrimPrefix(key, st.modelsPrefix()), key, kv.Value); err != nil {
				return nil, err
			}
		case key == st.cordonKey():
			c, err := topo.Decode[cordonRecord](key, kv.Value)
			if err != nil {
				return nil, fmt.Errorf("manager: %w", err)
			}
			cordoned = slices.Compact(slices.Sorted(slices.Values(c.Shards)))
			cordoned = cordoned[:min(len(cordoned), maxCordons)]
		}
	}
	if models, st.layout, err = st.assembleAll(recs); err != nil {
		return nil, err
	}
	return &State{Models: models, Cordoned: cordoned}, nil
}

// change is what one decision writes.
type change struct {
	// patches are the models' states that changed, as raft entries of
	// schema 2 carry them; states, the same whole (ModelState JSON), as
	// etcd and schema 1 entries hold them (wholeStates).
	patches map[string]modelPatch
	states  map[string][]byte
	maps    []string // models whose serving map changed, sorted
	gone    []string // models that left the state (nothing of them served)
	audit   []AuditEntry
	// cordons is the cordon record to write; nil: unchanged.
	cordons []byte
}

func (c *change) empty() bool {
	return len(c.states) == 0 && len(c.patches) == 0 && len(c.maps) == 0 && len(c.gone) == 0 && len(c.audit) == 0 && c.cordons == nil
}

// wholeStates fills states with the whole state, as next has it, of each
// model patches name.
func (c *change) wholeStates(next *State) {
	if c.states == nil {
		c.states = map[string][]byte{}
	}
	for name := range c.patches {
		c.states[name], _ = json.Marshal(next.Models[name])
	}
}

// maxTxnOps is etcd's default limit on operations in one transaction.
const maxTxnOps = 128

// maxTxnBytes bounds the keys and values of one transaction: etcd refuses
// requests over --max-request-bytes (default 1.5 MiB), and this leaves
// room for the request's own framing. maxRecordBytes bounds one record.
// The manager's records stay far below (a model's state and map record
// under 256 KiB, TestStateStaysSmall); these bounds turn a record that
// does not into a clear error before anything is written.
const (
	maxTxnBytes    = 1 << 20
	maxRecordBytes = maxTxnBytes - 4<<10
)

// txnOps are writes to make in as few etcd transactions as its limits
// allow (maxTxnOps, maxTxnBytes), leaving room in each for one more
// operation of the writer's own (a guard, a fence).
type txnOps struct {
	ops   []clientv3.Op
	sizes []int
	// joined[i]: ops[i] goes in the transaction of ops[i-1] (one model's
	// records: see together), unless they cannot fit one.
	joined []bool
}

// together marks the operations added from now on until done is
// called as one group, written in one transaction where one can hold
// them.
func (t *txnOps) together() (done func()) {
	first := len(t.ops)
	return func() {
		for len(t.joined) < len(t.ops) {
			t.joined = append(t.joined, len(t.joined) > first)
		}
	}
}

// add appends u's operations.
func (t *txnOps) add(u txnOps) {
	for len(t.joined) < len(t.ops) {
		t.joined = append(t.joined, false)
	}
	t.ops, t.sizes = append(t.ops, u.ops...), append(t.sizes, u.sizes...)
	for i := range u.ops {
		t.joined = append(t.joined, i < len(u.joined) && u.joined[i])
	}
}

// isJoined reports whether ops[i] must follow ops[i-1] in its transaction.
func (t *txnOps) isJoined(i int) bool { return i < len(t.joined) && t.joined[i] }

// put adds a write of value at key, refusing a record etcd would refuse.
func (t *txnOps) put(key string, value []byte) error {
	if n := len(key) + len(value); n > maxRecordBytes {
		return fmt.Errorf("%w: %s is %d bytes, over the %d a write may carry; nothing written", ErrTooLarge, key, n, maxRecordBytes)
	}
	t.ops, t.sizes = append(t.ops, clientv3.OpPut(key, string(value))), append(t.sizes, len(key)+len(value))
	return nil
}

// delete adds the deletion of key.
func (t *txnOps) delete(key string) {
	t.ops, t.sizes = append(t.ops, clientv3.OpDelete(key)), append(t.sizes, len(key))
}

// deletePrefix adds the deletion of every key under prefix.
func (t *txnOps) deletePrefix(prefix string) {
	t.ops, t.sizes = append(t.ops, clientv3.OpDelete(prefix, clientv3.WithPrefix())), append(t.sizes, len(prefix))
}

// each calls write with the operations in order, in batches that fit one
// transaction each, at least once (with none when there are none), and
// stops at the first error.
//
// A group (together) is not split across transactions unless it alone
// cannot fit one: a transaction ends before a group that would not fit.
func (t *txnOps) each(write func(batch []clientv3.Op) error) error {
	ops, sizes, at := t.ops, t.sizes, 0
	for first := true; first || len(ops) > 0; first = false {
		n, bytes := 0, 0
		for n < len(ops) && n < maxTxnOps-1 && (n == 0 || bytes+sizes[n] <= maxTxnBytes) {
			bytes += sizes[n]
			n++
		}
		whole := n
		for n < len(ops) && n > 0 && t.isJoined(at+n) {
			n-- // back to the start of the group the limit cut
		}
		if n == 0 {
			n = whole // a group larger than a transaction: split after all
		}
		if err := write(ops[:n:n]); err != nil {
			return err
		}
		ops, sizes, at = ops[n:], sizes[n:], at+n
	}
	return nil
}

// ErrTooLarge is returned by commit for a record etcd would refuse.
var ErrTooLarge = errors.New("manager: record too large for etcd")

// commit writes c, with mapOps (the serving map's records of the models
// in c.maps), in one transaction conditional on the guard; a change of
// more than maxTxnOps operations or maxTxnBytes bytes goes in several,
// each conditional on the last. The serving map's records go first, so
// a router sees the map of as many models change at once as fit.
func (st *store) commit(ctx context.Context, c change, mapOps txnOps) error {
	if c.empty() && len(mapOps.ops) == 0 {
		return nil
	}
	ops := mapOps
	if c.cordons != nil {
		if err := ops.put(st.cordonKey(), c.cordons); err != nil {
			return err
		}
	}
	for _, name := range c.gone {
		ops.delete(st.modelKey(name)) // the map's records: in mapOps
		ops.deletePrefix(st.modelKey(name) + "/")
	}
	seq := st.audit
	for _, e := range c.audit {
		seq++
		b, _ := json.Marshal(struct {
			Schema int `json:"schema"`
			AuditEntry
		}{recordSchema, e})
		if err := ops.put(st.auditKey(seq), b); err != nil {
			return err
		}
		if seq > maxAudit {
			ops.delete(st.auditKey(seq - maxAudit))
		}
	}
	st.txns = 0
	err := ops.each(func(batch []clientv3.Op) error {
		g, _ := json.Marshal(guardRecord{Schema: recordSchema, Writer: st.writer, Audit: seq})
		then := append(batch, clientv3.OpPut(st.guardKey(), string(g)))
		cond := clientv3.Compare(clientv3.ModRevision(st.guardKey()), "=", st.rev)
		// Nor once a raft group of managers publishes (fence.go): a manager
		// without --raft-* must not write over its map.
		noGroup := clientv3.Compare(clientv3.CreateRevision(st.termKey()), "=", 0)
		resp, err := st.cli.Txn(ctx).If(cond, noGroup).Then(then...).Else(clientv3.OpGet(st.termKey(), clientv3.WithCountOnly())).Commit()
		if err != nil {
			return fmt.Errorf("manager: writing state: %w", err)
		}
		if !resp.Succeeded {
			if resp.Responses[0].GetResponseRange().GetCount() > 0 {
				return ErrRaftCluster
			}
			return ErrStale
		}
		st.rev = resp.Header.Revision
		st.txns++
		return nil
	})
	if err != nil {
		if st.txns > 0 {
			// Part of the change is written: what etcd holds is known
			// neither as before nor as after. The next read loads it
			// (refresh), and a write meanwhile is refused as stale.
			st.rev = -1
		}
		return err
	}
	st.audit = seq
	if len(c.maps) > 0 {
		slog.Debug("manager: serving map written", "models", len(c.maps), "revision", st.rev)
	}
	return nil
}

// readAudit returns up to limit of the newest audit entries, oldest first.
func (st *store) readAudit(ctx context.Context, limit int64) ([]AuditEntry, error) {
	resp, err := st.cli.Get(ctx, st.auditPrefix(), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("manager: reading audit log: %w", err)
	}
	out := make([]AuditEntry, 0, len(resp.Kvs))
	for i := len(resp.Kvs) - 1; i >= 0; i-- {
		e, err := topo.Decode[AuditEntry](string(resp.Kvs[i].Key), resp.Kvs[i].Value)
		if err != nil {
			slog.Warn("manager: skipping audit entry", "err", err)
			continue
		}
		out = append(out, e)
	}
	return out, nil
}
