package manager

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/model"
)

// A manager at cluster scale, simulated: Decide, placement and the
// records the manager, the shards and the routers write, driven with
// simulated shards and routers (no processes, no etcd). Shards load at
// once exactly what the published map assigns them and report it;
// routers score every kept version. Each simulated second every model
// gets a delta touching 1% of its partitions (a compaction, a new full
// version, every compactAfter deltas), and shards join, leave and are
// cordoned now and then.
//
// What it measures, per event: Decide's time, and the bytes of each
// record written — the raft entry (the models' states that changed),
// the serving map records, the shards' and the routers' registrations —
// with the largest record, and the heap at the end.

// scaleConfig is one simulated cluster.
type scaleConfig struct {
	parts, shards, zones, models, routers int
	seconds                               int // simulated seconds of deltas
	touch                                 float64
	compactAfter                          int
	seed                                  uint64
	// follow: a follower applies every entry, and its state is checked
	// against the leader's after each; so is the state read back from
	// the records a manager without raft writes.
	follow bool
}

// simVersion is a version in the simulated repository.
type simVersion struct {
	parent uint64
	ids    []string // identity per partition
	chain  []uint64
}

type scaleSim struct {
	tb     testing.TB
	cfg    scaleConfig
	rng    *rand.Rand
	s      *State
	p      Policy
	models []string
	repo   map[string]map[uint64]*simVersion
	latest map[string]uint64
	depth  map[string]int // deltas on the newest full version
	// shards as reported, and the JSON last written of each; routers
	// likewise.
	shards     map[string]topo.ShardInfo
	shardRecs  map[string]string // the shards' report records as last written
	routers    map[string]topo.RouterInfo
	routerJSON map[string]string
	nextShard  int
	cordoned   string
	now        time.Time
	pub        *publisher
	etcd       map[string][]byte // the serving map's records, as written
	stateStore *store            // a manager without raft: what it has written of its state
	stateKV    map[string][]byte // and the records, as written
	follower   *replicated
	index      uint64
	reader     *topo.MapReader
	stats      scaleStats
}

// scaleStats sums what the simulation measured.
type scaleStats struct {
	events                         int
	decide                         []time.Duration
	decideKind                     []string // the event of each decide entry
	raftBytes, mapBytes            int      // written by the manager
	shardBytes, routerBytes        int      // written by shards and routers
	largest                        int      // of etcd's records
	largestWhat                    string
	largestEntry                   int // raft entry
	stateBytes, largestState       int // a manager without raft: its state's records
	deltas                         int
	perDelta                       []deltaBytes
	mapsRead                       int // bytes of map records a router reads
	committedLate, committedDeltas int
}

// deltaBytes is what one delta cost, from its scan until shards and
// routers settled.
type deltaBytes struct{ raft, etcd, maps, shards, routers, routerRead, state int }

func newScaleSim(tb testing.TB, cfg scaleConfig) *scaleSim {
	x := &scaleSim{tb: tb, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.seed, 1)),
		s:    &State{Models: map[string]*ModelState{}, Shards: map[string]topo.ShardInfo{}, Routers: map[string]topo.RouterInfo{}},
		p:    Policy{Replicas: 2, KeepVersions: 2, KeepDeltas: 20, MaxMoves: 4},
		repo: map[string]map[uint64]*simVersion{}, latest: map[string]uint64{}, depth: map[string]int{},
		shards: map[string]topo.ShardInfo{}, shardRecs: map[string]string{}, routers: map[string]topo.RouterInfo{}, routerJSON: map[string]string{},
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), pub: newPublisher(nil, topo.DefaultCluster),
		etcd: map[string][]byte{}, reader: topo.NewMapReader(topo.DefaultCluster), follower: newReplicated(AuditRetention{})}
	for i := range cfg.models {
		name := fmt.Sprintf("m%d", i)
		x.models = append(x.models, name)
		x.repo[name] = map[uint64]*simVersion{}
	}
	for range cfg.shards {
		x.addShard()
	}
	for i := range cfg.routers {
		id := fmt.Sprintf("r%d", i)
		x.routers[id] = topo.RouterInfo{Schema: 1, ID: id}
	}
	x.decide(ShardsChanged{Shards: x.snapshotShards()})
	x.decide(RoutersChanged{Routers: x.snapshotRouters()})
	return x
}

