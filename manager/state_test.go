package manager

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/model"
)

// sim replays events through Decide the way the manager does, with
// shards that load exactly what the map assigns them (or not, when told).
type sim struct {
	t      *testing.T
	s      *State
	p      Policy
	parts  int
	queue  []Validate
	audit  []AuditEntry
	broken map[uint64]string // version → why its files fail validation
	parent map[uint64]uint64 // delta → parent
	files  map[uint64]string // version → fingerprint
	shards map[string]topo.ShardInfo
	// removed versions' files are gone: shards cannot load them again
	removed map[uint64]bool
	// digests: identities are SHA-256 hex, as codec gives them
	digests bool
	// golden: the versions with golden requests
	golden map[uint64]bool
	// trusting: do not check that Decide leaves its input alone (a long
	// run checked elsewhere)
	trusting bool
	// size is each version's files' bytes (0: none given)
	size int64
	acts []Action // the last event's
}

func newSim(t *testing.T, p Policy) *sim {
	return &sim{t: t, s: &State{Models: map[string]*ModelState{}}, p: p, parts: 4,
		broken: map[uint64]string{}, parent: map[uint64]uint64{}, files: map[uint64]string{}, shards: map[string]topo.ShardInfo{},
		removed: map[uint64]bool{}}
}

func (x *sim) do(ev Event) error {
	x.t.Helper()
	var before []byte
	if !x.trusting {
		before, _ = json.Marshal(x.s.Models)
	}
	next, acts, err := Decide(x.s, ev, x.p)
	if !x.trusting {
		if after, _ := json.Marshal(x.s.Models); string(after) != string(before) {
			x.t.Fatalf("Decide modified its input state on %T", ev)
		}
	}
	x.acts = acts
	for _, a := range acts {
		switch a := a.(type) {
		case Validate:
			x.queue = append(x.queue, a)
		case AuditEntry:
			x.audit = append(x.audit, a)
		}
	}
	x.s = next
	return err
}

// ids is version v's identity per partition in this simulated repository.
func (x *sim) ids(v uint64) []string {
	out := make([]string, x.parts)
	for p := range out {
		out[p] = fmt.Sprintf("v%d-p%d-%s", v, p, x.files[v])
		if x.digests {
			d := sha256.Sum256([]byte(out[p]))
			out[p] = hex.EncodeToString(d[:])
		}
	}
	return out
}

// chain is version v's chain, newest first.
func (x *sim) chain(v uint64) []uint64 {
	out := []uint64{v}
	for x.parent[v] != 0 {
		v = x.parent[v]
		out = append(out, v)
	}
	return out
}

// publish puts versions in the repository (delta when parent != 0) and
// scans.
func (x *sim) scan(versions ...uint64) {
	x.t.Helper()
	var found []Found
	for _, v := range versions {
		if x.files[v] == "" {
			x.files[v] = "f1"
		}
		f := Found{Version: v, Kind: "full", Files: x.files[v]}
		if p := x.parent[v]; p != 0 {
			f.Kind, f.Parent = "delta", p
		}
		found = append(found, f)
	}
	x.do(Scanned{Models: map[string][]Found{"m": found}})
}

// validate runs every queued validation.
func (x *sim) validate() {
	x.t.Helper()
	for len(x.queue) > 0 {
		v := x.queue[0]
		x.queue = x.queue[1:]
		x.do(Started(v))
		ev := Checked{Model: v.Model, Version: v.Version, Files: x.files[v.Version], Golden: x.golden[v.Version], Bytes: x.size}
		if why := x.broken[v.Version]; why != "" {
			ev.Err = why
		} else {
			ev.Info = &topo.VersionInfo{Version: v.Version, Shape: model.Shape{Type: "lr"}, IDs: x.ids(v.Version), Chain: x.chain(v.Version)}
		}
		x.do(ev)
	}
}

// load makes every shard in only (all when empty) hold what the map
// assigns it, and nothing else, then reports.
func (x *sim) load(only ...string) {
	x.t.Helper()
	m := x.s.Models["m"]
	a := m.Assignment()
	for id := range x.shards {
		if len(only) > 0 && !slices.Contains(only, id) {
			continue
		}
		si := topo.ShardInfo{Schema: topo.Schema, ID: id, Applied: map[string]uint64{"m": a.Seq}, Weight: x.shards[id].Weight, Zone: x.shards[id].Zone, Budget: x.shards[id].Budget}
		for _, v := range a.Kept() {
			if x.removed[v] {
				// what it held of a removed version it keeps; it cannot load more
				for _, l := range x.shards[id].Loaded {
					if l.Version == v {
						si.Loaded = append(si.Loaded, l)
					}
				}
				continue
			}
			l := topo.Loaded{Model: "m", Version: v}
			for p, reps := range a.Replicas {
				if slices.Contains(reps, id) {
					l.Have, l.IDs = append(l.Have, uint32(p)), append(l.IDs, a.Info(v).IDs[p])
				}
			}
			if len(l.Have) > 0 {
				si.Loaded = append(si.Loaded, l)
			}
		}
		x.shards[id] = si
	}
	x.report()
}

func (x *sim) report() { x.do(ShardsChanged{Shards: maps.Clone(x.shards)}) }

// replicasOn counts, per shard, the replicas of m's partitions placed on it.
func (x *sim) replicasOn() map[string]int {
	n := map[string]int{}
	for _, r := range x.s.Models["m"].Replicas {
		for _, id := range r {
			n[id]++
		}
	}
	return n
}

func (x *sim) join(ids ...string) {
	for _, id := range ids {
		x.shards[id] = topo.ShardInfo{Schema: topo.Schema, ID: id}
	}
	x.report()
}

// settleAll loads until the map stops changing.
func (x *sim) settleAll() {
	x.t.Helper()
	for range 10 {
		before := x.s.Models["m"].Seq // it counts the map record's changes
		x.load()
		if x.s.Models["m"].Seq == before {
			return
		}
	}
	x.t.Fatal("the map never settles")
}

func (x *sim) cmd(op string, v uint64) error {
	return x.do(Command{Op: op, Model: "m", Version: v, At: time.Unix(1, 0), From: "test"})
}

func (x *sim) expect(live, staged uint64, standby ...uint64) {
	x.t.Helper()
	m := x.s.Models["m"]
	if m.Live != live || m.Staged != staged || fmt.Sprint(m.Standby()) != fmt.Sprint(standby) && len(standby)+len(m.Standby()) > 0 {
		x.t.Fatalf("live %d staged %d standby %v; want live %d staged %d standby %v", m.Live, m.Staged, m.Standby(), live, staged, standby)
	}
}

func (x *sim) phase(v uint64) Phase {
	if ver := x.s.Models["m"].version(v); ver != nil {
		return ver.Phase
	}
	return ""
}

