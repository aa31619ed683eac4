package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// mapRecord is the write of value as model name's serving map record.
func mapRecord(name, value string) txnOps {
	var t txnOps
	t.Put(topo.DefaultCluster.ModelKey(name), []byte(value))
	return t
}

// TestStaleWriterRefused: of two writers that read the same state, the
// second to write is refused and the map keeps the first's record.
func TestStaleWriterRefused(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx := context.Background()
	a := &store{cli: cli, cluster: topo.DefaultCluster, writer: "a"}
	b := &store{cli: cli, cluster: topo.DefaultCluster, writer: "b"}
	for _, st := range []*store{a, b} {
		if _, err := st.load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.commit(ctx, change{maps: []string{"m"}}, mapRecord("m", `"a's"`)); err != nil {
		t.Fatal(err)
	}
	if err := b.commit(ctx, change{maps: []string{"m"}}, mapRecord("m", `"b's"`)); !errors.Is(err, ErrStale) {
		t.Fatalf("stale write: %v, want ErrStale", err)
	}
	resp, err := cli.Get(ctx, topo.DefaultCluster.ModelKey("m"))
	if err != nil || string(resp.Kvs[0].Value) != `"a's"` {
		t.Fatalf("map after the refused write: %q %v", resp.Kvs[0].Value, err)
	}
	// Having read again, b writes.
	if _, err := b.load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.commit(ctx, change{maps: []string{"m"}}, mapRecord("m", `"b's"`)); err != nil {
		t.Fatal(err)
	}
	// Once a raft group of managers has published (fence.go), neither
	// writes, nor reads the state again as its own.
	if err := (fence{cli: cli, cluster: topo.DefaultCluster}).publish(ctx, 2, mapRecord("m", `"the group's"`)); err != nil {
		t.Fatal(err)
	}
	if err := b.commit(ctx, change{maps: []string{"m"}}, mapRecord("m", `"b's again"`)); !errors.Is(err, ErrRaftCluster) {
		t.Fatalf("a write over a raft group's map: %v, want ErrRaftCluster", err)
	}
	if _, err := a.load(ctx); !errors.Is(err, ErrRaftCluster) {
		t.Fatalf("reading a raft group's cluster: %v, want ErrRaftCluster", err)
	}
}

// TestCommitSplitsByBytes: a change larger than one etcd request is
// written in several transactions, each within the byte budget; a record
// at the limit is written, one byte over is refused before anything is
// written.
func TestCommitSplitsByBytes(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx := context.Background()
	st := &store{cli: cli, cluster: topo.DefaultCluster, writer: "a"}
	if _, err := st.load(ctx); err != nil {
		t.Fatal(err)
	}
	at := topo.MaxRecordBytes - len(st.modelsPrefix()+"m0")
	records := func(values map[string][]byte) (txnOps, error) {
		var ops txnOps
		for _, name := range slices.Sorted(maps.Keys(values)) {
			if err := ops.Put(st.modelsPrefix()+name, values[name]); err != nil {
				return txnOps{}, err
			}
		}
		return ops, nil
	}
	five := map[string][]byte{}
	for i := range 5 {
		five[fmt.Sprintf("m%d", i)] = bytes.Repeat([]byte{'x'}, at)
	}
	ops, err := records(five)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.commit(ctx, change{}, ops); err != nil {
		t.Fatalf("five records at the limit: %v", err)
	}
	if st.txns != 5 {
		t.Fatalf("%d transactions for five records of %d bytes, want 5", st.txns, topo.MaxRecordBytes)
	}
	for i := range 5 {
		resp, err := cli.Get(ctx, st.modelsPrefix()+fmt.Sprintf("m%d", i))
		if err != nil || len(resp.Kvs) != 1 || len(resp.Kvs[0].Value) != at {
			t.Fatalf("record m%d after the write: %v", i, err)
		}
	}
	small := map[string][]byte{}
	for i := range 300 {
		small[fmt.Sprintf("s%d", i)] = []byte("{}")
	}
	if ops, err = records(small); err != nil {
		t.Fatal(err)
	}
	if err := st.commit(ctx, change{}, ops); err != nil || st.txns != 3 {
		t.Fatalf("300 small records: %v, %d transactions, want 3 (%d operations each at most)", err, st.txns, topo.MaxTxnOps)
	}
	if _, err := records(map[string][]byte{"a": []byte("{}"), "m0": bytes.Repeat([]byte{'y'}, at+1)}); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "m0") {
		t.Fatalf("a record one byte over the limit: %v", err)
	}
}

// TestOlderStateRewritten: a model's state written by an older manager
// (schema 1, identities and chains as lists) is read, and written back in
// this build's form (schema 2), so an older manager refuses it rather
// than misread it.
func TestOlderStateRewritten(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx := context.Background()
	old := `{"schema":1,"name":"m","partitions":1,"versions":[{"version":1,"kind":"full","phase":"ready","info":{"version":1,"type":"lr","dim":0,"bias":0,"hash":"h","ids":["x"],"chain":[1]}}]}`
	if _, err := cli.Put(ctx, topo.DefaultCluster.ManagerPrefix()+"models/m", old); err != nil {
		t.Fatal(err)
	}
	st := &store{cli: cli, cluster: topo.DefaultCluster, writer: "a"}
	loaded, err := st.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	models := loaded.Models
	m := models["m"]
	if m == nil || m.Schema != ModelStateSchema || m.version(1).Info.IDs[0] != "x" {
		t.Fatalf("read %+v", m)
	}
	next, _, err := Decide(&State{Models: models}, Command{Op: OpPin, Model: "m", Version: 1}, Policy{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(next.Models["m"])
	if !strings.HasPrefix(string(b), fmt.Sprintf(`{"schema":%d,`, ModelStateSchema)) {
		t.Fatalf("written back as %s", b)
	}
	if _, err := topo.Decode[ModelState]("k", b); err != nil {
		t.Fatal(err)
	}
}

// TestLeftoversRemoved: what an interrupted prune left goes at start, and
// so does a version a writer left half-written a day ago; one being
// written now stays.
func TestLeftoversRemoved(t *testing.T) {
	repo := t.TempDir()
	old, fresh, pruned := filepath.Join(repo, "m", ".writing-old"), filepath.Join(repo, "m", ".writing-new"), filepath.Join(repo, "m", pruningPrefix+"3-x")
	for _, d := range []string{old, fresh, pruned} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Now().Add(-25 * time.Hour)
	if err := os.Chtimes(old, day, day); err != nil {
		t.Fatal(err)
	}
	removeLeftovers(repo)
	for d, want := range map[string]bool{old: false, fresh: true, pruned: false} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", d, err == nil, want)
		}
	}
}

// TestCordonsPersist: cordons are written with the state and read back
// by a manager starting afresh.
func TestCordonsPersist(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx := context.Background()
	a := &store{cli: cli, cluster: topo.DefaultCluster, writer: "a"}
	if _, err := a.load(ctx); err != nil {
		t.Fatal(err)
	}
	m := &Manager{}
	cur := &State{Models: map[string]*ModelState{}}
	next, _, err := Decide(cur, Command{Op: OpCordon, Shard: "s7", At: time.Unix(1, 0)}, Policy{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	m.metrics.compared = prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	if err := a.commit(ctx, m.changes(cur, next, nil), txnOps{}); err != nil {
		t.Fatal(err)
	}
	b := &store{cli: cli, cluster: topo.DefaultCluster, writer: "b"}
	loaded, err := b.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(loaded.Cordoned, []string{"s7"}) || loaded.ShardState("s7") != "empty" {
		t.Fatalf("read back %v", loaded.Cordoned)
	}
}
