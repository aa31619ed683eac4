package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// recordsModel is a model of parts partitions with a full version 1 and
// deltas 2..last, each delta changing partition v%parts.
func recordsModel(parts int, last uint64) *ModelState {
	m := &ModelState{Schema: ModelStateSchema, Name: "m", Partitions: uint32(parts), Live: last, Seq: 3, PlaceSeq: 1}
	ids := make([]string, parts)
	for p := range ids {
		ids[p] = digest("m", 1, p)
	}
	for v := uint64(1); v <= last; v++ {
		x := Version{Version: v, Kind: "full", Phase: PhaseStandby, Files: fmt.Sprint("f", v), Checked: fmt.Sprint("f", v)}
		chain := []uint64{v}
		if v > 1 {
			x.Kind, x.Parent = "delta", v-1
			ids = slices.Clone(ids)
			ids[int(v)%parts] = digest("m", v, int(v)%parts)
			chain = append(chain, m.Versions[len(m.Versions)-1].Info.Chain...)
		}
		if v == last {
			x.Phase = PhaseLive
		}
		x.Info = &topo.VersionInfo{Version: v, Hash: "xxh64", IDs: ids, Chain: chain}
		m.Versions = append(m.Versions, x)
	}
	for range parts {
		m.Replicas = append(m.Replicas, []string{"s0", "s1"})
	}
	return m
}

// modelKeys lists the keys of model m's state records in etcd.
func modelKeys(t *testing.T, cli *clientv3.Client, st *store) []string {
	t.Helper()
	resp, err := cli.Get(context.Background(), st.modelKey("m"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, strings.TrimPrefix(string(kv.Key), st.modelsPrefix()))
	}
	slices.Sort(keys)
	return keys
}

func sameJSON(t *testing.T, what string, got, want *ModelState) {
	t.Helper()
	a, _ := json.Marshal(want)
	b, _ := json.Marshal(got)
	if string(a) != string(b) {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		from := max(0, i-200)
		t.Fatalf("%s: read back, from byte %d\n%.600s\nwant\n%.600s", what, from, b[from:], a[from:])
	}
}

