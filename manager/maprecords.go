package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// publisher writes the serving map as records that change with what
// changed (topo's maprecords.go): a model's head on every change of its
// map, its placement when placement changes, and a version's record once,
// relative to the newest record already written on its chain, so a delta
// writes the partitions it touched. It remembers what it wrote, to write
// each version record once and to delete those no kept version needs.
// Loop goroutine only.
type publisher struct {
	cluster topo.Cluster
	cli     *clientv3.Client // lists a model's records on its first publication (nil: none to list)
	models  map[string]*published
}

// published is what etcd holds of one model's map, as this manager wrote
// it.
type published struct {
	placeSeq uint64
	versions map[uint64]pubVersion
}

// pubVersion is a version record written: the version its identities
// are based on, and the identities it resolves to.
type pubVersion struct {
	base uint64
	ids  []string
}

func newPublisher(cli *clientv3.Client, c topo.Cluster) *publisher {
	return &publisher{cluster: c, cli: cli, models: map[string]*published{}}
}

// forget drops what the publisher knows of model name's records (a write
// failed, or another manager may have written): its next publication
// writes every record it needs and deletes the rest.
func (pb *publisher) forget(name string) { delete(pb.models, name) }

// ops adds to t the writes that bring model name's records in etcd to ms
// (nil: the model is gone), in the order readers need (version records
// and placement before the head that names them; deletions last). done,
// called once they are written, records them as published.
func (pb *publisher) ops(ctx context.Context, t *txnOps, name string, ms *ModelState) (done func(), err error) {
	head := pb.cluster.ModelKey(name)
	if ms == nil {
		t.Delete(head)
		t.DeletePrefix(head + "/")
		return func() { delete(pb.models, name) }, nil
	}
	if ms.Partitions == 0 || len(ms.Replicas) != int(ms.Partitions) {
		// Nothing to serve yet, or not placed yet (settle places nothing
		// before the shards are heard from): no map. A head naming
		// partitions its placement lacks is a record every reader
		// refuses, and a router watching would see the model go missing.
		return func() {}, nil
	}
	cur := pb.models[name]
	var stale []string // records in etcd this publisher did not write
	if cur == nil {
		cur = &published{versions: map[uint64]pubVersion{}}
		if stale, err = pb.list(ctx, name); err != nil {
			return nil, err
		}
	}
	next := &published{placeSeq: cur.placeSeq, versions: maps.Clone(cur.versions)}
	kept := slices.Sorted(slices.Values(ms.kept()))
	for _, v := range kept {
		x := ms.version(v)
		if _, ok := next.versions[v]; ok || x == nil || x.Info == nil {
			continue
		}
		var base uint64
		var baseIDs []string
		for _, c := range x.Info.Chain {
			if pv, ok := next.versions[c]; ok && c != v {
				base, baseIDs = c, pv.ids
				break
			}
		}
		rec := topo.NewVersionRecord(name, *x.Info, base, baseIDs)
		b, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		if err := t.Put(pb.cluster.VersionKey(name, v), b); err != nil {
			return nil, err
		}
		next.versions[v] = pubVersion{base: rec.Base, ids: x.Info.IDs}
	}
	if pb.models[name] == nil || cur.placeSeq != ms.PlaceSeq {
		b, _ := json.Marshal(topo.NewPlacement(name, ms.PlaceSeq, ms.Replicas))
		if err := t.Put(pb.cluster.PlacementKey(name), b); err != nil {
			return nil, err
		}
		next.placeSeq = ms.PlaceSeq
	}
	a := ms.Assignment()
	h := topo.ModelHead{Schema: topo.AssignmentSchema, Model: name, Seq: a.Seq, Live: a.Live, Staged: a.Staged, Standby: a.Standby,
		Canary: a.Canary, CanaryFraction: a.CanaryFraction, Partitions: a.Partitions, PlaceSeq: ms.PlaceSeq, KeptSince: a.KeptSince}
	b, _ := json.Marshal(h)
	if err := t.Put(head, b); err != nil {
		return nil, err
	}
	// What the kept versions' records are based on stays; the rest goes.
	needed := map[uint64]bool{}
	for _, v := range kept {
		for x := v; x != 0 && !needed[x]; x = next.versions[x].base {
			if _, ok := next.versions[x]; !ok {
				break
			}
			needed[x] = true
		}
	}
	for _, v := range slices.Sorted(maps.Keys(next.versions)) {
		if !needed[v] {
			t.Delete(pb.cluster.VersionKey(name, v))
			delete(next.versions, v)
		}
	}
	for _, key := range stale {
		if v, ok := versionOfKey(pb.cluster, name, key); !ok || !needed[v] {
			t.Delete(key)
		}
	}
	return func() { pb.models[name] = next }, nil
}

// list returns the keys of model name's version records in etcd.
func (pb *publisher) list(ctx context.Context, name string) ([]string, error) {
	if pb.cli == nil {
		return nil, nil
	}
	resp, err := pb.cli.Get(ctx, pb.cluster.VersionsPrefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("manager: reading the serving map's records of %s: %w", name, err)
	}
	keys := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = string(kv.Key)
	}
	return keys, nil
}

// versionOfKey is the version whose record key is.
func versionOfKey(c topo.Cluster, name, key string) (uint64, bool) {
	var v uint64
	_, err := fmt.Sscanf(topo.Suffix(key, c.VersionsPrefix(name)), "%d", &v)
	return v, err == nil && c.VersionKey(name, v) == key
}

// publish brings etcd's records of the models names to what s holds:
// write is given the operations and writes them (in as many transactions
// as it needs); once it has, they are recorded as published. When it
// fails, or the operations cannot be made, the models are forgotten:
// their next publication reads etcd again.
func (pb *publisher) publish(ctx context.Context, s *State, names []string, write func(txnOps) error) error {
	var t txnOps
	var dones []func()
	err := func() error {
		for _, name := range names {
			d, err := pb.ops(ctx, &t, name, s.Models[name])
			if err != nil {
				return err
			}
			dones = append(dones, d)
		}
		return write(t)
	}()
	if err != nil {
		for _, name := range names {
			pb.forget(name)
		}
		return err
	}
	for _, d := range dones {
		d()
	}
	return nil
}