// TestDecideLifecycle replays a model's life: first version, rollouts
// of full and delta versions, a damaged version rejected and repaired,
// rollbacks, pins and unpin, with shards loading what they are told.
func TestDecideLifecycle(t *testing.T) {
	x := newSim(t, Policy{Replicas: 2, KeepVersions: 2, KeepDeltas: 20})
	x.scan(1)
	if x.phase(1) != PhaseDiscovered || len(x.queue) != 1 {
		t.Fatalf("new version: phase %s, %d validations queued", x.phase(1), len(x.queue))
	}
	x.validate()
	x.expect(0, 0) // no word from the shards yet: nothing decided
	x.report()
	x.expect(0, 1) // staged, but no shard holds it
	if x.phase(1) != PhaseStaging {
		t.Fatalf("phase %s", x.phase(1))
	}
	x.join("s0", "s1", "s2")
	x.expect(0, 1)
	x.load("s0", "s1")
	x.expect(0, 1) // s2 has not loaded its partitions
	x.load()
	x.expect(1, 0)

	// A new full version is staged beside the live one, committed when
	// every replica holds it; the old one stays as standby.
	x.scan(1, 2)
	x.validate()
	x.expect(1, 2)
	x.load("s0")
	x.expect(1, 2)
	x.settleAll()
	x.expect(2, 0, 1)

	// A delta on 2.
	x.parent[3] = 2
	x.scan(1, 2, 3)
	x.validate()
	x.settleAll()
	x.expect(3, 0, 2, 1)

	// A damaged version is rejected with its reason; repaired (its files
	// change), it is validated again and served.
	x.broken[4] = "part-00001.bin: SHA-256 does not match the manifest"
	x.scan(1, 2, 3, 4)
	x.validate()
	if x.phase(4) != PhaseRejected || !strings.Contains(x.s.Models["m"].version(4).Reason, "SHA-256") {
		t.Fatalf("damaged version: %+v", x.s.Models["m"].version(4))
	}
	x.settleAll()
	x.expect(3, 0, 2, 1)
	x.scan(1, 2, 3, 4) // unchanged files: not validated again
	if len(x.queue) != 0 {
		t.Fatalf("unchanged rejected version queued again: %v", x.queue)
	}
	delete(x.broken, 4)
	x.files[4] = "f2"
	x.scan(1, 2, 3, 4)
	x.validate()
	x.settleAll()
	x.expect(4, 0, 3, 2, 1) // 3 is a delta on 2: kept with it; 1 is the second full version

	// Rollback: the most recent standby, at once (its partitions are
	// loaded), pinned.
	if err := x.cmd(OpRollback, 0); err != nil {
		t.Fatal(err)
	}
	x.expect(3, 0, 4, 2, 1)
	if x.s.Models["m"].Pin != 3 {
		t.Fatalf("rollback did not pin: %d", x.s.Models["m"].Pin)
	}
	if got := x.audit[len(x.audit)-1].Result; got != "ok: live 3" {
		t.Fatalf("audit result %q, want the state after the call", got)
	}
	// A newer version does not move a pinned model.
	x.scan(1, 2, 3, 4, 5)
	x.validate()
	x.settleAll()
	x.expect(3, 0, 4, 2, 1)
	if x.phase(5) != PhaseReady {
		t.Fatalf("version 5 while pinned: %s", x.phase(5))
	}
	if err := x.cmd(OpRollback, 1); err != nil {
		t.Fatal(err)
	}
	x.expect(1, 0, 3, 4, 2)
	// Unpin: follow the newest again (5 is loaded afresh).
	if err := x.cmd(OpUnpin, 0); err != nil {
		t.Fatal(err)
	}
	x.expect(1, 5, 3, 4, 2)
	x.settleAll()
	// Kept: the two full versions most recently live besides 5, with
	// their deltas: 1, then 3 (on 2) and 2; 4 was live longer ago.
	x.expect(5, 0, 1, 3, 2)
	// 4 retired: it leaves the state, and scans no longer find it.
	if m := x.s.Models["m"]; x.phase(4) != "" || m.Floor < 4 {
		t.Fatalf("retired version 4: phase %q, floor %d", x.phase(4), m.Floor)
	}
	x.scan(1, 2, 3, 4, 5)
	if x.phase(4) != "" || len(x.queue) != 0 {
		t.Fatalf("a scan found retired version 4 again: phase %q, queued %v", x.phase(4), x.queue)
	}

	// Refusals: 409 naming what is kept, 404 for an unknown model; the
	// state does not change and each is audited.
	n := len(x.audit)
	err := x.cmd(OpRollback, 4)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "version 4: it is retired") || !strings.Contains(err.Error(), "standby versions: 1, 3, 2") {
		t.Fatalf("rollback to a retired version: %v", err)
	}
	x.broken[6] = "bad"
	x.scan(1, 2, 3, 4, 5, 6)
	x.validate()
	if err := x.cmd(OpPin, 6); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "rejected: bad") {
		t.Fatalf("pin to a rejected version: %v", err)
	}
	if err := x.cmd(OpRollback, 6); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "version 6: it was rejected: bad") {
		t.Fatalf("rollback to a rejected version: %v", err)
	}
	if err := x.cmd(OpRollback, 99); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "no such version") {
		t.Fatalf("rollback to an unknown version: %v", err)
	}
	if err := x.cmd(OpPin, 99); !errors.Is(err, ErrConflict) {
		t.Fatalf("pin to an unknown version: %v", err)
	}
	if err := x.do(Command{Op: OpPin, Model: "nope", Version: 1}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pin of an unknown model: %v", err)
	}
	x.expect(5, 0, 1, 3, 2)
	if len(x.audit) != n+6 || !strings.Contains(x.audit[n].Result, "retired") {
		t.Fatalf("audit: %+v", x.audit[n:])
	}
	// A pin to a retired version is refused: the state no longer has it.
	if err := x.cmd(OpPin, 4); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "version 4 is retired") {
		t.Fatalf("pin to a retired version: %v", err)
	}
	// A pin to a standby version stages nothing: it is loaded.
	if err := x.cmd(OpPin, 1); err != nil {
		t.Fatal(err)
	}
	x.expect(1, 0, 5, 3, 2)
	// Rescan validates rejected versions again.
	delete(x.broken, 6)
	if err := x.do(Command{Op: OpRescan}); err != nil {
		t.Fatal(err)
	}
	x.validate()
	if x.phase(6) != PhaseReady {
		t.Fatalf("after rescan: %s", x.phase(6))
	}
}

// TestDecideReplays: the same events give the same states.
func TestDecideReplays(t *testing.T) {
	run := func() string {
		x := newSim(t, Policy{Replicas: 1, KeepVersions: 1, KeepDeltas: 20})
		x.join("a", "b")
		for v := uint64(1); v <= 4; v++ {
			vs := make([]uint64, v)
			for i := range vs {
				vs[i] = uint64(i + 1)
			}
			x.scan(vs...)
			x.validate()
			x.settleAll()
		}
		x.cmd(OpRollback, 0)
		b, _ := json.Marshal(x.s.Models)
		return string(b)
	}
	if a, b := run(), run(); a != b {
		t.Fatalf("two replays differ:\n%s\n%s", a, b)
	}
}

// TestDecideShardRestartMidRollout: with one replica, a shard restarted
// during a rollout comes back holding only part of what it had; the
// staged version must not be committed until every partition of it is
// held again, and the live version stays the one in the map.
func TestDecideShardRestartMidRollout(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20})
	x.join("s0", "s1")
	x.scan(1)
	x.validate()
	x.settleAll()
	x.scan(1, 2)
	x.validate()
	x.load("s0") // s0 holds 1 and 2; s1 only 1
	x.expect(1, 2)
	// s1 restarts: back with the staged version only, none of the live.
	a := x.s.Models["m"].Assignment()
	si := topo.ShardInfo{Schema: topo.Schema, ID: "s1", Applied: map[string]uint64{"m": a.Seq}}
	l := topo.Loaded{Model: "m", Version: 2}
	for p, reps := range a.Replicas {
		if reps[0] == "s1" {
			l.Have, l.IDs = append(l.Have, uint32(p)), append(l.IDs, a.Info(2).IDs[p])
			break // only one partition reloaded so far
		}
	}
	si.Loaded = []topo.Loaded{l}
	x.shards["s1"] = si
	x.report()
	x.expect(1, 2)
	x.settleAll()
	x.expect(2, 0, 1)
}

// TestDecideShardLeavesAndMismatch: a leaving shard's partitions move
// make-before-break; a shard reporting content other than validated is
// assigned nothing of the model.
func TestDecideShardLeavesAndMismatch(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20})
	x.join("s0", "s1")
	x.scan(1)
	x.validate()
	x.settleAll()
	// s2 joins: partitions moving to it keep their old holder until s2
	// holds them.
	x.join("s2")
	a := x.s.Models["m"].Assignment()
	moved := 0
	for p, reps := range a.Replicas {
		if reps[0] == "s2" {
			moved++
			if len(reps) != 2 {
				t.Fatalf("partition %d moved to s2 without its old holder: %v", p, reps)
			}
		}
	}
	if moved == 0 {
		t.Fatal("nothing moved to s2")
	}
	x.settleAll()
	for p, reps := range x.s.Models["m"].Assignment().Replicas {
		if len(reps) != 1 {
			t.Fatalf("partition %d after the handover: %v", p, reps)
		}
	}
	// s2 now reports another repository's content for version 1.
	si := x.shards["s2"]
	si.Loaded[0].IDs = slices.Clone(si.Loaded[0].IDs)
	si.Loaded[0].IDs[0] = "forged"
	x.shards["s2"] = si
	x.report()
	if got := x.s.Mismatches("m"); fmt.Sprint(got) != "map[s2:[1]]" {
		t.Fatalf("mismatches: %v", got)
	}
	for p, reps := range x.s.Models["m"].Assignment().Replicas {
		if slices.Contains(reps, "s2") && len(reps) == 1 {
			t.Fatalf("partition %d left only with the mismatched shard: %v", p, reps)
		}
	}
}