// TestStateRecordsInEtcd, against a real etcd: a model's state read from
// a record of the older form (one record) is written back, at its next
// change, as records of its own (a head of schema 5, which older
// managers refuse, its replicas, a record per version and per version's
// identities, a delta's listing only what it changed), and reads back as
// the state. Records the head does not list are ignored, and removed
// with the next change.
func TestStateRecordsInEtcd(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx := context.Background()
	st := &store{cli: cli, cluster: topo.DefaultCluster, writer: "a"}
	older := recordsModel(64, 4)
	b, _ := json.Marshal(older)
	if _, err := cli.Put(ctx, st.modelKey("m"), string(b)); err != nil {
		t.Fatal(err)
	}
	loaded, err := st.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "the older form", loaded.Models["m"], older)

	// Its next change writes it in parts.
	next := &State{Models: map[string]*ModelState{"m": recordsModel(64, 5)}}
	commit := func(cur, next *State) {
		t.Helper()
		c, _ := changesOf(cur, next, nil)
		ops, done, err := st.stateOps(c, cur, next)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.commit(ctx, c, ops); err != nil {
			t.Fatal(err)
		}
		done()
	}
	commit(loaded, next)
	keys := modelKeys(t, cli, st)
	want := []string{"m", "m/ids/1", "m/ids/2", "m/ids/3", "m/ids/4", "m/ids/5", "m/replicas", "m/versions/1", "m/versions/2", "m/versions/3", "m/versions/4", "m/versions/5"}
	if !slices.Equal(keys, want) {
		t.Fatalf("records %v, want %v", keys, want)
	}
	resp, _ := cli.Get(ctx, st.modelKey("m"))
	if !strings.HasPrefix(string(resp.Kvs[0].Value), `{"schema":5,`) {
		t.Fatalf("the head is not of schema 5, which readers of schema 4 and below refuse: %.200s", resp.Kvs[0].Value)
	}
	resp, _ = cli.Get(ctx, st.modelKey("m")+"/ids/5")
	if n := len(resp.Kvs[0].Value); n > 400 {
		t.Fatalf("a one-partition delta's identities take %d bytes", n)
	}
	fresh := &store{cli: cli, cluster: topo.DefaultCluster, writer: "b"}
	got, err := fresh.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "the state in parts", got.Models["m"], next.Models["m"])

	// Records the head does not list (a change too large for one
	// transaction, cut short) are ignored, and go with the next change:
	// here one that drops version 1 (2 loses the base of its identities
	// and has them written again) and adds 6.
	for _, k := range []string{"m/versions/99", "m/ids/99"} {
		if _, err := cli.Put(ctx, st.modelsPrefix()+k, `{"schema":1,"version":99,"phase":"live"}`); err != nil {
			t.Fatal(err)
		}
	}
	st = &store{cli: cli, cluster: topo.DefaultCluster, writer: "c"}
	stray, err := st.load(ctx)
	if err != nil {
		t.Fatalf("reading with records the head does not list: %v", err)
	}
	sameJSON(t, "with records the head does not list", stray.Models["m"], next.Models["m"])
	then := recordsModel(64, 6)
	then.Versions = then.Versions[1:]
	after := &State{Models: map[string]*ModelState{"m": then}}
	commit(stray, after)
	got, err = (&store{cli: cli, cluster: topo.DefaultCluster, writer: "d"}).load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "after the change", got.Models["m"], then)
	keys = modelKeys(t, cli, st)
	want = []string{"m", "m/ids/2", "m/ids/3", "m/ids/4", "m/ids/5", "m/ids/6", "m/replicas", "m/versions/2", "m/versions/3", "m/versions/4", "m/versions/5", "m/versions/6"}
	if !slices.Equal(keys, want) {
		t.Fatalf("records %v, want %v", keys, want)
	}

	// A model that leaves the state leaves no record.
	st.layout = nil
	if _, err := st.load(ctx); err != nil {
		t.Fatal(err)
	}
	commit(after, &State{Models: map[string]*ModelState{}})
	if keys := modelKeys(t, cli, st); len(keys) != 0 {
		t.Fatalf("a model gone left %v", keys)
	}
}

// TestTxnGroupsWhole: a group of operations (one model's records) is
// not split across transactions while one can hold it: the transaction
// before it ends early.
func TestTxnGroupsWhole(t *testing.T) {
	var ops txnOps
	third := topo.MaxTxnBytes / 3
	ops.Put("a", make([]byte, third))
	ops.Put("b", make([]byte, third))
	end := ops.Together()
	ops.Put("c1", make([]byte, third))
	ops.Put("c2", make([]byte, third))
	end()
	ops.Put("d", nil)
	var batches [][]string
	err := ops.Each(func(batch []clientv3.Op) error {
		var keys []string
		for _, op := range batch {
			keys = append(keys, string(op.KeyBytes()))
		}
		batches = append(batches, keys)
		return nil
	})
	if err != nil || fmt.Sprint(batches) != "[[a b] [c1 c2 d]]" {
		t.Fatalf("batches %v, want [[a b] [c1 c2 d]]", batches)
	}
	// A group larger than a transaction is split all the same.
	var big txnOps
	end = big.Together()
	for i := range 4 {
		big.Put(fmt.Sprint("g", i), make([]byte, third))
	}
	end()
	n := 0
	if err := big.Each(func([]clientv3.Op) error { n++; return nil }); err != nil || n != 2 {
		t.Fatalf("a group of four thirds of a transaction: %d transactions, want 2", n)
	}
}