func (x *scaleSim) addShard() {
	id := fmt.Sprintf("shard-%04d", x.nextShard)
	x.shards[id] = topo.ShardInfo{Schema: topo.ShardInfoSchema, ID: id, Addr: id + ":7100", Zone: fmt.Sprintf("zone-%d", x.nextShard%x.cfg.zones), Weight: 1}
	x.nextShard++
}

func (x *scaleSim) snapshotShards() map[string]topo.ShardInfo {
	out := make(map[string]topo.ShardInfo, len(x.shards))
	for id, si := range x.shards {
		out[id] = si
	}
	return out
}

func (x *scaleSim) snapshotRouters() map[string]topo.RouterInfo {
	out := make(map[string]topo.RouterInfo, len(x.routers))
	for id, r := range x.routers {
		out[id] = r
	}
	return out
}

// digest is a stand-in content identity: a SHA-256 in hex, as codec
// gives them (so records take their compact form).
func digest(parts ...any) string {
	d := sha256.Sum256(fmt.Append(nil, parts...))
	return hex.EncodeToString(d[:])
}

// publish adds a version of model name to the repository: a delta on
// the newest touching cfg.touch of the partitions, or a full version
// when there is none yet or compactAfter deltas are on it.
func (x *scaleSim) publish(name string) uint64 {
	v := x.latest[name] + 1
	x.latest[name] = v
	sv := &simVersion{ids: make([]string, x.cfg.parts)}
	if v == 1 || x.depth[name] >= x.cfg.compactAfter {
		for p := range sv.ids {
			sv.ids[p] = digest(name, v, p)
		}
		sv.chain = []uint64{v}
		x.depth[name] = 0
	} else {
		parent := x.repo[name][v-1]
		sv.parent = v - 1
		copy(sv.ids, parent.ids)
		n := max(1, int(float64(x.cfg.parts)*x.cfg.touch))
		for range n {
			p := x.rng.IntN(x.cfg.parts)
			sv.ids[p] = digest(name, v, p)
		}
		sv.chain = append([]uint64{v}, parent.chain...)
		x.depth[name]++
	}
	x.repo[name][v] = sv
	return v
}

// scan lists the repository as the manager would find it: the versions
// the state keeps and those newer (older ones pruned).
func (x *scaleSim) scan() Scanned {
	ev := Scanned{Models: map[string][]Found{}}
	for _, name := range x.models {
		floor := uint64(0)
		if m := x.s.Models[name]; m != nil {
			floor = m.Floor
		}
		var found []Found
		for v := range x.repo[name] {
			if v <= floor && (x.s.Models[name] == nil || x.s.Models[name].version(v) == nil) {
				continue
			}
			sv := x.repo[name][v]
			f := Found{Version: v, Kind: "full", Files: "f" + fmt.Sprint(v)}
			if sv.parent != 0 {
				f.Kind, f.Parent = "delta", sv.parent
			}
			found = append(found, f)
		}
		sort.Slice(found, func(i, j int) bool { return found[i].Version < found[j].Version })
		ev.Models[name] = found
	}
	return ev
}