// TestDecideChains: a delta on a rejected parent is rejected; a version
// with another partition count is rejected; a standby version leaving the
// repository is forgotten, a live one stays live until replaced.
func TestDecideChains(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20})
	x.join("s0")
	x.scan(1)
	x.validate()
	x.settleAll()
	x.broken[2] = "bad file"
	x.parent[3] = 2
	x.scan(1, 2, 3)
	x.validate()
	if x.phase(3) != PhaseRejected || !strings.Contains(x.s.Models["m"].version(3).Reason, "parent version 2 is rejected") {
		t.Fatalf("delta on a rejected parent: %+v", x.s.Models["m"].version(3))
	}
	x.parts = 8
	x.scan(1, 2, 3, 4)
	x.validate()
	if x.phase(4) != PhaseRejected || !strings.Contains(x.s.Models["m"].version(4).Reason, "fixed per model") {
		t.Fatalf("repartitioned version: %+v", x.s.Models["m"].version(4))
	}
	x.parts = 4
	x.scan(1, 5)
	x.validate()
	x.settleAll()
	x.expect(5, 0, 1)
	x.scan(5) // 1 removed: forgotten
	x.expect(5, 0)
	x.scan(6) // the live version removed: still live until 6 is
	if v := x.s.Models["m"].version(5); v == nil || !v.Gone {
		t.Fatalf("live version removed: %+v", v)
	}
	x.expect(5, 0)
	x.validate()
	x.settleAll()
	x.expect(6, 0)
	if x.s.Models["m"].version(5) != nil {
		t.Fatal("a removed version kept after it stopped being live")
	}
	// Removing the live version's directory when only older versions
	// remain is no rollback: it stays live.
	x.scan(6, 7)
	x.validate()
	x.settleAll()
	x.expect(7, 0, 6)
	x.scan(6)
	x.settleAll()
	x.expect(7, 0, 6)
	// A rollback whose standby version is no longer held everywhere is
	// staged; abandoned (unpin), the version goes back to standby, still a
	// rollback target.
	si := x.shards["s0"]
	si.Loaded = slices.DeleteFunc(slices.Clone(si.Loaded), func(l topo.Loaded) bool { return l.Version == 6 })
	x.shards["s0"] = si
	x.report()
	if err := x.cmd(OpRollback, 0); err != nil {
		t.Fatal(err)
	}
	x.expect(7, 6)
	if err := x.cmd(OpUnpin, 0); err != nil {
		t.Fatal(err)
	}
	if x.phase(6) != PhaseStandby {
		t.Fatalf("abandoned rollback target: %s, want standby", x.phase(6))
	}
	// The removed live version 7 stays live while shards hold it whole.
	// Once they do not (a shard died; none can load 7 again), the newest
	// other valid version takes over rather than leave the model down.
	if v := x.s.Models["m"].version(7); !strings.Contains(v.Reason, "still served") {
		t.Fatalf("removed live version: %+v", v)
	}
	x.removed[7] = true
	si = x.shards["s0"]
	si.Loaded = slices.DeleteFunc(slices.Clone(si.Loaded), func(l topo.Loaded) bool { return l.Version == 7 })
	x.shards["s0"] = si
	x.report()
	x.expect(7, 6)
	x.settleAll() // the shard loads 6 again
	x.expect(6, 0)
	if x.s.Models["m"].version(7) != nil {
		t.Fatal("the removed version is remembered after it stopped being live")
	}
}

// TestDecideDistrustsStaleReports: a shard's report that follows an
// older record may list a partition the shard is about to drop on that
// record's word; it must not complete a handover.
func TestDecideDistrustsStaleReports(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20})
	x.join("s0", "s1")
	x.scan(1)
	x.validate()
	x.settleAll()
	stale := x.s.Models["m"].Seq
	x.join("s2") // partitions move to s2; their old holders stay meanwhile
	a := x.s.Models["m"].Assignment()
	var moved []uint32
	for p, reps := range a.Replicas {
		if reps[0] == "s2" {
			moved = append(moved, uint32(p))
		}
	}
	// s2 claims the moved partitions, by a report following the record
	// from before it was given them.
	l := topo.Loaded{Model: "m", Version: 1}
	for _, p := range moved {
		l.Have, l.IDs = append(l.Have, p), append(l.IDs, a.Info(1).IDs[p])
	}
	x.shards["s2"] = topo.ShardInfo{Schema: topo.Schema, ID: "s2", Applied: map[string]uint64{"m": stale}, Loaded: []topo.Loaded{l}}
	x.report()
	for _, p := range moved {
		if reps := x.s.Models["m"].Assignment().Replicas[p]; len(reps) != 2 {
			t.Fatalf("partition %d handed over on a stale report: %v", p, reps)
		}
	}
	// The same report following the newest record completes it.
	si := x.shards["s2"]
	si.Applied = map[string]uint64{"m": x.s.Models["m"].Seq}
	x.shards["s2"] = si
	x.report()
	for _, p := range moved {
		if reps := x.s.Models["m"].Assignment().Replicas[p]; len(reps) != 1 || reps[0] != "s2" {
			t.Fatalf("partition %d after a current report: %v", p, reps)
		}
	}
}

// TestDecideFilesChangedAfterValidation: a served version whose files
// change is checked again and the result shown; what is served does not
// change.
func TestDecideFilesChangedAfterValidation(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20})
	x.join("s0")
	x.scan(1)
	x.validate()
	x.settleAll()
	ids := x.ids(1)
	x.files[1] = "touched" // same bytes, new modification time
	x.scan(1)
	if len(x.queue) != 1 || !strings.Contains(x.s.Models["m"].version(1).Reason, "checking them again") {
		t.Fatalf("changed files: queue %v, reason %q", x.queue, x.s.Models["m"].version(1).Reason)
	}
	x.queue = nil
	x.do(Checked{Model: "m", Version: 1, Files: "touched", Info: &topo.VersionInfo{Version: 1, Shape: model.Shape{Type: "lr"}, IDs: ids}})
	if v := x.s.Models["m"].version(1); v.Reason != "" || v.Phase != PhaseLive {
		t.Fatalf("same content checked again: %+v", v)
	}
	x.files[1] = "damaged"
	x.scan(1)
	x.queue = nil
	x.do(Checked{Model: "m", Version: 1, Files: "damaged", Err: "SHA-256 does not match"})
	if v := x.s.Models["m"].version(1); !strings.Contains(v.Reason, "no longer match") || v.Phase != PhaseLive {
		t.Fatalf("damaged after validation: %+v", v)
	}
	x.expect(1, 0)
}

