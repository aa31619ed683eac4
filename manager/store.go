package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// store keeps the manager's state in etcd, beside the serving map it
// derives:
//
//	MANAGER/guard          guardRecord: bumped by every write
//	MANAGER/models/NAME    ModelState
//	MANAGER/audit/SEQ      AuditEntry (the newest maxAudit)
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
}

type guardRecord struct {
	Schema int    `json:"schema"`
	Writer string `json:"writer"`
	Audit  uint64 `json:"audit"`
}

// maxAudit is how many audit entries are kept.
const maxAudit = 1000

// ErrStale is returned by commit when another writer changed the state
// since this store last read it.
var ErrStale = errors.New("manager: state changed by another writer; re-read")

func (st *store) guardKey() string         { return st.cluster.ManagerPrefix() + "guard" }
func (st *store) modelsPrefix() string     { return st.cluster.ManagerPrefix() + "models/" }
func (st *store) auditPrefix() string      { return st.cluster.ManagerPrefix() + "audit/" }
func (st *store) auditKey(n uint64) string { return fmt.Sprintf("%s%020d", st.auditPrefix(), n) }

// load reads the persisted models and the guard's revision. A model
// record that does not decode is reported: starting without it would
// forget what is live.
func (st *store) load(ctx context.Context) (map[string]*ModelState, error) {
	resp, err := st.cli.Get(ctx, st.cluster.ManagerPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("manager: reading state: %w", err)
	}
	models := map[string]*ModelState{}
	st.rev, st.audit = 0, 0
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		switch {
		case key == st.guardKey():
			g, err := topo.Decode[guardRecord](key, kv.Value)
			if err != nil {
				return nil, fmt.Errorf("manager: %w", err)
			}
			st.rev, st.audit = kv.ModRevision, g.Audit
		case strings.HasPrefix(key, st.modelsPrefix()):
			m, err := topo.Decode[ModelState](key, kv.Value)
			if err != nil {
				return nil, fmt.Errorf("manager: %w", err)
			}
			models[m.Name] = &m
		}
	}
	return models, nil
}

// change is what one decision writes.
type change struct {
	states map[string][]byte // model → ModelState JSON
	maps   map[string][]byte // model → Assignment JSON
	audit  []AuditEntry
}

func (c *change) empty() bool { return len(c.states) == 0 && len(c.maps) == 0 && len(c.audit) == 0 }

// maxTxnOps is etcd's default limit on operations in one transaction.
const maxTxnOps = 128

// commit writes c in one transaction conditional on the guard (more than
// maxTxnOps operations go in several, each conditional on the last; the
// serving map's records go first, so up to maxTxnOps-1 models a router
// sees the map change at once).
func (st *store) commit(ctx context.Context, c change) error {
	if c.empty() {
		return nil
	}
	var ops []clientv3.Op
	for _, name := range slices.Sorted(maps.Keys(c.maps)) {
		ops = append(ops, clientv3.OpPut(st.cluster.ModelKey(name), string(c.maps[name])))
	}
	for _, name := range slices.Sorted(maps.Keys(c.states)) {
		ops = append(ops, clientv3.OpPut(st.modelsPrefix()+name, string(c.states[name])))
	}
	seq := st.audit
	for _, e := range c.audit {
		seq++
		b, _ := json.Marshal(struct {
			Schema int `json:"schema"`
			AuditEntry
		}{topo.Schema, e})
		ops = append(ops, clientv3.OpPut(st.auditKey(seq), string(b)))
		if seq > maxAudit {
			ops = append(ops, clientv3.OpDelete(st.auditKey(seq-maxAudit)))
		}
	}
	for first := true; first || len(ops) > 0; first = false {
		n := min(len(ops), maxTxnOps-1)
		g, _ := json.Marshal(guardRecord{Schema: topo.Schema, Writer: st.writer, Audit: seq})
		then := append(ops[:n:n], clientv3.OpPut(st.guardKey(), string(g)))
		cond := clientv3.Compare(clientv3.ModRevision(st.guardKey()), "=", st.rev)
		resp, err := st.cli.Txn(ctx).If(cond).Then(then...).Commit()
		if err != nil {
			return fmt.Errorf("manager: writing state: %w", err)
		}
		if !resp.Succeeded {
			return ErrStale
		}
		st.rev = resp.Header.Revision
		ops = ops[n:]
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