// FuzzStateRecords: whatever a model's state records hold, reading them
// returns a state or an error, never a panic.
func FuzzStateRecords(f *testing.F) {
	st := &store{cluster: topo.DefaultCluster}
	next := &State{Models: map[string]*ModelState{"m": recordsModel(8, 3)}}
	c, _ := changesOf(&State{Models: map[string]*ModelState{}}, next, nil)
	ops, _, err := st.stateOps(c, &State{Models: map[string]*ModelState{}}, next)
	if err != nil {
		f.Fatal(err)
	}
	seed := map[string][]byte{}
	for _, op := range ops.Ops {
		seed[strings.TrimPrefix(string(op.KeyBytes()), st.modelsPrefix())] = op.ValueBytes()
	}
	f.Add(seed["m"], seed["m/replicas"], seed["m/versions/2"], seed["m/ids/2"], seed["m/ids/3"])
	f.Add(seed["m"], seed["m/replicas"], seed["m/versions/3"], seed["m/ids/3"], seed["m/ids/2"])
	f.Fuzz(func(t *testing.T, head, replicas, version, ids2, ids3 []byte) {
		kv := map[string][]byte{"m": head, "m/replicas": replicas, "m/versions/1": seed["m/versions/1"], "m/ids/1": seed["m/ids/1"],
			"m/versions/2": version, "m/versions/3": seed["m/versions/3"], "m/ids/2": ids2, "m/ids/3": ids3}
		recs := map[string]*modelRecords{}
		for k, v := range kv {
			if err := addRecord(recs, k, st.modelsPrefix()+k, v); err != nil {
				return
			}
		}
		if models, _, err := st.assembleAll(recs); err == nil && models["m"] == nil {
			t.Fatal("read without error, and without the model")
		}
	})
}

// kvState is a simulated etcd holding a manager's state records.
type kvState struct {
	t  *testing.T
	st *store
	kv map[string][]byte
}

func newKVState(t *testing.T) *kvState {
	return &kvState{t: t, st: &store{cluster: topo.DefaultCluster}, kv: map[string][]byte{}}
}

// write writes the change from cur to next, all of it (limit 0) or only
// its first limit transactions, as a commit cut short does; it returns
// the keys of the identity records written.
func (k *kvState) write(cur, next *State, limit int) (ids []string) {
	k.t.Helper()
	c, _ := changesOf(cur, next, nil)
	ops, done, err := k.st.stateOps(c, cur, next)
	if err != nil {
		k.t.Fatal(err)
	}
	for _, name := range c.gone {
		ops.DeletePrefix(k.st.modelKey(name) + "/")
		ops.Delete(k.st.modelKey(name))
	}
	n := 0
	err = ops.Each(func(batch []clientv3.Op) error {
		if n++; limit > 0 && n > limit {
			return fmt.Errorf("cut")
		}
		for _, op := range batch {
			if op.IsPut() && strings.Contains(string(op.KeyBytes()), "/ids/") {
				ids = append(ids, strings.TrimPrefix(string(op.KeyBytes()), k.st.modelsPrefix()))
			}
		}
		applyOps(k.kv, txnOps{Ops: batch})
		return nil
	})
	if err == nil {
		done()
	}
	return ids
}

// read is what a manager starting now reads, and it becomes this store's
// view of the records.
func (k *kvState) read() (*State, error) {
	recs := map[string]*modelRecords{}
	for key, v := range k.kv {
		if err := addRecord(recs, strings.TrimPrefix(key, k.st.modelsPrefix()), key, v); err != nil {
			return nil, err
		}
	}
	models, layout, err := k.st.assembleAll(recs)
	if err != nil {
		return nil, err
	}
	k.st.layout = layout
	return &State{Models: models}, nil
}

func one(m *ModelState) *State { return &State{Models: map[string]*ModelState{m.Name: m}} }