// decide applies one event as the manager does and measures it; then
// carries out its validations.
func (x *scaleSim) decide(ev Event) {
	x.tb.Helper()
	x.now = x.now.Add(time.Millisecond)
	x.p.Now = x.now
	cur := x.s
	t0 := time.Now()
	next, acts, err := Decide(cur, ev, x.p)
	took := time.Since(t0)
	if err != nil {
		x.tb.Fatalf("%T: %v", ev, err)
	}
	x.s = next
	x.stats.events++
	x.stats.decide = append(x.stats.decide, took)
	x.stats.decideKind = append(x.stats.decideKind, eventKind(ev))
	c, _ := changesOf(cur, next, acts)
	if len(c.patches) > 0 || len(c.gone) > 0 || c.cordons != nil || len(c.audit) > 0 {
		entry, err := entryOf(c, next.Cordoned, x.now, AuditRetention{})
		if err != nil {
			x.tb.Fatal(err)
		}
		x.stats.raftBytes += len(entry)
		x.stats.largestEntry = max(x.stats.largestEntry, len(entry))
		if x.cfg.follow {
			x.index++
			if r := x.follower.Apply(&raft.Log{Index: x.index, Type: raft.LogCommand, Data: entry}); r != nil {
				if err, ok := r.(error); ok {
					x.tb.Fatalf("a follower refused the entry: %v", err)
				}
			}
			got, _ := x.follower.view()
			for name, m := range next.Models {
				a, _ := json.Marshal(m)
				b, _ := json.Marshal(got.Models[name])
				if string(a) != string(b) {
					x.tb.Fatalf("model %s: a follower applying the entries holds\n%.3000s\nthe leader\n%.3000s", name, b, a)
				}
			}
		}
	}
	x.storeState(c, cur, next)
	var ops txnOps
	err = x.pub.publish(context.Background(), next, slices.Concat(c.maps, c.gone), func(t txnOps) error { ops = t; return nil })
	if err != nil {
		x.tb.Fatal(err)
	}
	for _, n := range ops.Sizes {
		x.stats.mapBytes += n
		x.stats.mapsRead += n * x.cfg.routers
		x.note(n, "serving map record")
	}
	x.applyOps(ops)
	x.checkMap(next)
	for _, a := range acts {
		if v, ok := a.(Validate); ok {
			x.decide(Started(v))
			sv := x.repo[v.Model][v.Version]
			info := &topo.VersionInfo{Version: v.Version, Shape: model.Shape{Type: model.LR}, Hash: "xxh64", IDs: sv.ids, Chain: sv.chain}
			x.decide(Checked{Model: v.Model, Version: v.Version, Files: "f" + fmt.Sprint(v.Version), Info: info, Bytes: 1 << 20})
		}
	}
}

// storeState writes the change as a manager without raft does, to a
// simulated etcd of its own, and measures it; following, it checks that
// a manager reading those records back holds exactly the state.
func (x *scaleSim) storeState(c change, cur, next *State) {
	x.tb.Helper()
	if x.stateStore == nil {
		x.stateStore, x.stateKV = &store{cluster: topo.DefaultCluster}, map[string][]byte{}
	}
	ops, done, err := x.stateStore.stateOps(c, cur, next)
	if err != nil {
		x.tb.Fatal(err)
	}
	for _, name := range c.gone {
		ops.Delete(x.stateStore.modelKey(name))
		ops.DeletePrefix(x.stateStore.modelKey(name) + "/")
	}
	done()
	for _, n := range ops.Sizes {
		x.stats.stateBytes += n
		x.stats.largestState = max(x.stats.largestState, n)
	}
	applyOps(x.stateKV, ops)
	if !x.cfg.follow {
		return
	}
	recs := map[string]*modelRecords{}
	for k, v := range x.stateKV {
		if err := addRecord(recs, strings.TrimPrefix(k, x.stateStore.modelsPrefix()), k, v); err != nil {
			x.tb.Fatal(err)
		}
	}
	got, _, err := x.stateStore.assembleAll(recs)
	if err != nil {
		x.tb.Fatalf("reading back the state's records: %v", err)
	}
	if len(got) != len(next.Models) {
		x.tb.Fatalf("read back %d models' states, want %d", len(got), len(next.Models))
	}
	for name, m := range next.Models {
		a, _ := json.Marshal(m)
		b, _ := json.Marshal(got[name])
		if string(a) != string(b) {
			x.tb.Fatalf("model %s: its state's records read back as\n%.3000s\nthe state\n%.3000s", name, b, a)
		}
	}
}

// applyOps applies writes to the simulated etcd.
func (x *scaleSim) applyOps(ops txnOps) { applyOps(x.etcd, ops) }

// applyOps applies writes to a simulated etcd.
func applyOps(etcd map[string][]byte, ops txnOps) {
	for _, op := range ops.Ops {
		key := string(op.KeyBytes())
		switch {
		case op.IsPut():
			etcd[key] = slices.Clone(op.ValueBytes())
		case op.IsDelete() && len(op.RangeBytes()) > 0:
			for k := range etcd {
				if k >= key && k < string(op.RangeBytes()) {
					delete(etcd, k)
				}
			}
		case op.IsDelete():
			delete(etcd, key)
		}
	}
}