// TestStateStaysSmall: a 64-partition model through 2,000 versions —
// deltas one after another, a full version every 200 (what compaction
// publishes), some rejected, rollbacks and pins along the way — keeps its
// persisted state and its serving map record under 256 KiB, and
// rollback still reaches the newest standby versions.
func TestStateStaysSmall(t *testing.T) {
	const bound = 256 << 10
	x := newSim(t, Policy{Replicas: 2, KeepVersions: 2, KeepDeltas: 20})
	x.parts, x.digests, x.trusting = 64, true, true
	x.join("a", "b", "c", "d")
	var repo []uint64
	biggest := [2]int{}
	n := uint64(2000)
	if testenv.RaceEnabled {
		n = 400 // the race detector checks the state machine's concurrency, which a long run adds nothing to
	}
	for v := uint64(1); v <= n; v++ {
		if _, ok := x.parent[v]; !ok && v%200 != 1 {
			x.parent[v] = v - 1
		}
		if v%97 == 0 {
			x.broken[v] = "damaged"
			x.parent[v+1] = v - 1
		}
		repo = append(repo, v)
		x.scan(repo...)
		x.validate()
		x.settleAll()
		if v%333 == 0 {
			if err := x.cmd(OpRollback, 0); err != nil {
				t.Fatalf("at %d: %v", v, err)
			}
			x.settleAll()
			if err := x.cmd(OpUnpin, 0); err != nil {
				t.Fatal(err)
			}
			x.settleAll()
		}
		if v%10 != 0 {
			continue
		}
		m := x.s.Models["m"]
		st, _ := json.Marshal(m)
		a, _ := json.Marshal(m.Assignment())
		biggest = [2]int{max(biggest[0], len(st)), max(biggest[1], len(a))}
		if len(st) > bound || len(a) > bound {
			t.Fatalf("after version %d: state %d bytes, map record %d bytes; bound %d", v, len(st), len(a), bound)
		}
	}
	m := x.s.Models["m"]
	t.Logf("%d versions: largest state %d bytes, largest map record %d bytes; %d versions listed, floor %d", n, biggest[0], biggest[1], len(m.Versions), m.Floor)
	if m.Live != n {
		t.Fatalf("live %d, want %d", m.Live, n)
	}
	standby := m.Standby()
	if len(standby) == 0 || standby[0] != n-1 {
		t.Fatalf("standby %v: the version before the live one is not the first rollback target", standby)
	}
	var deltas int
	for _, v := range standby {
		if m.version(v).Kind == "delta" && m.base(v) == m.base(n) {
			deltas++
		}
	}
	if deltas != 20 {
		t.Fatalf("%d standby deltas on the live version's base, want 20 (--keep-deltas)", deltas)
	}
	if err := x.cmd(OpRollback, 0); err != nil {
		t.Fatal(err)
	}
	x.settleAll()
	x.expect(n-1, 0, append([]uint64{n}, standby[1:]...)...)
}

// TestEventsTouchTheirModelOnly: a validation result or an operator's
// call about one model copies and settles that model only; the next
// state shares every other model with the last (so the manager neither
// settles, marshals nor compares them).
func TestEventsTouchTheirModelOnly(t *testing.T) {
	s := &State{Models: map[string]*ModelState{}, Shards: map[string]topo.ShardInfo{"a": {Schema: topo.ShardInfoSchema, ID: "a"}}}
	found := map[string][]Found{}
	for i := range 50 {
		found[fmt.Sprintf("m%d", i)] = []Found{{Version: 1, Kind: "full", Files: "f"}, {Version: 2, Kind: "full", Files: "f"}}
	}
	p := Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20}
	s, _, _ = Decide(s, Scanned{Models: found}, p)
	for name := range found {
		s, _, _ = Decide(s, Checked{Model: name, Version: 1, Files: "f", Info: &topo.VersionInfo{Version: 1, Shape: model.Shape{Type: "lr"}, IDs: []string{"x"}, Chain: []uint64{1}}}, p)
	}
	for _, ev := range []Event{
		Started{Model: "m7", Version: 2},
		Checked{Model: "m7", Version: 2, Files: "f", Info: &topo.VersionInfo{Version: 2, Shape: model.Shape{Type: "lr"}, IDs: []string{"y"}, Chain: []uint64{2}}},
		Command{Op: OpPin, Model: "m7", Version: 1},
		Command{Op: OpUnpin, Model: "nope"},
	} {
		next, _, err := Decide(s, ev, p)
		if _, unknown := ev.(Command); err != nil && !(unknown && errors.Is(err, ErrNotFound)) {
			t.Fatalf("%T: %v", ev, err)
		}
		for name, m := range s.Models {
			c, ok := ev.(Command)
			if shared := next.Models[name] == m; shared != (name != "m7" || ok && c.Model != "m7") {
				t.Fatalf("%T: model %s shared %v", ev, name, shared)
			}
		}
		s = next
	}
	if m := s.Models["m7"]; m.Pin != 1 || m.version(2).Phase != PhaseReady {
		t.Fatalf("m7: pin %d, version 2 %s", m.Pin, m.version(2).Phase)
	}
}

// TestPruneKeepsWhatIsNeeded: prune removes only versions outside the
// protected set — live, staged, pinned, standby, pending and every
// version their chains need — keeping the newest N of the rest; it never
// removes a version the state does not know yet, and is refused when the
// repository cannot be written.
func TestPruneKeepsWhatIsNeeded(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 1, KeepDeltas: 2})
	x.join("a")
	// 1 full; 2..6 deltas on it; 7 full; 8, 9 deltas on 7; 10 broken.
	for v := uint64(2); v <= 9; v++ {
		if v != 7 {
			x.parent[v] = v - 1
		}
	}
	x.broken[10] = "bad"
	var repo []uint64
	for v := uint64(1); v <= 10; v++ {
		repo = append(repo, v)
		x.scan(repo...)
		x.validate()
		x.settleAll()
	}
	// Live 9 (chain 9, 8, 7); standby: 8, 7 on base 7 and, of base 1
	// (kept: --keep-versions 1), 6, 5 and 1; their chains need 2..4 too.
	x.expect(9, 0, 8, 7, 6, 5, 1)
	prune := func(keep int, listed ...uint64) []uint64 {
		t.Helper()
		n := len(x.audit)
		if err := x.do(Command{Op: OpPrune, Model: "m", Keep: keep, Listed: listed, From: "test"}); err != nil {
			t.Fatal(err)
		}
		if len(x.audit) != n+1 {
			t.Fatal("prune not audited")
		}
		var removed []uint64
		for _, a := range x.acts {
			if r, ok := a.(Remove); ok {
				removed = r.Versions
			}
		}
		return removed
	}
	listed := append(repo, 11) // 11: published a moment ago, not yet scanned
	if got := prune(0, listed...); fmt.Sprint(got) != "[10]" {
		t.Fatalf("removed %v, want [10] (only the rejected version is outside the protected set)", got)
	}
	if got := prune(1, listed...); len(got) != 0 {
		t.Fatalf("keep 1 removed %v", got)
	}
	// With --keep-versions 0, base 1 and its deltas retire: they become
	// removable.
	x.s.Models["m"].Pin = 0
	x.p.KeepVersions = 0
	x.scan(repo...)
	x.settleAll()
	x.expect(9, 0, 8, 7)
	if got := prune(2, listed...); fmt.Sprint(got) != "[1 2 3 4 5]" {
		t.Fatalf("removed %v, want [1 2 3 4 5]: of 1..6 and 10 the newest two (10, 6) kept", got)
	}
	if err := x.do(Command{Op: OpPrune, Model: "m", Keep: 0, Listed: listed, ReadOnly: "read-only file system"}); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "needs write access") {
		t.Fatalf("prune without write access: %v", err)
	}
}