// TestStateRecordsCases: the cases a review found. A version losing its
// identities has those based on it written again; a rebase writes only
// the identities that lost their base, not the versions after them; a
// model's change cut short between transactions (a new model's, or the
// first rewrite of the older form) is read as the state before it, and
// the next change removes what it left.
func TestStateRecordsCases(t *testing.T) {
	empty := &State{Models: map[string]*ModelState{}}
	t.Run("base loses its identities", func(t *testing.T) {
		k := newKVState(t)
		s1 := one(recordsModel(8, 3))
		k.write(empty, s1, 0)
		m2 := s1.Models["m"].clone()
		m2.Versions[1].Phase, m2.Versions[1].Info = PhaseRejected, nil
		k.write(s1, one(m2), 0)
		got, err := k.read()
		if err != nil {
			t.Fatal(err)
		}
		sameJSON(t, "after version 2 lost its identities", got.Models["m"], m2)
	})
	t.Run("a rebase writes only what lost its base", func(t *testing.T) {
		k := newKVState(t)
		s1 := one(recordsModel(64, 10))
		k.write(empty, s1, 0)
		m2 := s1.Models["m"].clone()
		m2.Versions = m2.Versions[1:]
		if ids := k.write(s1, one(m2), 0); !slices.Equal(ids, []string{"m/ids/2"}) {
			t.Fatalf("dropping version 1 wrote identities %v, want only version 2's", ids)
		}
		got, err := k.read()
		if err != nil {
			t.Fatal(err)
		}
		sameJSON(t, "after version 1 left", got.Models["m"], m2)
	})
	big := recordsModel(8, 70) // 141 records: more than one transaction holds
	t.Run("a new model's first write cut short", func(t *testing.T) {
		k := newKVState(t)
		k.write(empty, one(big), 1)
		got, err := k.read()
		if err != nil || len(got.Models) != 0 {
			t.Fatalf("read %v, %v; want no model", got, err)
		}
		k.write(got, empty, 0) // any change: the leftovers go
		if len(k.kv) != 0 {
			t.Fatalf("left %d records", len(k.kv))
		}
		k.write(empty, one(big), 0)
		if got, err = k.read(); err != nil {
			t.Fatal(err)
		}
		sameJSON(t, "written again", got.Models["m"], big)
	})
	t.Run("the first rewrite of the older form cut short", func(t *testing.T) {
		k := newKVState(t)
		older := recordsModel(8, 69)
		b, _ := json.Marshal(older)
		k.kv[k.st.modelKey("m")] = b
		was, err := k.read()
		if err != nil {
			t.Fatal(err)
		}
		k.write(was, one(big), 1)
		got, err := k.read()
		if err != nil {
			t.Fatalf("reading the older form beside a cut rewrite: %v", err)
		}
		sameJSON(t, "the older form beside a cut rewrite", got.Models["m"], older)
		k.write(got, one(big), 0)
		if got, err = k.read(); err != nil {
			t.Fatal(err)
		}
		sameJSON(t, "rewritten", got.Models["m"], big)
		n := 0
		for key := range k.kv {
			if strings.HasPrefix(key, k.st.modelKey("m")+"/versions/") {
				n++
			}
		}
		if n != len(big.Versions) {
			t.Fatalf("%d version records for %d versions", n, len(big.Versions))
		}
	})
}

// TestMapWaitsForPlacement: a model not placed yet (settle places nothing
// before the shards are heard from) gets no serving map records; a head
// whose placement lacks its partitions is refused by every reader (CI
// once saw a watcher see every model missing that way). Once placed, it
// gets its version record, placement and head, which read back whole.
func TestMapWaitsForPlacement(t *testing.T) {
	m := recordsModel(2, 1)
	placed := m.Replicas
	m.Replicas = nil
	pb := newPublisher(nil, topo.DefaultCluster)
	var tx txnOps
	done, err := pb.ops(context.Background(), &tx, "m", m)
	if err != nil {
		t.Fatal(err)
	}
	done()
	if len(tx.Ops) != 0 {
		t.Fatalf("%d writes for a model not placed, want none", len(tx.Ops))
	}
	m.Replicas = placed
	if done, err = pb.ops(context.Background(), &tx, "m", m); err != nil {
		t.Fatal(err)
	}
	done()
	kv := map[string][]byte{}
	for _, op := range tx.Ops {
		if !op.IsPut() {
			t.Fatalf("a first publication deletes %s", op.KeyBytes())
		}
		kv[string(op.KeyBytes())] = op.ValueBytes()
	}
	as := topo.Assignments(kv, topo.DefaultCluster)
	if len(kv) != 3 || len(as) != 1 || len(as["m"].Replicas) != 2 {
		t.Fatalf("placed: %d records, assignments %+v; want a version record, a placement and a head assembling to m's 2 partitions", len(kv), as)
	}
}