// checkMap asserts that a reader assembles from the records written
// exactly the map each model's state describes, and that the version
// records do not pile up.
func (x *scaleSim) checkMap(s *State) {
	x.tb.Helper()
	got := x.reader.Assignments(x.etcd)
	versions := 0
	for name, m := range s.Models {
		if m.Partitions == 0 {
			continue
		}
		want := m.Assignment()
		a, ok := got[name]
		gotJSON, _ := json.Marshal(a)
		wantJSON, _ := json.Marshal(want)
		if !ok || string(gotJSON) != string(wantJSON) {
			x.tb.Fatalf("model %s: the records assemble to\n%.2000s\nwant\n%.2000s", name, gotJSON, wantJSON)
		}
		versions += len(want.Kept())
	}
	// Kept versions and the bases their records need (at most a chain
	// of deltas back to a kept one), no more.
	records := 0
	for k := range x.etcd {
		if strings.Contains(k, "/versions/") {
			records++
		}
	}
	if records > 2*versions+len(s.Models)*x.cfg.compactAfter {
		x.tb.Fatalf("%d version records for %d kept versions", records, versions)
	}
}

func (x *scaleSim) note(n int, what string) {
	if n > x.stats.largest {
		x.stats.largest, x.stats.largestWhat = n, what
	}
}

// follow lets shards and routers act on the map until they settle: each
// shard holds what the map assigns it, reported with the identities the
// map expects; each router scores every kept version.
func (x *scaleSim) follow() {
	x.tb.Helper()
	for round := 0; round < 20; round++ {
		changed := false
		assigns := map[string]topo.Assignment{}
		for _, name := range x.models {
			if m := x.s.Models[name]; m != nil && m.Partitions > 0 {
				assigns[name] = m.Assignment()
			}
		}
		for _, id := range slices.Sorted(mapsKeys(x.shards)) {
			si := x.shards[id]
			si.Held = map[string]*topo.Held{}
			// The shard's reports, as a shard writes them: the partitions
			// of each model it holds, and the map record it has applied
			// (it loads at once what the map asks).
			for _, name := range x.models {
				a, ok := assigns[name]
				if !ok {
					continue
				}
				var mine []uint32
				for p, reps := range a.Replicas {
					if slices.Contains(reps, id) {
						mine = append(mine, uint32(p))
					}
				}
				if len(mine) == 0 {
					continue
				}
				// As a shard does: the Seq reported stands while it says
				// the same (no version kept since, no move since).
				seq := a.Seq
				if last := x.shards[id].Held[name]; last != nil && a.PlaceSeq <= last.Seq && slices.Equal(last.Parts, mine) &&
					!slices.ContainsFunc(a.Kept(), func(v uint64) bool { return a.KeptSince[v] > last.Seq }) {
					seq = last.Seq
				}
				si.Held[name] = &topo.Held{Seq: seq, Parts: mine}
				for key, rec := range map[string]any{
					topo.DefaultCluster.HeldKey(id, name):  topo.HeldRecord{Schema: topo.ShardInfoSchema, Seq: seq},
					topo.DefaultCluster.PartsKey(id, name): topo.PartsRecord{Schema: topo.ShardInfoSchema, Parts: mine},
				} {
					b, _ := json.Marshal(rec)
					if x.shardRecs[key] != string(b) {
						x.shardRecs[key] = string(b)
						n := len(key) + len(b)
						x.stats.shardBytes += n
						x.stats.mapsRead += n * x.cfg.routers // routers watch the shards too
						x.note(n, "shard report")
						changed = true
					}
				}
			}
			x.shards[id] = si
		}
		if changed {
			x.decide(ShardsChanged{Shards: x.snapshotShards()})
		}
		rchanged := false
		for _, id := range slices.Sorted(mapsKeys(x.routers)) {
			r := x.routers[id]
			r.Scores, r.Seen = map[string][]uint64{}, map[string]uint64{}
			for name, a := range assigns {
				r.Scores[name], r.Seen[name] = a.Kept(), a.Seq
			}
			b, _ := json.Marshal(r)
			if string(b) != x.routerJSON[id] {
				x.routerJSON[id] = string(b)
				x.stats.routerBytes += len(b)
				x.note(len(b), "router registration")
				rchanged = true
			}
			x.routers[id] = r
		}
		if rchanged {
			x.decide(RoutersChanged{Routers: x.snapshotRouters()})
		}
		if !changed && !rchanged {
			return
		}
	}
	x.tb.Fatal("shards and routers did not settle in 20 rounds")
}