// TestBrokenChain: versions that left the state but that a kept chain
// needs are remembered by fingerprint; one removed or changed in the
// repository marks the versions whose chains need it, which then are no
// rollout's target, nor a rollback's; the live one stays while the
// shards hold it, and once they no longer do, a version that can still
// be loaded takes over. Put back as it was, the mark goes.
func TestBrokenChain(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20})
	x.join("a")
	x.scan(1)
	x.validate()
	x.settleAll()
	for v := uint64(2); v <= 5; v++ {
		x.parent[v] = v - 1
	}
	x.scan(1, 2, 3, 4, 5) // published together: 2..4 never go live
	x.validate()
	x.settleAll()
	x.expect(5, 0, 1)
	m := x.s.Models["m"]
	if len(m.Chained) != 3 || m.version(3) != nil {
		t.Fatalf("chained %v; versions %v", m.Chained, m.numbers())
	}
	scan := func(listed map[uint64]string) {
		t.Helper()
		x.do(Scanned{Models: map[string][]Found{"m": {
			{Version: 1, Kind: "full", Files: "f1"}, {Version: 5, Kind: "delta", Parent: 4, Files: "f1"}}},
			Listed: map[string]map[uint64]string{"m": listed}})
	}
	scan(map[uint64]string{1: "f1", 2: "f1", 4: "f1", 5: "f1"}) // 3 removed
	if v := x.s.Models["m"].version(5); !strings.Contains(v.Broken, "version 3 of its chain was removed") || x.s.Models["m"].Live != 5 {
		t.Fatalf("live %d, broken %q", x.s.Models["m"].Live, v.Broken)
	}
	if err := x.cmd(OpPin, 5); err != nil {
		t.Fatalf("pin to the live version, still served: %v", err)
	}
	// The shard restarts: it holds nothing, and cannot load 5 again.
	x.shards["a"] = topo.ShardInfo{Schema: topo.ShardInfoSchema, ID: "a"}
	x.removed[5] = true
	x.report()
	x.settleAll()
	x.expect(1, 0, 5) // 5 stays on standby, marked: no rollback goes to it
	if x.s.Models["m"].Pin != 5 {
		t.Fatal("the pin was dropped: it applies again once 5 can be loaded")
	}
	// 3 touched: validated again, same content, nothing breaks.
	scan(map[uint64]string{1: "f1", 2: "f1", 3: "touched", 4: "f1", 5: "f1"})
	if len(x.queue) != 1 || x.queue[0].Version != 3 {
		t.Fatalf("queued %v, want version 3 validated again", x.queue)
	}
	x.queue = nil
	x.do(Checked{Model: "m", Version: 3, Files: "touched", Info: &topo.VersionInfo{Version: 3, Shape: model.Shape{Type: "lr"}, IDs: x.ids(3), Chain: x.chain(3)}})
	if v := x.s.Models["m"].version(5); v.Broken != "" || !strings.HasPrefix(x.s.Models["m"].Chained[3], "touched ") {
		t.Fatalf("broken %q, chained %q", v.Broken, x.s.Models["m"].Chained[3])
	}
	// 3 damaged: the versions built on it break.
	x.files[3], x.broken[3] = "changed", "checksum mismatch"
	scan(map[uint64]string{1: "f1", 2: "f1", 3: "changed", 4: "f1", 5: "f1"})
	x.validate()
	if v := x.s.Models["m"].version(5); !strings.Contains(v.Broken, "files of version 3 of its chain changed") {
		t.Fatalf("broken %q", v.Broken)
	}
	delete(x.broken, 3)
	if err := x.cmd(OpRollback, 5); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "cannot be loaded") {
		t.Fatalf("rollback to a broken version: %v", err)
	}
	scan(map[uint64]string{1: "f1", 2: "f1", 3: "touched", 4: "f1", 5: "f1"})
	if v := x.s.Models["m"].version(5); v.Broken != "" {
		t.Fatalf("put back, still broken: %q", v.Broken)
	}
	// Another chain member removed: the versions built on it are marked.
	x.do(Scanned{Models: map[string][]Found{"m": {
		{Version: 1, Kind: "full", Files: "f1"}, {Version: 5, Kind: "delta", Parent: 4, Files: "f1"}}},
		Listed: map[string]map[uint64]string{"m": {1: "f1", 3: "f1", 4: "f1", 5: "f1"}}})
	if v := x.s.Models["m"].version(5); !strings.Contains(v.Broken, "version 2 of its chain was removed") {
		t.Fatalf("broken %q", v.Broken)
	}
}

// TestDecideWaitsForRouters: a version is committed only once every
// router can score it; a router that cannot holds it back for RouterWait
// from when the shards hold it (routers fetch from them), no longer; the
// reasons say which, and leave other reasons alone.
func TestDecideWaitsForRouters(t *testing.T) {
	t0 := time.Unix(1000, 0)
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, RouterWait: 30 * time.Second, Now: t0})
	router := func(id string, scores ...uint64) topo.RouterInfo {
		return topo.RouterInfo{Schema: topo.RouterInfoSchema, ID: id, Scores: map[string][]uint64{"m": scores}}
	}
	x.do(RoutersChanged{Routers: map[string]topo.RouterInfo{"r1": router("r1")}})
	x.join("s0")
	x.scan(1)
	x.validate()
	x.settleAll()
	x.expect(0, 1) // r1 has not said it can score 1
	if r := x.s.Models["m"].version(1).Reason; !strings.Contains(r, "waiting for routers to be able to score it: r1 (it has not said") {
		t.Fatalf("reason %q", r)
	}
	if d := x.s.RouterDeadline(x.p); !d.Equal(t0.Add(30 * time.Second)) {
		t.Fatalf("deadline %v", d)
	}
	x.do(RoutersChanged{Routers: map[string]topo.RouterInfo{"r1": router("r1", 1)}})
	x.expect(1, 0)

	// Version 2, staged at t0 but held by the shards only at t0+60s: r2,
	// which cannot score it, holds it back until t0+90s.
	slow := router("r2", 1)
	slow.Cannot = []topo.Unscorable{{Model: "m", Version: 2, Reason: "its dense part is being fetched"}}
	x.do(RoutersChanged{Routers: map[string]topo.RouterInfo{"r1": router("r1", 1, 2), "r2": slow}})
	x.scan(1, 2)
	x.validate()
	x.expect(1, 2)
	if d := x.s.RouterDeadline(x.p); !d.IsZero() {
		t.Fatalf("a deadline (%v) before the shards hold it", d)
	}
	x.p.Now = t0.Add(60 * time.Second)
	x.settleAll()
	x.expect(1, 2)
	if r := x.s.Models["m"].version(2).Reason; !strings.Contains(r, "r2 (its dense part is being fetched)") || strings.Contains(r, "r1") {
		t.Fatalf("reason %q", r)
	}
	x.p.Now = t0.Add(89 * time.Second)
	x.do(RoutersChanged{Routers: x.s.Routers})
	x.expect(1, 2)
	x.p.Now = t0.Add(91 * time.Second)
	x.do(RoutersChanged{Routers: x.s.Routers})
	x.expect(2, 0, 1)
	if r := x.s.Models["m"].version(2).Reason; !strings.Contains(r, "no longer hold it back") || !strings.Contains(r, "r2") {
		t.Fatalf("reason %q", r)
	}
	if d := x.s.RouterDeadline(x.p); !d.IsZero() {
		t.Fatalf("deadline %v after the commit", d)
	}
	// Once r2 can score it, the live version's reason goes.
	x.do(RoutersChanged{Routers: map[string]topo.RouterInfo{"r1": router("r1", 1, 2), "r2": router("r2", 1, 2)}})
	if r := x.s.Models["m"].version(2).Reason; r != "" {
		t.Fatalf("live version's reason %q after every router can score it", r)
	}

	// A reason of another kind is not overwritten by the routers'.
	x.scan(1, 2, 3)
	x.validate()
	x.s.Models["m"].version(3).Reason = "files changed after validation; checking them again"
	x.do(RoutersChanged{Routers: map[string]topo.RouterInfo{"r1": router("r1", 1, 2)}})
	if r := x.s.Models["m"].version(3).Reason; r != "files changed after validation; checking them again" {
		t.Fatalf("reason %q", r)
	}
}

// TestDecideRunsStagedGates: once every shard holds the staged version,
// its gates are asked for once; passing commits it, failing rejects it
// (and the deltas on it) and unstages it, the live version untouched.
func TestDecideRunsStagedGates(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, StagedGates: []string{GateValidator}, Now: time.Unix(1000, 0)})
	x.join("s0")
	runs := func() (n int) {
		for _, a := range x.acts {
			if g, ok := a.(RunGates); ok && fmt.Sprint(g.Gates) == "[validator]" {
				n++
			}
		}
		return n
	}
	x.scan(1)
	x.validate()
	x.load()
	x.expect(0, 1)
	if runs() != 1 {
		t.Fatalf("actions %+v, want one RunGates", x.acts)
	}
	x.load()
	if runs() != 0 {
		t.Fatal("gates asked for twice")
	}
	x.do(GatesChecked{Model: "m", Version: 1, Results: []GateResult{{Gate: GateValidator, Outcome: "passed"}}})
	x.expect(1, 0)

	x.parent[3] = 2
	x.scan(1, 2, 3)
	x.validate()
	x.settleAll()
	x.expect(1, 3) // the newest: the delta 3 on 2
	x.do(GatesChecked{Model: "m", Version: 3, Results: []GateResult{{Gate: GateValidator, Outcome: "failed", Reason: "AUC too low"}}})
	if v := x.s.Models["m"].version(3); v.Phase != PhaseRejected || v.Reason != "gate validator failed: AUC too low" {
		t.Fatalf("v3 %+v", v)
	}
	x.settleAll()
	x.expect(1, 2) // 2 is staged next, and gated
	x.do(GatesChecked{Model: "m", Version: 2, Results: []GateResult{{Gate: GateValidator, Outcome: "failed", Reason: "bad"}}})
	x.settleAll()
	x.expect(1, 0)
	if x.phase(2) != PhaseRejected {
		t.Fatalf("v2 %s", x.phase(2))
	}
	// A stale outcome (for a version no longer staged) changes nothing.
	x.do(GatesChecked{Model: "m", Version: 2, Results: []GateResult{{Gate: GateValidator, Outcome: "passed"}}})
	x.expect(1, 0)
}

