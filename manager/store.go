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

// txnOps are writes to make in as few etcd transactions as its limits
// allow (topo.Txn).
type txnOps = topo.Txn

// ErrTooLarge is returned by commit for a record etcd would refuse.
var ErrTooLarge = topo.ErrTooLarge

// commit writes c, with mapOps (the serving map's records of the models
// in c.maps), in one transaction conditional on the guard; a change of
// more than topo.MaxTxnOps operations or topo.MaxTxnBytes bytes goes in several,
// each conditional on the last. The serving map's records go first, so
// a router sees the map of as many models change at once as fit.
func (st *store) commit(ctx context.Context, c change, mapOps txnOps) error {
	if c.empty() && len(mapOps.Ops) == 0 {
		return nil
	}
	ops := mapOps
	if c.cordons != nil {
		if err := ops.Put(st.cordonKey(), c.cordons); err != nil {
			return err
		}
	}
	for _, name := range c.gone {
		ops.Delete(st.modelKey(name)) // the map's records: in mapOps
		ops.DeletePrefix(st.modelKey(name) + "/")
	}
	seq := st.audit
	for _, e := range c.audit {
		seq++
		b, _ := json.Marshal(struct {
			Schema int `json:"schema"`
			AuditEntry
		}{recordSchema, e})
		if err := ops.Put(st.auditKey(seq), b); err != nil {
			return err
		}
		if seq > maxAudit {
			ops.Delete(st.auditKey(seq - maxAudit))
		}
	}
	st.txns = 0
	err := ops.Each(func(batch []clientv3.Op) error {
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