func mapsKeys[M ~map[string]V, V any](m M) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// second simulates one second: a delta for each model, published,
// scanned, validated, rolled out; and every few seconds a shard leaves,
// one joins, or one is cordoned.
func (x *scaleSim) second(i int) {
	x.tb.Helper()
	switch {
	case i%10 == 3 && len(x.shards) > x.cfg.shards/2:
		ids := slices.Sorted(mapsKeys(x.shards))
		gone := ids[x.rng.IntN(len(ids))]
		delete(x.shards, gone)
		for k := range x.shardRecs {
			if strings.HasPrefix(k, topo.DefaultCluster.ShardKey(gone)+"/") {
				delete(x.shardRecs, k)
			}
		}
		x.decide(ShardsChanged{Shards: x.snapshotShards()})
		x.follow()
	case i%10 == 6:
		x.addShard()
		x.decide(ShardsChanged{Shards: x.snapshotShards()})
		x.follow()
	case i%10 == 8:
		if x.cordoned != "" {
			x.decide(Command{Op: OpUncordon, Shard: x.cordoned, At: x.now})
		}
		ids := slices.Sorted(mapsKeys(x.shards))
		x.cordoned = ids[x.rng.IntN(len(ids))]
		x.decide(Command{Op: OpCordon, Shard: x.cordoned, At: x.now})
		x.follow()
	}
	for _, name := range x.models {
		before := x.stats
		v := x.publish(name)
		x.decide(x.scan())
		x.follow()
		x.stats.deltas++
		etcd := (x.stats.mapBytes - before.mapBytes) + (x.stats.shardBytes - before.shardBytes) + (x.stats.routerBytes - before.routerBytes)
		x.stats.perDelta = append(x.stats.perDelta, deltaBytes{raft: x.stats.raftBytes - before.raftBytes, etcd: etcd,
			maps: x.stats.mapBytes - before.mapBytes, shards: x.stats.shardBytes - before.shardBytes, routers: x.stats.routerBytes - before.routerBytes,
			routerRead: (x.stats.mapsRead - before.mapsRead) / max(1, x.cfg.routers), state: x.stats.stateBytes - before.stateBytes})
		if m := x.s.Models[name]; m.Live >= v {
			x.stats.committedDeltas++
		} else {
			x.stats.committedLate++
		}
	}
}

// run simulates cfg.seconds seconds after a first full version of each
// model is live.
func (x *scaleSim) run() {
	for _, name := range x.models {
		x.publish(name)
	}
	x.decide(x.scan())
	x.follow()
	for _, name := range x.models {
		if m := x.s.Models[name]; m == nil || m.Live != 1 {
			x.tb.Fatalf("model %s: the first version did not go live: %+v", name, m)
		}
	}
	// Per-delta figures from here on; the largest records since the
	// start (a full version's record is written with it).
	x.stats = scaleStats{largest: x.stats.largest, largestWhat: x.stats.largestWhat, largestEntry: x.stats.largestEntry, largestState: x.stats.largestState}
	for i := range x.cfg.seconds {
		x.second(i)
	}
}

// check asserts what must hold whatever the costs: every delta went
// live within its second, every partition has its replicas in distinct
// zones, and a cordoned shard is given nothing new.
func (x *scaleSim) check() {
	x.tb.Helper()
	if x.stats.committedLate > 0 {
		x.tb.Errorf("%d of %d deltas were not live once shards and routers settled", x.stats.committedLate, x.stats.deltas)
	}
	for _, name := range x.models {
		a := x.s.Models[name].Assignment()
		for p, reps := range a.Replicas {
			zones := map[string]bool{}
			for _, id := range reps {
				zones[x.shards[id].Zone] = true
			}
			if len(reps) < x.p.Replicas || len(zones) < x.p.Replicas {
				x.tb.Fatalf("model %s partition %d: replicas %v in %d zones", name, p, reps, len(zones))
			}
		}
	}
}