// gateRuns lists the gates the last event asked to run, per version.
func (x *sim) gateRuns() map[uint64]string {
	out := map[uint64]string{}
	for _, a := range x.acts {
		if g, ok := a.(RunGates); ok {
			out[g.Version] = fmt.Sprint(g.Live, g.Gates)
		}
	}
	return out
}

// TestDecideGoldenHoldoutAccept: a version with golden requests runs the
// golden gate, a model with a hold-out set the hold-out gate (told the
// live version); a failed gate rejects, and an operator's accept, with
// a reason, validates the version again and records the gate's failure
// as accepted instead of rejecting it. Versions rejected otherwise, or
// by the finite gate, cannot be accepted.
func TestDecideGoldenHoldoutAccept(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, Holdout: []string{"m"}, Now: time.Unix(1000, 0)})
	x.golden = map[uint64]bool{1: true, 2: true}
	x.join("s0")
	x.scan(1)
	x.validate()
	x.load()
	if r := x.gateRuns(); r[1] != "0 [golden holdout]" {
		t.Fatalf("gates asked %v", r)
	}
	x.do(GatesChecked{Model: "m", Version: 1, Results: []GateResult{{Gate: GateGolden, Outcome: "passed"}, {Gate: GateHoldout, Outcome: "skipped", Reason: "no live version"}}})
	x.expect(1, 0)

	x.scan(1, 2)
	x.validate()
	x.load()
	if r := x.gateRuns(); r[2] != "1 [golden holdout]" {
		t.Fatalf("gates asked %v", r)
	}
	x.do(GatesChecked{Model: "m", Version: 2, Results: []GateResult{{Gate: GateGolden, Outcome: "failed", Reason: "line 1 row 0: served 0.5, want 0.6"}, {Gate: GateHoldout, Outcome: "passed"}}})
	x.settleAll()
	x.expect(1, 0)
	if v := x.s.Models["m"].version(2); v.Phase != PhaseRejected || v.Reason != "gate golden failed: line 1 row 0: served 0.5, want 0.6" {
		t.Fatalf("v2 %+v", v)
	}
	for _, c := range []struct {
		v      uint64
		reason string
		err    error
	}{{2, " ", ErrInvalid}, {1, "ok", ErrConflict}, {9, "ok", ErrConflict}} {
		if err := x.do(Command{Op: OpAccept, Model: "m", Version: c.v, Reason: c.reason, At: time.Unix(2, 0)}); !errors.Is(err, c.err) {
			t.Fatalf("accept %d %q: %v, want %v", c.v, c.reason, err, c.err)
		}
	}
	if err := x.do(Command{Op: OpAccept, Model: "m", Version: 2, Reason: "known drift, approved by J.", At: time.Unix(2, 0), From: "test"}); err != nil {
		t.Fatal(err)
	}
	if a := x.audit[len(x.audit)-1]; a.Op != OpAccept || a.Reason != "known drift, approved by J." || !strings.HasPrefix(a.Result, "ok") {
		t.Fatalf("audit %+v", a)
	}
	x.validate()
	x.load()
	if r := x.gateRuns(); r[2] != "1 [golden holdout]" {
		t.Fatalf("gates asked again %v", r)
	}
	x.do(GatesChecked{Model: "m", Version: 2, Results: []GateResult{{Gate: GateGolden, Outcome: "failed", Reason: "line 1 row 0: served 0.5, want 0.6"}, {Gate: GateHoldout, Outcome: "passed"}}})
	x.settleAll()
	x.expect(2, 0, 1)
	if g := x.s.Models["m"].version(2).Gates; len(g) != 2 || g[0].Outcome != "accepted" || !strings.Contains(g[0].Reason, "(accepted: known drift") {
		t.Fatalf("v2's gates %+v", g)
	}
	// A version the finite gate rejected, or a damaged one, is not
	// accepted.
	x.scan(1, 2, 3, 4)
	x.broken[4] = "part-00001.bin: damaged"
	x.do(Started(Validate{Model: "m", Version: 3}))
	x.do(Checked{Model: "m", Version: 3, Files: "f1", Err: "not finite", Gates: []GateResult{{Gate: GateFinite, Outcome: "failed", Reason: "not finite"}}})
	x.queue = slices.DeleteFunc(x.queue, func(v Validate) bool { return v.Version == 3 })
	x.validate()
	for v, want := range map[uint64]string{3: "finite gate, which cannot be accepted", 4: "not rejected by a gate"} {
		if err := x.do(Command{Op: OpAccept, Model: "m", Version: v, Reason: "please", At: time.Unix(3, 0)}); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), want) {
			t.Fatalf("accept %d: %v", v, err)
		}
	}
}

// TestDecideCanary: a canary is staged and gated, then serves its share
// beside the live version, which meanwhile does not move on by itself;
// promote makes it live; off, a pin and a rollback drop it; a canary
// failing its gates is dropped; the state with a canary is written with
// the schema that reads it.
func TestDecideCanary(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, StagedGates: []string{GateValidator}, Now: time.Unix(1000, 0)})
	x.join("s0")
	pass := func(v uint64) {
		x.t.Helper()
		x.load()
		x.do(GatesChecked{Model: "m", Version: v, Results: []GateResult{{Gate: GateValidator, Outcome: "passed"}}})
		x.settleAll()
	}
	canary := func(v uint64, f float64) error {
		live := x.s.Models["m"].Live
		return x.do(Command{Op: OpCanary, Model: "m", Version: v, Fraction: f, Expect: &live, At: time.Unix(1, 0)})
	}
	x.scan(1)
	x.validate()
	pass(1)
	x.expect(1, 0)
	if err := canary(1, 0.1); !errors.Is(err, ErrConflict) {
		t.Fatalf("canary of the live version: %v", err)
	}
	x.scan(1, 2)
	x.validate()
	x.load()
	x.expect(1, 2) // staged to go live; the canary takes it over
	for _, f := range []float64{0, -0.1, 0.51, math.NaN()} {
		if err := canary(2, f); !errors.Is(err, ErrInvalid) {
			t.Fatalf("fraction %v: %v", f, err)
		}
	}
	if err := canary(2, 0.1); err != nil {
		t.Fatal(err)
	}
	if a := x.s.Models["m"].Assignment(); a.Canary != 0 {
		t.Fatalf("canary serving before its gates: %+v", a)
	}
	pass(2)
	m := x.s.Models["m"]
	if a := m.Assignment(); m.Live != 1 || a.Canary != 2 || a.CanaryFraction != 0.1 || x.phase(2) != PhaseCanary || !slices.Contains(a.Kept(), 2) {
		t.Fatalf("live %d, map %+v, v2 %s", m.Live, a, x.phase(2))
	}
	if b, _ := json.Marshal(m); !strings.Contains(string(b), `"schema":3`) {
		t.Fatalf("a state with a canary written as %s", b)
	}
	// A new version waits while the canary serves; the share changes.
	x.scan(1, 2, 3)
	x.validate()
	x.settleAll()
	x.expect(1, 0)
	if x.phase(3) != PhaseReady {
		t.Fatalf("v3 %s", x.phase(3))
	}
	if err := canary(2, 0.3); err != nil || x.s.Models["m"].Assignment().CanaryFraction != 0.3 || !x.s.Models["m"].Canary.Serving {
		t.Fatalf("%v %+v", err, x.s.Models["m"].Canary)
	}
	// Promote: 2 goes live, 1 standby, pinned (3 waits); unpinned, the
	// model follows the newest again, 3.
	if err := x.cmd(OpPromote, 0); err != nil {
		t.Fatal(err)
	}
	x.settleAll()
	x.expect(2, 0, 1)
	if m := x.s.Models["m"]; m.Pin != 2 {
		t.Fatalf("pin %d after promote", m.Pin)
	}
	if b, _ := json.Marshal(x.s.Models["m"]); !strings.Contains(string(b), `"schema":2`) {
		t.Fatalf("a state without a canary written as %s", b)
	}
	x.cmd(OpUnpin, 0)
	pass(3)
	x.expect(3, 0, 2, 1)
	if err := x.cmd(OpPromote, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("promote with no canary: %v", err)
	}
	// Off, a pin and a rollback each drop the canary.
	x.do(Command{Op: OpPin, Model: "m", Version: 3, At: time.Unix(1, 0)})
	x.scan(1, 2, 3, 4)
	x.validate()
	x.settleAll()
	x.expect(3, 0, 2, 1)
	for _, drop := range []func() error{
		func() error { return x.cmd(OpCanaryOff, 0) },
		func() error { return x.cmd(OpPin, 3) },
		func() error { return x.cmd(OpRollback, 2) },
	} {
		if err := canary(4, 0.05); err != nil {
			t.Fatal(err)
		}
		pass(4)
		if x.s.Models["m"].Assignment().Canary != 4 {
			t.Fatalf("canary 4 not serving: %+v", x.s.Models["m"])
		}
		if err := drop(); err != nil {
			t.Fatal(err)
		}
		x.settleAll()
		if m := x.s.Models["m"]; m.Canary != nil || m.Assignment().Canary != 0 || x.phase(4) == PhaseCanary {
			t.Fatalf("canary kept: %+v", m.Canary)
		}
	}
	// A canary failing its gates is dropped with the version rejected.
	x.expect(2, 0, 3, 1) // rolled back to 2, pinned
	x.scan(1, 2, 3, 4, 5)
	x.validate()
	if err := canary(5, 0.1); err != nil {
		t.Fatal(err)
	}
	x.load()
	x.do(GatesChecked{Model: "m", Version: 5, Results: []GateResult{{Gate: GateValidator, Outcome: "failed", Reason: "no"}}})
	x.settleAll()
	if m := x.s.Models["m"]; m.Canary != nil || x.phase(5) != PhaseRejected || m.Live != 2 {
		t.Fatalf("a rejected canary: %+v, v5 %s", m.Canary, x.phase(5))
	}
}

