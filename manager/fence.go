package manager

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// fence publishes the serving map in etcd for managers that replicate
// their state in raft (raftstate.go): routers and shards read the map
// from etcd as before, and the leader of raft term T writes it in
// transactions conditional on MANAGER/term, the term of the newest
// publisher, being at most T, raising it to T. Once a newer leader has
// published, a deposed leader's write fails: no two leaders publish.
type fence struct {
	cli     *clientv3.Client
	cluster topo.Cluster
}

// ErrFenced is returned by publish when a leader of a newer term has
// published.
var ErrFenced = errors.New("manager: a newer leader has published the serving map")

func (f fence) key() string { return f.cluster.ManagerPrefix() + "term" }

// termValue is a term as etcd compares it: bytes, so 20 digits.
func termValue(t uint64) string { return fmt.Sprintf("%020d", t) }

// publish writes ops (the serving map's records) as the leader of term,
// in as few transactions as etcd's limits allow, each fenced.
func (f fence) publish(ctx context.Context, term uint64, ops txnOps) error {
	return ops.Each(func(batch []clientv3.Op) error { return f.txn(ctx, term, batch) })
}

// txn writes ops as the leader of term, creating the fence key first if
// it is missing (a comparison with a missing key's value always fails).
func (f fence) txn(ctx context.Context, term uint64, ops []clientv3.Op) error {
	then := append(ops, clientv3.OpPut(f.key(), termValue(term)))
	for created := false; ; created = true {
		resp, err := f.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(f.key()), "<", termValue(term+1))).
			Then(then...).Else(clientv3.OpGet(f.key())).Commit()
		if err != nil {
			return fmt.Errorf("manager: publishing the serving map: %w", err)
		}
		if resp.Succeeded {
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 1 || created {
			newer := "?"
			if len(kvs) == 1 {
				newer = string(kvs[0].Value)
			}
			return fmt.Errorf("%w (this manager leads term %d; the map was published in term %s)", ErrFenced, term, newer)
		}
		if _, err := f.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(f.key()), "=", 0)).
			Then(clientv3.OpPut(f.key(), termValue(0))).Commit(); err != nil {
			return fmt.Errorf("manager: publishing the serving map: %w", err)
		}
	}
}