// eventKind names an event for the report: its type, and a command's op.
func eventKind(ev Event) string {
	if c, ok := ev.(Command); ok {
		return "Command " + string(c.Op)
	}
	return fmt.Sprintf("%T", ev)[len("manager."):]
}

// slowest lists the n slowest decisions with their events.
func slowest(ds []time.Duration, kinds []string, n int) string {
	idx := make([]int, len(ds))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(ds[b], ds[a]) })
	var parts []string
	for _, i := range idx[:min(n, len(idx))] {
		parts = append(parts, fmt.Sprintf("%v %s", ds[i].Round(10*time.Microsecond), kinds[i]))
	}
	return strings.Join(parts, ", ")
}

func percentile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// report logs the figures.
func (x *scaleSim) report() {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st := x.stats
	var raft, etcd, read, mp, sh, ro []int
	for _, d := range st.perDelta {
		raft, etcd, read = append(raft, d.raft), append(etcd, d.etcd), append(read, d.routerRead)
		mp, sh, ro = append(mp, d.maps), append(sh, d.shards), append(ro, d.routers)
	}
	med := func(v []int) int { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	x.tb.Logf("%d partitions, %d shards in %d zones, %d models, %d routers: %d deltas over %d s, %d events",
		x.cfg.parts, x.cfg.shards, x.cfg.zones, x.cfg.models, x.cfg.routers, st.deltas, x.cfg.seconds, st.events)
	x.tb.Logf("Decide: p50 %v, p99 %v, max %v", percentile(st.decide, 0.5), percentile(st.decide, 0.99), percentile(st.decide, 1))
	x.tb.Logf("slowest events: %s", slowest(st.decide, st.decideKind, 5))
	x.tb.Logf("per delta (median, max): raft %d / %d B; etcd, all writers %d / %d B; a router reads %d / %d B",
		med(raft), slices.Max(raft), med(etcd), slices.Max(etcd), med(read), slices.Max(read))
	x.tb.Logf("etcd per delta by writer (median): the manager's map records %d B, shards %d B, routers %d B", med(mp), med(sh), med(ro))
	x.tb.Logf("largest etcd record %d B (%s); largest raft entry %d B; heap in use %d MiB", st.largest, st.largestWhat, st.largestEntry, ms.HeapInuse>>20)
	whole := 0
	for _, m := range x.s.Models {
		b, _ := json.Marshal(m)
		whole = max(whole, len(b))
	}
	var state []int
	for _, d := range st.perDelta {
		state = append(state, d.state)
	}
	x.tb.Logf("a manager without raft writes its state's records to etcd besides: per delta (median, max) %d / %d B, largest record %d B (a model's state as one record: %d B)",
		med(state), slices.Max(state), st.largestState, whole)
}

// TestClusterScaleSim runs a small cluster through the simulation and
// checks that every delta goes live and placement holds; the benchmark
// below runs the full size and reports the figures.
func TestClusterScaleSim(t *testing.T) {
	x := newScaleSim(t, scaleConfig{parts: 128, shards: 16, zones: 4, models: 3, routers: 4, seconds: 12, touch: 0.01, compactAfter: 5, seed: 7, follow: true})
	x.run()
	x.check()
	x.report()
}

// TestRebalanceKeepsItsTarget: a shard joins while moves are limited to
// two loading onto a shard at a time, so the rebalance takes several
// rounds of shards loading and reporting. The placement made when the
// shard joined stands throughout: the replicas end exactly there, and
// placing afresh from where they ended moves nothing. No event meanwhile
// placed anew.
func TestRebalanceKeepsItsTarget(t *testing.T) {
	x := newScaleSim(t, scaleConfig{parts: 128, shards: 16, zones: 4, models: 3, routers: 2, seconds: 1, touch: 0.01, compactAfter: 5, seed: 3})
	x.p.MaxMoves = 2
	x.run()
	x.addShard()
	x.decide(ShardsChanged{Shards: x.snapshotShards()})
	targets := map[string][][]string{}
	made := map[string]*placeMemo{}
	limited := false
	for _, name := range x.models {
		m := x.s.Models[name]
		targets[name], made[name] = x.s.placement(m, x.s.trusted(m), x.p), m.placed
		if !sameReplicas(m.Replicas, targets[name]) {
			limited = true
		}
	}
	if !limited {
		t.Fatal("the join moved everything at once: nothing to carry out over rounds")
	}
	x.follow()
	for _, name := range x.models {
		m := x.s.Models[name]
		if !sameReplicas(m.Replicas, targets[name]) {
			t.Fatalf("model %s: the rebalance ended away from the placement made when the shard joined", name)
		}
		if m.placed != made[name] {
			t.Fatalf("model %s: placed anew during the rebalance (each event paid a placement)", name)
		}
		trusted := x.s.trusted(m)
		again := Assign(m.Name, m.Replicas, m.Partitions, x.s.placeable(m, trusted), x.s.Shards, x.p.Replicas, x.s.fit(m))
		if !sameReplicas(again, m.Replicas) {
			t.Fatalf("model %s: placing afresh from where the rebalance ended moves replicas", name)
		}
	}
	x.check()
}

// BenchmarkClusterScaleSim: 4,096 partitions, 256 shards in 4 zones,
// replicas 2, three models, a delta a second touching 1% of the
// partitions. go test -run XXX -bench ClusterScaleSim -benchtime 1x ./manager
func BenchmarkClusterScaleSim(b *testing.B) {
	for range b.N {
		x := newScaleSim(b, scaleConfig{parts: 4096, shards: 256, zones: 4, models: 3, routers: 4, seconds: 8, touch: 0.01, compactAfter: 200, seed: 7})
		x.run()
		x.check()
		x.report()
	}
}

// joiningSim is the simulated cluster at full size, a first second of
// deltas served, and a shard just joined (that no event has told yet).
func joiningSim(b *testing.B) *scaleSim {
	x := newScaleSim(b, scaleConfig{parts: 4096, shards: 256, zones: 4, models: 3, routers: 4, seconds: 1, touch: 0.01, compactAfter: 200, seed: 7})
	x.run()
	x.addShard()
	return x
}

// BenchmarkDecideRebalancing: the cost of one event that settles every
// model while a rebalance is under way (a shard has just joined 256, at
// 4,096 partitions, three models): what the slowest events of
// BenchmarkClusterScaleSim pay.
// go test -run XXX -bench DecideRebalancing ./manager
func BenchmarkDecideRebalancing(b *testing.B) {
	x := joiningSim(b)
	x.decide(ShardsChanged{Shards: x.snapshotShards()})
	benchDecide(b, x, RoutersChanged{Routers: x.snapshotRouters()})
}

// benchDecide measures Decide of ev on x's state, which it leaves as is.
func benchDecide(b *testing.B, x *scaleSim, ev Event) {
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := Decide(x.s, ev, x.p); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStateRecordsReadBack: a manager without raft keeps each model's
// state in records that change with what changed (storerecords.go).
// Through a minute of deltas with a short keep policy (versions leave
// the state, and identities based on them are written again on another
// base) and compactions, the records read back, after every decision,
// as exactly the state.
func TestStateRecordsReadBack(t *testing.T) {
	x := newScaleSim(t, scaleConfig{parts: 32, shards: 6, zones: 3, models: 2, routers: 1, seconds: 60, touch: 0.1, compactAfter: 7, seed: 11, follow: true})
	x.p.KeepVersions, x.p.KeepDeltas = 1, 3
	x.run()
	x.check()
	if x.stats.stateBytes == 0 {
		t.Fatal("nothing written")
	}
}

// BenchmarkDecideShardJoins: the cost of the event in which a shard
// joins 256 (4,096 partitions, three models): every model placed anew.
// go test -run XXX -bench DecideShardJoins ./manager
func BenchmarkDecideShardJoins(b *testing.B) {
	x := joiningSim(b)
	benchDecide(b, x, ShardsChanged{Shards: x.snapshotShards()})
}