// TestDecideCanaryEnds: however a canary ends, nothing moves without
// the operator: a canary dropped because it was rejected pins the live
// version (audited), so a version that waited does not go live, nor does
// the rejected one once accepted; off pins the live version; promoting a
// canary older than the newest valid version keeps it live. A version
// unstaged while its gates run has them asked again when staged again.
func TestDecideCanaryEnds(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, StagedGates: []string{GateValidator}, Now: time.Unix(1000, 0)})
	x.join("s0")
	gate := func(v uint64, outcome string) {
		x.t.Helper()
		x.load()
		x.do(GatesChecked{Model: "m", Version: v, Results: []GateResult{{Gate: GateValidator, Outcome: outcome, Reason: outcome}}})
		x.settleAll()
	}
	canary := func(v uint64) error {
		live := x.s.Models["m"].Live
		return x.do(Command{Op: OpCanary, Model: "m", Version: v, Fraction: 0.1, Expect: &live, At: time.Unix(1, 0)})
	}
	x.scan(1)
	x.validate()
	gate(1, "passed")
	// 2 staged; a canary of 2 while its gates run; 3 waits.
	x.scan(1, 2)
	x.validate()
	x.load()
	if err := canary(2); err != nil {
		t.Fatal(err)
	}
	x.scan(1, 2, 3)
	x.validate()
	gate(2, "failed")
	m := x.s.Models["m"]
	if m.Canary != nil || m.Live != 1 || m.Pin != 1 || m.Staged != 0 {
		t.Fatalf("after the canary's rejection: live %d pin %d staged %d canary %+v", m.Live, m.Pin, m.Staged, m.Canary)
	}
	if a := x.audit[len(x.audit)-1]; a.Op != "canary-dropped" || !strings.Contains(a.Result, "canary 2 dropped: it was rejected: gate validator failed") {
		t.Fatalf("audit %+v", a)
	}
	if err := x.do(Command{Op: OpAccept, Model: "m", Version: 2, Reason: "ok", At: time.Unix(2, 0)}); err != nil {
		t.Fatal(err)
	}
	x.validate()
	x.settleAll()
	x.expect(1, 0)
	// Off pins the live version: 3 still waits.
	x.cmd(OpUnpin, 0)
	x.validate()
	x.load() // 3 staged, its gates asked
	if err := canary(3); err != nil {
		t.Fatal(err)
	}
	if err := canary(2); err != nil { // 3, gating, is unstaged
		t.Fatal(err)
	}
	if v := x.s.Models["m"].version(3); v.Gating || v.Phase != PhaseReady {
		t.Fatalf("v3 unstaged while gating: %+v", v)
	}
	gate(2, "passed")
	if err := x.cmd(OpCanaryOff, 0); err != nil {
		t.Fatal(err)
	}
	x.settleAll()
	if m := x.s.Models["m"]; m.Live != 1 || m.Pin != 1 || m.Canary != nil {
		t.Fatalf("after off: live %d pin %d", m.Live, m.Pin)
	}
	// Unpinned, 3 is staged again and its gates asked again.
	x.cmd(OpUnpin, 0)
	x.load()
	if r := x.gateRuns(); r[3] == "" {
		t.Fatalf("v3's gates not asked again: %v, v3 %+v", r, x.s.Models["m"].version(3))
	}
	// A canary older than the newest valid version, promoted, stays.
	x.cmd(OpPin, 1)
	x.settleAll()
	if err := canary(2); err != nil {
		t.Fatal(err)
	}
	x.settleAll()
	if err := x.cmd(OpPromote, 0); err != nil {
		t.Fatal(err)
	}
	x.settleAll()
	if m := x.s.Models["m"]; m.Live != 2 || m.Pin != 2 {
		t.Fatalf("promoted 2, now live %d pin %d", m.Live, m.Pin)
	}
}

// TestDecideScaleOutMovesLittle: a 5th shard joining 4 (64 partitions,
// one replica) takes at most 13 partitions, the others staying put; a
// shard of weight 3 takes three times the share; when it leaves, only its
// partitions move.
func TestDecideScaleOutMovesLittle(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, Now: time.Unix(1000, 0)})
	x.parts = 64
	x.join("s0", "s1", "s2", "s3")
	x.scan(1)
	x.validate()
	x.settleAll()
	before := slices.Clone(x.s.Models["m"].Replicas)
	moves := func(from, to [][]string) (n int, onto map[string]int) {
		onto = map[string]int{}
		for p := range to {
			if fmt.Sprint(from[p]) != fmt.Sprint(to[p]) {
				n++
				onto[to[p][0]]++
			}
		}
		return n, onto
	}
	x.join("s4")
	x.settleAll()
	after := x.s.Models["m"].Replicas
	if n, onto := moves(before, after); n > 13 || onto["s4"] != n {
		t.Fatalf("a 5th shard: %d partitions moved, onto %v", n, onto)
	}
	// s5, of weight 3 (a budget three times the others'), joins: it
	// takes 3/8 of the partitions.
	x.shards["s5"] = topo.ShardInfo{Schema: topo.Schema, ID: "s5", Weight: 3}
	x.report()
	x.settleAll()
	if count := x.replicasOn(); count["s5"] != 24 {
		t.Fatalf("weight 3 of 8: %v", count)
	}
	// s5 leaves: only its partitions move.
	held := slices.Clone(x.s.Models["m"].Replicas)
	delete(x.shards, "s5")
	x.report()
	x.settleAll()
	for p, r := range x.s.Models["m"].Replicas {
		if held[p][0] != "s5" && r[0] != held[p][0] {
			t.Fatalf("partition %d moved off %s when s5 left", p, held[p][0])
		}
	}
}

