package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/raftgroup"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

func modelJSON(t testing.TB, name string, live uint64) []byte {
	b, err := json.Marshal(&ModelState{Schema: ModelStateSchema, Name: name, Partitions: 2, Live: live, Seq: live})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func entryJSON(t testing.TB, c change, cordoned []string, at time.Time) []byte {
	b, err := entryOf(c, cordoned, at, AuditRetention{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func applyEntry(r *replicated, index uint64, data []byte) any {
	return r.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: data})
}

// stateJSON is what a member's state machine holds, comparable.
func stateJSON(t testing.TB, r *replicated) string {
	s, _ := r.view()
	b, err := json.Marshal(struct {
		Models   map[string]*ModelState
		Cordoned []string
		Audit    []AuditEntry
	}{s.Models, s.Cordoned, r.readAudit(1 << 30)})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReplicatedApply: entries change models, remove them, set cordons
// and append audit entries; an entry this build cannot read changes
// nothing and is answered errEntry.
func TestReplicatedApply(t *testing.T) {
	r := newReplicated(AuditRetention{})
	at := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	c := change{states: map[string][]byte{"a": modelJSON(t, "a", 1), "b": modelJSON(t, "b", 3)}, cordons: []byte("x"),
		audit: []AuditEntry{{Time: at, Op: "pin", Model: "a", Version: 1, Result: "ok"}}}
	if got := applyEntry(r, 1, entryJSON(t, c, []string{"s2", "s1", "s1"}, at)); got != uint64(1) {
		t.Fatalf("apply: %v", got)
	}
	s, applied := r.view()
	if applied != 1 || len(s.Models) != 2 || s.Models["b"].Live != 3 || strings.Join(s.Cordoned, ",") != "s1,s2" {
		t.Fatalf("after the first entry: %+v applied %d", s, applied)
	}
	applyEntry(r, 2, entryJSON(t, change{gone: []string{"b"}, cordons: []byte("x")}, nil, at))
	s, _ = r.view()
	if len(s.Models) != 1 || s.Models["a"] == nil || len(s.Cordoned) != 0 {
		t.Fatalf("after the second: %+v", s)
	}
	before := stateJSON(t, r)
	for name, bad := range map[string]string{
		"not JSON":       `{`,
		"newer schema":   `{"schema":99,"at":"2026-11-24T00:00:00Z"}`,
		"misfiled state": fmt.Sprintf(`{"schema":1,"at":"2026-11-24T00:00:00Z","states":{"b":%s}}`, modelJSON(t, "a", 2)),
		"changed and gone": fmt.Sprintf(`{"schema":1,"at":"2026-11-24T00:00:00Z","states":{"a":%s},"gone":["a"]}`,
			modelJSON(t, "a", 2)),
		"state not a model": `{"schema":1,"at":"2026-11-24T00:00:00Z","states":{"a":{"schema":1,"name":"a","versions":7}}}`,
	} {
		if err, _ := applyEntry(r, 3, []byte(bad)).(error); !errors.Is(err, errEntry) {
			t.Errorf("%s: answered %v", name, err)
		}
		if after := stateJSON(t, r); after != before {
			t.Errorf("%s changed the state", name)
		}
	}
}

// TestAuditRetention: the newest Keep entries, none older than MaxAge
// counted from the entry's own time.
func TestAuditRetention(t *testing.T) {
	r := newReplicated(AuditRetention{Keep: 3, MaxAge: time.Hour})
	t0 := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		at := t0.Add(time.Duration(i) * time.Minute)
		applyEntry(r, uint64(i+1), entryJSON(t, change{audit: []AuditEntry{{Time: at, Op: "pin", Version: uint64(i)}}}, nil, at))
	}
	got := r.readAudit(100)
	if len(got) != 3 || got[0].Version != 2 || got[2].Version != 4 {
		t.Fatalf("kept %+v", got)
	}
	if two := r.readAudit(2); len(two) != 2 || two[1].Version != 4 {
		t.Fatalf("the newest two: %+v", two)
	}
	// An hour and a half later, only what is under an hour old remains.
	at := t0.Add(90 * time.Minute)
	applyEntry(r, 6, entryJSON(t, change{audit: []AuditEntry{{Time: at.Add(-59 * time.Minute), Op: "late"}, {Time: at, Op: "now"}}}, nil, at))
	got = r.readAudit(100)
	if len(got) != 2 || got[0].Op != "late" || got[1].Op != "now" {
		t.Fatalf("after the age bound: %+v", got)
	}
}

// TestAuditRetentionIsTheLeaders: members started with other retention
// flags keep what the entries say, so they hold the same audit log.
func TestAuditRetentionIsTheLeaders(t *testing.T) {
	a, b := newReplicated(AuditRetention{Keep: 2, MaxAge: time.Hour}), newReplicated(AuditRetention{Keep: 5, MaxAge: time.Hour})
	at := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	for i := range 6 {
		e, err := entryOf(change{audit: []AuditEntry{{Time: at, Op: "pin", Version: uint64(i)}}}, nil, at, AuditRetention{Keep: 3, MaxAge: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		applyEntry(a, uint64(i+1), e)
		applyEntry(b, uint64(i+1), e)
	}
	if x, y := stateJSON(t, a), stateJSON(t, b); x != y || len(a.readAudit(100)) != 3 {
		t.Fatalf("members differ (%d and %d entries kept; the leader said 3)", len(a.readAudit(100)), len(b.readAudit(100)))
	}
}

type bufSink struct{ bytes.Buffer }

func (*bufSink) ID() string    { return "test" }
func (*bufSink) Cancel() error { return nil }
func (*bufSink) Close() error  { return nil }

// TestReplicatedSnapshot: a snapshot restored into a fresh member gives
// the same state and audit log; one that does not decode is refused.
func TestReplicatedSnapshot(t *testing.T) {
	r := newReplicated(AuditRetention{})
	at := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	applyEntry(r, 1, entryJSON(t, change{states: map[string][]byte{"a": modelJSON(t, "a", 4)}, cordons: []byte("x"),
		audit: []AuditEntry{{Time: at, Op: "rollback", Model: "a", Result: "ok"}}}, []string{"s9"}, at))
	snap, err := r.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink bufSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	fresh := newReplicated(AuditRetention{})
	_, before := fresh.view()
	if err := fresh.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if _, after := fresh.view(); after == before {
		t.Fatal("a restored snapshot left the state's generation as it was: a follower would not refresh its view")
	}
	if a, b := stateJSON(t, r), stateJSON(t, fresh); a != b {
		t.Fatalf("restored %s\nwant %s", b, a)
	}
	for _, bad := range []string{`{"schema":2}`, `{"schema":1,"models":{"a":{"schema":2,"name":"b"}}}`, `{"schema":1,"models":{"a":null}}`, "garbage"} {
		if err := fresh.Restore(io.NopCloser(strings.NewReader(bad))); err == nil {
			t.Errorf("snapshot %s restored", bad)
		}
	}
}

// TestReplicatedGroup: three members of a raft group on loopback apply
// the same entries to the same state, including one that joined late
// and caught up from a snapshot.
func TestReplicatedGroup(t *testing.T) {
	dir := t.TempDir()
	type member struct {
		g   *raftgroup.Group
		fsm *replicated
	}
	start := func(id string, peers []raftgroup.Peer) member {
		fsm := newReplicated(AuditRetention{Keep: 50})
		g, err := raftgroup.Start(raftgroup.Config{ID: id, Addr: "127.0.0.1:0", Dir: filepath.Join(dir, id), Peers: peers, FSM: fsm,
			SnapshotEvery: 64, TrailingLogs: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		return member{g, fsm}
	}
	a := start("a", []raftgroup.Peer{{ID: "a"}})
	testenv.Eventually(t, 10*time.Second, func() error {
		if !a.g.Leading() {
			return errors.New("a does not lead")
		}
		return nil
	})
	b := start("b", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.g.Add(ctx, "b", b.g.Addr()); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	for i := range 200 {
		name := fmt.Sprintf("m%d", i%7)
		c := change{states: map[string][]byte{name: modelJSON(t, name, uint64(i))}, audit: []AuditEntry{{Time: at, Op: "pin", Model: name, Version: uint64(i)}}}
		if i%50 == 49 {
			c.gone = []string{fmt.Sprintf("m%d", (i+1)%7)}
		}
		if _, err := a.g.Apply(ctx, entryJSON(t, c, nil, at)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.g.Snapshot(); err != nil {
		t.Fatal(err)
	}
	c := start("c", nil)
	if err := a.g.Add(ctx, "c", c.g.Addr()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		want := stateJSON(t, a.fsm)
		for _, m := range []member{b, c} {
			if got := stateJSON(t, m.fsm); got != want {
				return fmt.Errorf("%s differs from the leader", m.g.ID())
			}
		}
		return nil
	})
	if s, _ := c.fsm.view(); len(s.Models) == 0 || len(c.fsm.readAudit(100)) != 50 {
		t.Fatalf("the late member: %d models, %d audit entries", len(s.Models), len(c.fsm.readAudit(100)))
	}
}

// TestFence: the serving map is written by the leader of a term only
// while no newer term has published.
func TestFence(t *testing.T) {
	cli := testenv.Etcd(t)
	f := fence{cli: cli, cluster: topo.DefaultCluster}
	ctx := context.Background()
	rec := func(s string) txnOps { return mapRecord("m", s) }
	read := func() string {
		resp, err := cli.Get(ctx, topo.DefaultCluster.ModelKey("m"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}
	if err := f.publish(ctx, 2, rec("t2")); err != nil {
		t.Fatalf("first publication, term 2: %v", err)
	}
	if err := f.publish(ctx, 1, rec("t1")); !errors.Is(err, ErrFenced) {
		t.Fatalf("term 1 after term 2: %v", err)
	}
	if err := f.publish(ctx, 2, rec("t2 again")); err != nil {
		t.Fatalf("term 2 again: %v", err)
	}
	if err := f.publish(ctx, 10, rec("t10")); err != nil {
		t.Fatalf("term 10: %v", err)
	}
	var gone txnOps
	gone.Delete(topo.DefaultCluster.ModelKey("m"))
	if err := f.publish(ctx, 9, gone); !errors.Is(err, ErrFenced) {
		t.Fatalf("term 9 after term 10: %v", err)
	}
	if got := read(); got != "t10" {
		t.Fatalf("the map holds %q", got)
	}
	// Many models: several transactions, each fenced.
	var many txnOps
	for i := range 300 {
		many.Put(topo.DefaultCluster.ModelKey(fmt.Sprintf("m%03d", i)), []byte("x"))
	}
	many.Delete(topo.DefaultCluster.ModelKey("m"))
	if err := f.publish(ctx, 11, many); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, topo.DefaultCluster.ModelsPrefix(), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 300 || read() != "" {
		t.Fatalf("%d records after publishing 300 and removing m (%v)", len(resp.Kvs), err)
	}
}

// patchSeeds are schema 2 entries on model a (as modelJSON(a, 1)): a
// full version 1 of 4 partitions, then a delta 2 on it changing one
// partition's identity.
func patchSeeds(t testing.TB) [][]byte {
	ids := []string{"i0", "i1", "i2", "i3"}
	a := &ModelState{Schema: ModelStateSchema, Name: "a", Partitions: 2, Live: 1, Seq: 1}
	v1 := &ModelState{Schema: ModelStateSchema, Name: "a", Partitions: 4, Live: 1, Seq: 2,
		Versions: []Version{{Version: 1, Kind: "full", Phase: PhaseLive, Info: &topo.VersionInfo{Version: 1, IDs: ids, Chain: []uint64{1}}}}}
	v2 := *v1
	v2.Seq = 3
	d := slices.Clone(ids)
	d[2] = "j2"
	v2.Versions = append(slices.Clone(v1.Versions), Version{Version: 2, Kind: "delta", Parent: 1, Phase: PhaseStaging, Info: &topo.VersionInfo{Version: 2, IDs: d, Chain: []uint64{2, 1}}})
	var out [][]byte
	for _, step := range [][2]*ModelState{{a, v1}, {v1, &v2}} {
		p, ok := patchOf(step[0], step[1])
		if !ok {
			t.Fatal("no patch")
		}
		out = append(out, entryJSON(t, change{patches: map[string]modelPatch{"a": p}}, nil, time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)))
	}
	return out
}

// TestRaftPatches: patches rebuild the leader's state on a member, a
// delta's carrying only the identity it changed; patches that do not
// apply to the member's state are refused, leaving it as it was.
func TestRaftPatches(t *testing.T) {
	seeds := patchSeeds(t)
	r := newReplicated(AuditRetention{})
	applyEntry(r, 1, entryJSON(t, change{states: map[string][]byte{"a": modelJSON(t, "a", 1)}}, nil, time.Now()))
	for i, e := range seeds {
		if err, bad := applyEntry(r, uint64(2+i), e).(error); bad {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	if !strings.Contains(string(seeds[1]), `"ids_changed":[2]`) || strings.Contains(string(seeds[1]), `"i0"`) {
		t.Errorf("the delta's entry carries more than its changed identity: %s", seeds[1])
	}
	s, _ := r.view()
	if v := s.Models["a"].version(2); v == nil || !slices.Equal(v.Info.IDs, []string{"i0", "i1", "j2", "i3"}) {
		t.Fatalf("version 2 after the patches: %+v", v)
	}
	before := stateJSON(t, r)
	for name, e := range map[string]string{
		"base missing":         `{"schema":2,"at":"2026-11-24T00:00:00Z","models":{"a":{"head":{"schema":2,"name":"a","versions":null},"put":[{"version":3,"phase":"ready","info":{"version":3,"hash":"","bias":0,"ids":["x"]},"ids_base":9,"ids_changed":[0]}]}}}`,
		"same info, none":      `{"schema":2,"at":"2026-11-24T00:00:00Z","models":{"a":{"head":{"schema":2,"name":"a","versions":null},"put":[{"version":5,"phase":"ready","same_info":true}]}}}`,
		"out of order":         `{"schema":2,"at":"2026-11-24T00:00:00Z","models":{"a":{"head":{"schema":2,"name":"a","versions":null},"put":[{"version":2,"phase":"ready"},{"version":1,"phase":"ready"}]}}}`,
		"changed out of range": `{"schema":2,"at":"2026-11-24T00:00:00Z","models":{"a":{"head":{"schema":2,"name":"a","versions":null},"put":[{"version":3,"phase":"ready","info":{"version":3,"hash":"","bias":0,"ids":["x"]},"ids_base":1,"ids_changed":[9]}]}}}`,
		"misfiled":             `{"schema":2,"at":"2026-11-24T00:00:00Z","models":{"a":{"head":{"schema":2,"name":"b","versions":null}}}}`,
		"patched and gone":     `{"schema":2,"at":"2026-11-24T00:00:00Z","gone":["a"],"models":{"a":{"head":{"schema":2,"name":"a","versions":null}}}}`,
	} {
		if err, refused := applyEntry(r, 10, []byte(e)).(error); !refused || !errors.Is(err, errEntry) || stateJSON(t, r) != before {
			t.Errorf("%s: applied (%v), or the state changed", name, err)
		}
	}
}

// FuzzRaftEntry: no entry makes a member panic, and one refused leaves
// the state as it was.
func FuzzRaftEntry(f *testing.F) {
	at := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	f.Add(entryJSON(f, change{states: map[string][]byte{"a": modelJSON(f, "a", 2)}, cordons: []byte("x"), audit: []AuditEntry{{Time: at, Op: "pin"}}}, []string{"s1"}, at))
	f.Add([]byte(`{"schema":1,"at":"2026-11-24T00:00:00Z","gone":["a","a"],"cordons":null}`))
	for _, p := range patchSeeds(f) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newReplicated(AuditRetention{Keep: 4})
		applyEntry(r, 1, entryJSON(t, change{states: map[string][]byte{"a": modelJSON(t, "a", 1)}}, nil, at))
		applyEntry(r, 2, patchSeeds(t)[0])
		before := stateJSON(t, r)
		if err, refused := applyEntry(r, 3, data).(error); refused {
			if !errors.Is(err, errEntry) || stateJSON(t, r) != before {
				t.Fatalf("refused with %v, state changed: %v", err, stateJSON(t, r) != before)
			}
			return
		}
		s, _ := r.view()
		for name, ms := range s.Models {
			if ms == nil || ms.Name != name {
				t.Fatalf("model %q holds %+v", name, ms)
			}
		}
		if len(r.readAudit(1<<20)) > 4 {
			t.Fatal("audit over its bound")
		}
	})
}

// FuzzRaftSnapshot: no snapshot file makes a member panic; one refused
// leaves the state as it was, and one restored holds only models filed
// under their own names.
func FuzzRaftSnapshot(f *testing.F) {
	at := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	r := newReplicated(AuditRetention{})
	applyEntry(r, 1, entryJSON(f, change{states: map[string][]byte{"a": modelJSON(f, "a", 4)}, cordons: []byte("x"),
		audit: []AuditEntry{{Time: at, Op: "pin", Result: "ok"}}}, []string{"s1"}, at))
	snap, _ := r.Snapshot()
	var sink bufSink
	if err := snap.Persist(&sink); err != nil {
		f.Fatal(err)
	}
	f.Add(sink.Bytes())
	f.Add([]byte(`{"schema":1,"models":{"a":{"schema":2,"name":"a","versions":[{"version":1}]}},"audit_seq":18446744073709551615}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newReplicated(AuditRetention{})
		applyEntry(r, 1, entryJSON(t, change{states: map[string][]byte{"b": modelJSON(t, "b", 1)}}, nil, at))
		before := stateJSON(t, r)
		if err := r.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			if stateJSON(t, r) != before {
				t.Fatalf("a refused snapshot (%v) changed the state", err)
			}
			return
		}
		s, _ := r.view()
		for name, ms := range s.Models {
			if ms == nil || ms.Name != name {
				t.Fatalf("model %q holds %+v", name, ms)
			}
		}
	})
}