// TestDecideBudgets: a shard with room for fewer partitions than its
// weight's share takes what fits while others have room; what fits
// nowhere goes by weight, and the admin view says the model does not
// fit; other models' bytes count against a budget.
func TestDecideBudgets(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, Now: time.Unix(1000, 0)})
	x.parts, x.size = 8, 800 // 100 bytes a partition
	for id, budget := range map[string]int64{"s0": 250, "s1": 10000, "s2": 10000} {
		x.shards[id] = topo.ShardInfo{Schema: topo.Schema, ID: id, Weight: 1, Budget: budget}
	}
	x.report()
	x.scan(1)
	x.validate()
	count := x.replicasOn
	// The first version, staged (loaded resident), is sized already.
	if n := count(); n["s0"] > 2 {
		t.Fatalf("staging the first version, s0 with room for 2 of 8: %v", n)
	}
	x.settleAll()
	x.expect(1, 0)
	if n := count(); n["s0"] != 2 || n["s0"]+n["s1"]+n["s2"] != 8 || n["s1"] < 3 || n["s2"] < 3 {
		t.Fatalf("s0 with room for 2 of 8: %v", n)
	}
	if d := detail(x.s, x.s.Models["m"]); d.OverBudget != "" {
		t.Fatalf("fits, but shown %q", d.OverBudget)
	}
	// Every budget shrinks to room for 2: 6 fit, 2 go beyond, and the
	// model is shown as not fitting.
	for id, si := range x.shards {
		si.Budget = 250
		x.shards[id] = si
	}
	x.report()
	x.settleAll()
	if n := count(); n["s0"] < 2 || n["s1"] < 2 || n["s2"] < 2 {
		t.Fatalf("room for 2 each: %v", n)
	}
	if d := detail(x.s, x.s.Models["m"]); !strings.Contains(d.OverBudget, "does not fit") {
		t.Fatalf("8 partitions in room for 6, shown %q", d.OverBudget)
	}
	// Another model of the same size halves m's slice of each budget.
	st := *x.s
	st.Models = maps.Clone(st.Models)
	n := x.s.Models["m"].clone()
	n.Name = "n"
	for p := range n.Replicas {
		n.Replicas[p] = []string{"s1"}
	}
	st.Models["n"] = n
	st.replicaBytes, st.deciding = 0, false
	if f := st.fit(x.s.Models["m"]); f.ReplicaBytes != 1600 {
		t.Fatalf("fit beside n: %+v", f)
	}
}

// TestDecideCordon: a cordoned shard is given nothing, and keeps what it
// holds until the new replicas hold it (make before break), then is
// empty; cordoning every shard empties none; uncordoned, it takes its
// share again.
func TestDecideCordon(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, Now: time.Unix(1000, 0)})
	x.parts = 8
	x.join("s0", "s1")
	x.scan(1)
	x.validate()
	x.settleAll()
	cordon := func(op, id string) {
		t.Helper()
		if err := x.do(Command{Op: op, Shard: id, At: time.Unix(1, 0), From: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	on := func(id string) int { return x.replicasOn()[id] }
	if on("s0") != 4 {
		t.Fatalf("s0 holds %d of 8", on("s0"))
	}
	cordon(OpCordon, "s0")
	if on("s0") != 4 || on("s1") != 8 || x.s.ShardState("s0") != "cordoned" {
		t.Fatalf("before s1 loads: s0 %d, s1 %d, %s", on("s0"), on("s1"), x.s.ShardState("s0"))
	}
	x.load("s1")
	if on("s0") != 0 || x.s.ShardState("s0") != "empty" || x.s.ShardState("s1") != "active" {
		t.Fatalf("after s1 loads: s0 %d, %s", on("s0"), x.s.ShardState("s0"))
	}
	if a := x.audit[len(x.audit)-1]; a.Op != OpCordon || a.Shard != "s0" {
		t.Fatalf("audit %+v", a)
	}
	// Every shard cordoned: nothing moves.
	cordon(OpCordon, "s1")
	x.settleAll()
	if on("s1") != 8 {
		t.Fatalf("with every shard cordoned, s1 holds %d", on("s1"))
	}
	cordon(OpUncordon, "s1")
	cordon(OpUncordon, "s0")
	x.settleAll()
	if on("s0") != 4 || x.s.ShardState("s0") != "active" {
		t.Fatalf("uncordoned, s0 holds %d", on("s0"))
	}
	if err := x.do(Command{Op: OpCordon, Shard: "a/b"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a bad shard name: %v", err)
	}
}

// TestDecideMaxMoves: with MaxMoves 1, a shard joining takes its share
// one partition at a time, each moving once the last has loaded; a
// partition whose shard left moves at once, whatever the bound.
func TestDecideMaxMoves(t *testing.T) {
	x := newSim(t, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20, MaxMoves: 1, Now: time.Unix(1000, 0)})
	x.parts = 16
	x.join("s0", "s1", "s2", "s3")
	x.scan(1)
	x.validate()
	x.settleAll()
	onto := func(id string) int { return x.replicasOn()[id] }
	x.join("s4")
	x.report() // the shards' reports now lag the placement just published
	if n := onto("s4"); n != 1 {
		t.Fatalf("%d partitions onto s4 at once, with reports older than the placement", n)
	}
	if plan := x.s.Plan(x.p); len(plan) != 3 || !slices.Contains(plan[0].To, "s4") {
		t.Fatalf("plan after s4 joined: %+v", plan)
	}
	steps := 0
	for ; onto("s4") < 3 && steps < 10; steps++ {
		before := onto("s4")
		x.load("s0", "s1", "s2", "s3") // s4 has loaded nothing yet
		if onto("s4") > before+1 {
			t.Fatalf("step %d: %d partitions onto s4 at once", steps, onto("s4")-before)
		}
		x.load()
	}
	if onto("s4") != 3 {
		t.Fatalf("s4 holds %d after %d steps", onto("s4"), steps)
	}
	x.settleAll()
	if plan := x.s.Plan(x.p); len(plan) != 0 {
		t.Fatalf("plan once balanced: %+v", plan)
	}
	// s0 leaves: its 3 partitions move at once.
	delete(x.shards, "s0")
	x.report()
	for p, r := range x.s.Models["m"].Replicas {
		if len(r) == 0 || slices.Contains(r, "s0") {
			t.Fatalf("partition %d: %v after s0 left", p, r)
		}
	}
}

// TestDecideMaxMovesShardLeaves: with two replicas and MaxMoves 1, a
// shard leaving while another joins is never kept in the map: partitions
// it held get a new replica at once.
func TestDecideMaxMovesShardLeaves(t *testing.T) {
	x := newSim(t, Policy{Replicas: 2, KeepVersions: 2, KeepDeltas: 20, MaxMoves: 1, Now: time.Unix(1000, 0)})
	x.parts = 16
	x.join("s0", "s1", "s2", "s3")
	x.scan(1)
	x.validate()
	x.settleAll()
	x.join("s4")
	delete(x.shards, "s0")
	x.report()
	for p, r := range x.s.Models["m"].Replicas {
		if slices.Contains(r, "s0") {
			t.Fatalf("partition %d still published on s0, gone: %v", p, r)
		}
		if len(r) < 2 {
			t.Fatalf("partition %d has %d replicas: %v", p, len(r), r)
		}
	}
}

// TestAssignDistrustsWeights: a shard reporting a huge weight gets at
// most 16 times the median share.
func TestAssignDistrustsWeights(t *testing.T) {
	var ids []string
	infos := map[string]topo.ShardInfo{}
	for i := range 10 {
		id := fmt.Sprintf("s%d", i)
		ids = append(ids, id)
		infos[id] = topo.ShardInfo{ID: id, Weight: 1}
	}
	infos["s9"] = topo.ShardInfo{ID: "s9", Weight: 1 << 19}
	count := 0
	for _, r := range Assign("m", nil, 1000, ids, infos, 1, Fit{}) {
		if r[0] == "s9" {
			count++
		}
	}
	if count > 1000*16/25+1 {
		t.Fatalf("s9 took %d of 1000 partitions", count)
	}
	// Nor a budget: nine shards with room for 10 partitions each, and s9
	// claiming 2^62 bytes. Its budget is held to 16 times the median (room
	// for 160), and what fits nowhere is shared by weight (75 each).
	for i := range 10 {
		id := fmt.Sprintf("s%d", i)
		infos[id] = topo.ShardInfo{ID: id, Weight: 1, Budget: 1000}
	}
	infos["s9"] = topo.ShardInfo{ID: "s9", Weight: 1, Budget: 1 << 62}
	n := map[string]int{}
	for _, r := range Assign("m", nil, 1000, ids, infos, 1, Fit{ReplicaBytes: 100_000}) {
		n[r[0]]++
	}
	if n["s9"] > 160+75 || n["s0"] < 85 {
		t.Fatalf("s9 claiming a huge budget: %v", n)
	}
}
