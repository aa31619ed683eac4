package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

func testModel(scale float32) *loader.Sparse {
	s := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for _, k := range []uint64{0, 1, 2, 77, 1 << 40, math.MaxUint64} {
		s.Keys = append(s.Keys, k)
		s.Values = append(s.Values, scale*float32(k%1000+1))
	}
	return s
}

// putMap writes the serving map of model m as the manager would: every
// partition on shard s1, live and staged versions described from the
// repository's manifests.
func putMap(t *testing.T, cli *clientv3.Client, repo loader.Repo, parts uint32, live, staged uint64, standby ...uint64) {
	t.Helper()
	writeMap(t, cli, mapOf(t, repo, parts, live, staged, standby...))
}

// writeMap writes a serving map record made by mapOf.
func writeMap(t *testing.T, cli *clientv3.Client, record []byte) {
	t.Helper()
	if _, err := cli.Put(context.Background(), topo.DefaultCluster.ModelKey("m"), string(record)); err != nil {
		t.Fatal(err)
	}
}

// mapOf is the serving map record putMap writes.
func mapOf(t *testing.T, repo loader.Repo, parts uint32, live, staged uint64, standby ...uint64) []byte {
	t.Helper()
	// A whole record of schema 2, as managers before the split records
	// wrote (shards still read it); the managers' own are tested with
	// them.
	a := topo.Assignment{Schema: 2, Model: "m", Live: live, Staged: staged, Standby: standby, Partitions: parts, Replicas: make([][]string, parts)}
	for p := range a.Replicas {
		a.Replicas[p] = []string{"s1"}
	}
	for _, v := range a.Kept() {
		chain, err := repo.Chain("m", v)
		if err != nil {
			t.Fatal(err)
		}
		a.Versions = append(a.Versions, topo.VersionInfo{Version: v, Shape: model.Shape{Type: chain[0].Type, Dim: chain[0].Dim}, Bias: chain[0].Bias,
			Hash: chain[0].Hash, IDs: codec.Identities(chain), Chain: codec.ChainVersions(chain)})
	}
	b, _ := json.Marshal(a)
	return b
}

// servingShard starts shard s1 and assigns it version 1 of model m
// (testModel(1), two partitions), published in a fresh repository. It
// returns before the shard has loaded the version.
func servingShard(t *testing.T) (*Shard, *clientv3.Client, loader.Repo) {
	t.Helper()
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	if _, err := repo.Publish("m", testModel(1), 2, ""); err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	putMap(t, cli, repo, 2, 1, 0)
	return s, cli, repo
}

// sectionsOf groups keys into one section per partition, as a router
// does.
func sectionsOf(keys []uint64, parts uint32) []codec.Section {
	sections := make([]codec.Section, parts)
	for p := range sections {
		sections[p].Partition = uint32(p)
	}
	for _, k := range keys {
		p := partition.Of(k, parts)
		sections[p].Keys = append(sections[p].Keys, k)
	}
	return sections
}

// lookup asks the shard for keys, all sections by their partition.
func lookup(s *Shard, version uint64, parts uint32, keys []uint64) (*codec.LookupResponse, error) {
	sections := sectionsOf(keys, parts)
	var ordered []uint64
	for _, sec := range sections {
		ordered = append(ordered, sec.Keys...)
	}
	copy(keys, ordered)
	raw, err := s.Lookup(context.Background(), codec.AppendLookupRequest(nil, "m", version, sections))
	if err != nil {
		return nil, err
	}
	var r codec.LookupResponse
	return &r, r.Decode(raw, len(keys), 1, codec.EncFP32)
}

func TestShardServesAssignedAndRefusesDamage(t *testing.T) {
	s, cli, repo := servingShard(t)
	held := func(v uint64) error {
		for _, l := range s.Loaded() {
			if l.Version == v && len(l.Have) == 2 {
				return nil
			}
		}
		return errors.New("not loaded yet")
	}
	testenv.Eventually(t, 10*time.Second, func() error { return held(1) })

	// Exact membership: present keys give their own values, absent ones
	// are absent, duplicates in a batch both answer.
	keys := []uint64{0, math.MaxUint64, 3, 77, 77, 1<<40 + 1, 1 << 40}
	want := map[uint64]float32{0: 1, 77: 78, 1 << 40: float32((1<<40)%1000 + 1), math.MaxUint64: float32(math.MaxUint64%1000 + 1)}
	r, err := lookup(s, 1, 2, keys)
	if err != nil {
		t.Fatal(err)
	}
	k := 0
	for i, key := range keys {
		w, present := want[key]
		if r.Found(i) != present {
			t.Fatalf("key %d: found %v, want %v", key, r.Found(i), present)
		}
		if present {
			if got := r.Value(k, 0); got != w {
				t.Errorf("key %d: value %v, want %v", key, got, w)
			}
			k++
		}
	}

	// Malformed frames and unknown versions are refused with codes.
	if _, err := s.Lookup(context.Background(), []byte{0xC5, 1, 200}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("garbage: %v", err)
	}
	if _, err := lookup(s, 9, 2, []uint64{1}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("unknown version: %v", err)
	}
	// A caller that has given up gets its context's code, not an answer.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Lookup(gone, codec.AppendLookupRequest(nil, "m", 1, sectionsOf([]uint64{1, 2, 3}, 2))); status.Code(err) != codes.Canceled {
		t.Errorf("cancelled caller: %v, want Canceled", err)
	}

	// Version 2 has a damaged file: the shard refuses it, says so in its
	// registration, and keeps serving version 1.
	m2, err := repo.Publish("m", testModel(2), 2, "")
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(repo.VersionDir("m", 2), m2.Files[1].Path)
	b, _ := os.ReadFile(f)
	b[70] ^= 0xff
	os.WriteFile(f, b, 0o644)
	putMap(t, cli, repo, 2, 1, 2)
	testenv.Eventually(t, 10*time.Second, func() error {
		resp, err := cli.Get(context.Background(), topo.DefaultCluster.ShardKey("s1"))
		if err != nil || len(resp.Kvs) == 0 {
			return errors.New("no registration")
		}
		if !strings.Contains(string(resp.Kvs[0].Value), "part-00001.bin") {
			return errors.New("refusal not reported yet")
		}
		return nil
	})
	if err := held(1); err != nil {
		t.Fatal("version 1 was dropped after version 2 failed to load")
	}
	if _, err := lookup(s, 1, 2, []uint64{77}); err != nil {
		t.Fatalf("version 1 stopped serving: %v", err)
	}
	// A refusal is not remembered forever: repaired, the file is loaded
	// on a later try, with no new word from the manager.
	b[70] ^= 0xff
	os.WriteFile(f, b, 0o644)
	testenv.Eventually(t, 10*time.Second, func() error { return held(2) })

	// A good version 3 replaces both.
	if _, err := repo.Publish("m", testModel(3), 2, ""); err != nil {
		t.Fatal(err)
	}
	putMap(t, cli, repo, 2, 3, 0)
	testenv.Eventually(t, 10*time.Second, func() error {
		if l := s.Loaded(); len(l) != 1 || l[0].Version != 3 {
			return errors.New("still holding old versions")
		}
		return nil
	})
	r, err = lookup(s, 3, 2, []uint64{77})
	if err != nil || !r.Found(0) || r.Value(0, 0) != 3*78 {
		t.Fatalf("version 3 lookup: %v", err)
	}
}

// budgetShard is a shard with a memory budget of budget partitions of
// model "m" (2 partitions of 300,000 keys, version 1 published), and
// helpers to drive its serving map and look at what it holds.
type budgetShard struct {
	t      *testing.T
	s      *Shard
	cli    *clientv3.Client
	repo   loader.Repo
	budget int64
}

const budgetSpread uint64 = 0x9e3779b97f4a7c15 // odd: k*spread is a bijection

func budgetModel(scale float32) *loader.Sparse {
	s := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= 300000; k++ {
		s.Keys = append(s.Keys, k*budgetSpread)
		s.Values = append(s.Values, scale*float32(k%97))
	}
	return s
}

func startBudgetShard(t *testing.T, partitions float64) *budgetShard {
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	m1, err := repo.Publish("m", budgetModel(1), 2, "")
	if err != nil {
		t.Fatal(err)
	}
	budget := int64(float64(m1.Files[0].Size) * partitions)
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, MemoryBudget: budget, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &budgetShard{t: t, s: s, cli: cli, repo: repo, budget: budget}
}

// put publishes a map with version live and, if version is another, it
// staged.
func (b *budgetShard) put(version, live uint64) {
	staged := version
	if version == live {
		staged = 0
	}
	putMap(b.t, b.cli, b.repo, 2, live, staged)
}

// mapped counts the partitions of v served mapped.
func (b *budgetShard) mapped(v uint64) (n int) {
	for _, l := range b.s.snap.Load().get("m", v).layers {
		if l != nil && l[0].Mapped {
			n++
		}
	}
	return n
}

func (b *budgetShard) check(v uint64, scale float32) {
	b.t.Helper()
	for _, k := range []uint64{5, 299999, 1, 77777} {
		r, err := lookup(b.s, v, 2, []uint64{k * budgetSpread})
		if err != nil {
			b.t.Fatal(err)
		}
		if !r.Found(0) || r.Value(0, 0) != scale*float32(k%97) {
			b.t.Errorf("v%d: feature %d wrong", v, k)
		}
	}
	if r, err := lookup(b.s, v, 2, []uint64{42}); err != nil || r.Found(0) {
		b.t.Errorf("v%d: absent key: %v", v, err)
	}
}

// awaitLoaded waits until v is held whole.
func (b *budgetShard) awaitLoaded(v uint64) {
	b.t.Helper()
	testenv.Eventually(b.t, 10*time.Second, func() error {
		if ver := b.s.snap.Load().get("m", v); ver == nil || ver.layers[0] == nil || ver.layers[1] == nil {
			return fmt.Errorf("version %d not loaded", v)
		}
		return nil
	})
}

// awaitCommitted waits until v1 is gone and v2 has mapped partitions
// mapped.
func (b *budgetShard) awaitCommitted(mapped int) {
	b.t.Helper()
	testenv.Eventually(b.t, 10*time.Second, func() error {
		if b.s.snap.Load().get("m", 1) != nil || b.mapped(2) != mapped {
			return fmt.Errorf("v1 kept: %v, v2 mapped partitions: %d", b.s.snap.Load().get("m", 1) != nil, b.mapped(2))
		}
		return nil
	})
	if b.s.residentBytes(true) > b.budget {
		b.t.Fatalf("%d resident bytes over the budget %d", b.s.residentBytes(true), b.budget)
	}
}

// TestMemoryBudget: a version beyond the budget is served from disk and
// answers the same; a staged version loads mapped beside the live one;
// after the commit the old version goes, and the new one, which does
// not fit whole either, stays on disk.
func TestMemoryBudget(t *testing.T) {
	b := startBudgetShard(t, 1.5) // room for one partition and a half
	b.put(1, 0)
	b.awaitLoaded(1)
	// It does not fit whole, so it is served from disk whole: the
	// budget goes to value caches.
	if b.mapped(1) != 2 || b.s.residentBytes(true) > b.budget {
		t.Fatalf("v1: %d mapped, %d resident bytes; want 2 mapped within %d", b.mapped(1), b.s.residentBytes(true), b.budget)
	}
	b.check(1, 1)
	if _, err := b.repo.Publish("m", budgetModel(2), 2, ""); err != nil {
		t.Fatal(err)
	}
	b.put(2, 1) // staged beside live version 1: no room, so mapped
	b.awaitLoaded(2)
	if b.mapped(2) != 2 || b.s.snap.Load().get("m", 1) == nil {
		t.Fatalf("staged v2: %d mapped, v1 kept: %v", b.mapped(2), b.s.snap.Load().get("m", 1) != nil)
	}
	b.check(1, 1)
	b.check(2, 2)
	b.put(2, 2) // commit: v1 retires; v2 does not fit whole either, so it stays on disk
	b.awaitCommitted(2)
	b.check(2, 2)
}

// TestStagedMappedWhole: a staged version that does not fit the budget
// whole beside the live one is mapped whole, even where part of it would
// fit (memory would rise while nothing serves it); once committed it is
// promoted.
func TestStagedMappedWhole(t *testing.T) {
	b := startBudgetShard(t, 3.2) // v1 resident, and room for one more partition
	b.put(1, 0)
	b.awaitLoaded(1)
	if b.mapped(1) != 0 {
		t.Fatalf("v1: %d partitions mapped, want none", b.mapped(1))
	}
	if _, err := b.repo.Publish("m", budgetModel(2), 2, ""); err != nil {
		t.Fatal(err)
	}
	b.put(2, 1)
	b.awaitLoaded(2)
	if b.mapped(2) != 2 {
		t.Fatalf("staged v2: %d of 2 partitions mapped, want both", b.mapped(2))
	}
	b.check(2, 2)
	b.put(2, 2)
	b.awaitCommitted(0)
	b.check(2, 2)
}

// diskShardBudget is room for the directory of diskShard's 4.9 MB
// partition (100 KB) and a cache of ~5,000 records.
const diskShardBudget = 192 << 10

// diskShard serves version 1 of an LR model of keys 1..400,000 (key k's
// weight k%1000) in one partition, far over its budget: from disk.
func diskShard(t *testing.T) *Shard {
	t.Helper()
	s, _, _ := diskShardOf(t, diskShardBudget)
	return s
}

// diskShardOf is diskShard with the given memory budget, and its
// etcd client and repository.
func diskShardOf(t *testing.T, budget int64) (*Shard, *clientv3.Client, loader.Repo) {
	t.Helper()
	return diskShardParts(t, budget, 1)
}

// diskShardParts is diskShardOf with the model in parts partitions.
func diskShardParts(t *testing.T, budget int64, parts uint32) (*Shard, *clientv3.Client, loader.Repo) {
	t.Helper()
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	m := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= 400000; k++ {
		m.Keys = append(m.Keys, k)
		m.Values = append(m.Values, float32(k%1000))
	}
	if _, err := repo.Publish("m", m, parts, ""); err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, MemoryBudget: budget, HotInterval: 20 * time.Millisecond, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	putMap(t, cli, repo, parts, 1, 0)
	return s, cli, repo
}

// cacheHolds says which of keys value cache c lacks, if any (or that
// there is no cache).
func cacheHolds(c *valueCache, keys []uint64) error {
	if c == nil {
		return errors.New("no value cache")
	}
	for _, k := range keys {
		if !c.has(codec.KeyHash(k)) {
			return fmt.Errorf("the cache lacks hot key %d (it holds %d keys)", k, c.Len())
		}
	}
	return nil
}

// TestValueCache: a partition far over the budget is served from disk;
// traffic that keeps asking for a few features brings exactly those into
// its value cache, within the budget, and every answer stays exact.
func TestValueCache(t *testing.T) {
	const budget = diskShardBudget
	s := diskShard(t)
	hotKeys := make([]uint64, 1000)
	for i := range hotKeys {
		hotKeys[i] = uint64(1000 + 7*i)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if _, err := lookup(s, 1, 1, slices.Clone(hotKeys)); err != nil {
			return err
		}
		sn := s.acquire()
		defer sn.done()
		v := sn.get("m", 1)
		if len(v.layers[0]) != 1 || !v.layers[0][0].Mapped {
			return errors.New("not served from disk")
		}
		return cacheHolds(v.layers[0][0].cache.Load(), hotKeys)
	})
	if s.residentBytes(true) > budget {
		t.Fatalf("%d resident bytes over the budget %d", s.residentBytes(true), budget)
	}
	// The cache holds every hot key now: asked again, each is a hit (the
	// lookups above may all have come before the cache learned them).
	if _, err := lookup(s, 1, 1, slices.Clone(hotKeys)); err != nil {
		t.Fatal(err)
	}
	// Hot, cold and absent keys all answer exactly.
	keys := []uint64{1000, 1007, 399999, 5, 0, 400001, 1000}
	r, err := lookup(s, 1, 1, slices.Clone(keys))
	if err != nil {
		t.Fatal(err)
	}
	k := 0
	for i, key := range keys {
		present := key >= 1 && key <= 400000
		if r.Found(i) != present {
			t.Fatalf("key %d: found %v", key, r.Found(i))
		}
		if present {
			if got := r.Value(k, 0); got != float32(key%1000) {
				t.Errorf("key %d: %v, want %v", key, got, key%1000)
			}
			k++
		}
	}
	// The metrics tell cache hits from reads from disk.
	hits, reads := testutil.ToFloat64(s.metrics.cacheHits), testutil.ToFloat64(s.metrics.diskReads)
	if hits < float64(len(hotKeys)) || reads == 0 || testutil.ToFloat64(s.metrics.cached) == 0 {
		t.Errorf("metrics: %v cache hits, %v disk reads, %v cache bytes", hits, reads, testutil.ToFloat64(s.metrics.cached))
	}
	// Lookups stop: with no partition asked, the served one keeps what
	// its cache learned for the next lookups, well past idleAfter.
	waitPastIdle(t, s, 10*time.Second, func() error { return nil })
	c := s.snap.Load().get("m", 1).layers[0][0].cache.Load()
	if err := cacheHolds(c, hotKeys); err != nil {
		t.Fatalf("idle with nothing else asked: %v", err)
	}
	if s.residentHot.Load() != c.Bytes() {
		t.Fatalf("%d cache bytes counted, want its %d", s.residentHot.Load(), c.Bytes())
	}
}

// TestSlowDisk: with every read from disk slowed (diskdelay), lookups of
// a partition served from disk end with their deadline, not after their
// reads; lookups whose callers gave up stop reading, so reads do not
// pile up; and once the disk is fast again, answers are exact.
func TestSlowDisk(t *testing.T) {
	s := diskShard(t)
	keys := make([]uint64, 5000)
	for i := range keys {
		keys[i] = uint64(1 + 79*i)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		_, err := lookup(s, 1, 1, slices.Clone(keys[:10]))
		return err
	})
	f, err := ParseFaults("diskdelay=200ms")
	if err != nil {
		t.Fatal(err)
	}
	s.SetFaults(f)
	// 5,000 reads of 200ms, 64 at a time, would take 16 s: each lookup
	// must end with its 300ms deadline instead.
	req := codec.AppendLookupRequest(nil, "m", 1, sectionsOf(slices.Clone(keys), 1))
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, errs[i] = s.Lookup(ctx, req)
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("lookups past their deadline still reading after 10 s")
	}
	for _, err := range errs {
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("a lookup over a slow disk: %v, want DeadlineExceeded", err)
		}
	}
	// No read is left in flight, nor waiting for a turn.
	if n := len(s.cold.slots); n != 0 {
		t.Fatalf("%d reads still hold turns after every lookup ended", n)
	}
	// The keys those lookups missed in the cache count as read from disk,
	// though every lookup failed.
	if n := testutil.ToFloat64(s.metrics.diskReads); n < float64(len(keys)) {
		t.Fatalf("cumulus_shard_disk_reads_total = %v after 8 lookups of %d keys missed their deadline", n, len(keys))
	}
	// Each read delayed is counted, as other faults are.
	if n := testutil.ToFloat64(s.metrics.faults.WithLabelValues("diskdelay")); n < 8 {
		t.Fatalf("cumulus_shard_faults_injected_total{kind=\"diskdelay\"} = %v, want a read delayed a lookup at least", n)
	}
	s.SetFaults(nil)
	r, err := lookup(s, 1, 1, slices.Clone(keys))
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if !r.Found(i) {
			t.Fatalf("key %d not found", keys[i])
		}
	}
}

// A lookup allocates only its response: everything else comes from
// pooled scratch.
func TestLookupAllocs(t *testing.T) {
	if testenv.RaceEnabled {
		// The race detector makes sync.Pool drop items at random, so
		// pooled paths allocate; scripts/test.sh checks this in its
		// ordinary pass.
		t.Skip("allocation counts are not meaningful under -race")
	}
	s, _, _ := servingShard(t)
	testenv.Eventually(t, 10*time.Second, func() error {
		if v := s.snap.Load().get("m", 1); v == nil || v.layers[0] == nil || v.layers[1] == nil {
			return errors.New("not loaded")
		}
		return nil
	})
	req := codec.AppendLookupRequest(nil, "m", 1, sectionsOf([]uint64{0, 1, 2, 77, 1 << 40, 5, 6}, 2))
	if _, err := s.Lookup(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(200, func() { s.Lookup(context.Background(), req) }); n > 1 {
		t.Errorf("Lookup allocated %.1f times per call, want 1 (the response)", n)
	}
}

// TestStandbyGivesWay: with room for one version, the live version is
// resident and the standby one stays loaded, mapped from the shard's own
// copies; after a rollback they trade places. Both answer exactly
// throughout.
func TestStandbyGivesWay(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	model := func(scale float32) *loader.Sparse {
		s := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
		for k := uint64(1); k <= 200000; k++ {
			s.Keys = append(s.Keys, k*0x9e3779b97f4a7c15)
			s.Values = append(s.Values, scale*float32(k%89))
		}
		return s
	}
	var size int64
	for _, scale := range []float32{1, 2} {
		m, err := repo.Publish("m", model(scale), 2, "")
		if err != nil {
			t.Fatal(err)
		}
		size = m.Files[0].Size + m.Files[1].Size
	}
	budget := size + size/4 // one version and a bit
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, MemoryBudget: budget, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mapped := func(v uint64) (n int) {
		if ver := s.snap.Load().get("m", v); ver != nil {
			for _, l := range ver.layers {
				if l != nil && l[0].Mapped {
					n++
				}
			}
		}
		return n
	}
	state := func(live, standby uint64) func() error {
		return func() error {
			for _, v := range []uint64{live, standby} {
				if ver := s.snap.Load().get("m", v); ver == nil || ver.layers[0] == nil || ver.layers[1] == nil {
					return fmt.Errorf("version %d not held whole", v)
				}
			}
			if mapped(live) != 0 || mapped(standby) != 2 {
				return fmt.Errorf("live %d: %d partitions mapped; standby %d: %d mapped", live, mapped(live), standby, mapped(standby))
			}
			return nil
		}
	}
	check := func(v uint64, scale float32) {
		t.Helper()
		for _, k := range []uint64{1, 77, 199999} {
			r, err := lookup(s, v, 2, []uint64{k * 0x9e3779b97f4a7c15})
			if err != nil || !r.Found(0) || r.Value(0, 0) != scale*float32(k%89) {
				t.Fatalf("v%d feature %d: %v", v, k, err)
			}
		}
	}
	putMap(t, cli, repo, 2, 1, 0)
	testenv.Eventually(t, 10*time.Second, func() error {
		if ver := s.snap.Load().get("m", 1); ver == nil || mapped(1) != 0 || ver.layers[1] == nil {
			return errors.New("version 1 not resident yet")
		}
		return nil
	})
	putMap(t, cli, repo, 2, 1, 2) // staged beside it: no room, mapped
	putMap(t, cli, repo, 2, 2, 0, 1)
	testenv.Eventually(t, 10*time.Second, state(2, 1))
	if got := s.residentBytes(true); got > budget {
		t.Fatalf("%d resident bytes over the budget %d", got, budget)
	}
	check(1, 1)
	check(2, 2)
	putMap(t, cli, repo, 2, 1, 0, 2) // rollback
	testenv.Eventually(t, 10*time.Second, state(1, 2))
	if got := s.residentBytes(true); got > budget {
		t.Fatalf("after the rollback: %d resident bytes over the budget %d", got, budget)
	}
	check(1, 1)
	check(2, 2)
}

// bigLR is an LR model of features 1..n, feature k weighing
// scale·(k mod 101): with n large enough, partitions over 2 MiB, in
// huge-page memory freed explicitly (tablemem.Buffer.Freed says when).
func bigLR(n uint64, scale float32) *loader.Sparse {
	s := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= n; k++ {
		s.Keys = append(s.Keys, k)
		s.Values = append(s.Values, scale*float32(k%101))
	}
	return s
}

// TestReclaimWaitsForReaders: a table the map drops is freed at once
// when no lookup reads it, never while one does; lookups racing version
// swaps answer exactly or FailedPrecondition, never from freed memory.
func TestReclaimWaitsForReaders(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	for _, scale := range []float32{1, 2} {
		if _, err := repo.Publish("m", bigLR(300_000, scale), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	holds := func(v uint64) func() error {
		return func() error {
			if ver := s.snap.Load().get("m", v); ver == nil || ver.layers[0] == nil {
				return fmt.Errorf("version %d not loaded", v)
			}
			return nil
		}
	}
	putMap(t, cli, repo, 1, 1, 0)
	testenv.Eventually(t, 10*time.Second, holds(1))
	// A lookup is under way on the snapshot holding version 1 when the
	// map moves to version 2.
	sn := s.acquire()
	t1 := sn.get("m", 1).layers[0][0]
	buf := t1.owner.(*tablemem.Buffer)
	putMap(t, cli, repo, 1, 2, 0)
	testenv.Eventually(t, 10*time.Second, func() error {
		if s.snap.Load().get("m", 1) != nil {
			return errors.New("version 1 still held")
		}
		return nil
	})
	if buf.Freed() {
		t.Fatal("version 1's table freed under a lookup still reading it")
	}
	var idx [1]int32
	t1.Find([]uint64{77}, idx[:]) // the reader still reads it
	if idx[0] < 0 {
		t.Fatal("the held table lost a key")
	}
	sn.done()
	putMap(t, cli, repo, 1, 2, 0) // any news: the loader reclaims on its next pass
	testenv.Eventually(t, 10*time.Second, func() error {
		if !buf.Freed() {
			putMap(t, cli, repo, 1, 2, 0)
			return errors.New("not freed after its reader left")
		}
		return nil
	})

	// Lookups racing swaps of the live version.
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				for _, v := range []uint64{1, 2} {
					r, err := lookup(s, v, 1, []uint64{77})
					if status.Code(err) == codes.FailedPrecondition {
						continue
					}
					if err != nil || !r.Found(0) || r.Value(0, 0) != float32(v)*float32(77%101) {
						errs <- fmt.Errorf("v%d: %v", v, err)
						return
					}
				}
			}
		}()
	}
	for i := range 20 {
		live := uint64(1 + i%2)
		putMap(t, cli, repo, 1, live, 0)
		testenv.Eventually(t, 10*time.Second, holds(live))
	}
	close(stop)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestIdleAfterAFailureGoesAway: a version the shard failed to load (its
// directory removed) and that the map then stops keeping is forgotten:
// the shard reports no error, and, idle, writes nothing to etcd. (It used
// to retry a stale failure every millisecond, writing its registration
// each time, for ever.)
func TestIdleAfterAFailureGoesAway(t *testing.T) {
	s, cli, repo := servingShard(t)
	if _, err := repo.Publish("m", testModel(2), 2, ""); err != nil {
		t.Fatal(err)
	}
	staging := mapOf(t, repo, 2, 1, 2)
	if err := os.RemoveAll(filepath.Join(repo.Dir, "m", "2")); err != nil {
		t.Fatal(err)
	}
	report := func() topo.ShardInfo {
		resp, err := cli.Get(context.Background(), topo.DefaultCluster.ShardKey(s.ID()))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("shard registration: %v %v", resp, err)
		}
		var info topo.ShardInfo
		if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
			t.Fatal(err)
		}
		return info
	}
	writeMap(t, cli, staging)
	testenv.Eventually(t, 30*time.Second, func() error {
		if errs := report().Errors; len(errs) == 0 || !strings.HasPrefix(errs[0], "m/2") {
			return fmt.Errorf("no failure of m/2 reported yet: %v", errs)
		}
		return nil
	})
	putMap(t, cli, repo, 2, 1, 0) // version 2 unstaged
	testenv.Eventually(t, 30*time.Second, func() error {
		if errs := report().Errors; len(errs) > 0 {
			return fmt.Errorf("the shard still reports %v", errs)
		}
		return nil
	})
	// Idle now: past the failure's first retry (1 s), nothing is written.
	// This is a measurement over a window, not a wait for an event.
	rev := func() int64 {
		resp, err := cli.Get(context.Background(), "/")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	before := rev()
	time.Sleep(2500 * time.Millisecond)
	if n := rev() - before; n != 0 {
		t.Errorf("an idle shard made %d etcd revisions in 2.5 s, want 0", n)
	}
}

// TestQuietCacheKept: of two partitions served from disk, both cached,
// one stops being asked while the other goes on: the quiet one keeps its
// cache (for quietAfter, in the room the other leaves), so the first
// lookups of a burst that reach it later find it warm.
func TestQuietCacheKept(t *testing.T) {
	s, _, _ := diskShardParts(t, 2*diskShardBudget, 2)
	hot := [2][]uint64{}
	for k := uint64(1000); len(hot[0]) < 500 || len(hot[1]) < 500; k += 7 {
		if p := partition.Of(k, 2); len(hot[p]) < 500 {
			hot[p] = append(hot[p], k)
		}
	}
	cacheOf := func(p int) *valueCache {
		v := s.snap.Load().get("m", 1)
		if v == nil || len(v.layers[p]) != 1 || !v.layers[p][0].Mapped {
			return nil
		}
		return v.layers[p][0].cache.Load()
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if _, err := lookup(s, 1, 2, append(slices.Clone(hot[0]), hot[1]...)); err != nil {
			return err
		}
		for p := range 2 {
			if err := cacheHolds(cacheOf(p), hot[p]); err != nil {
				return fmt.Errorf("partition %d: %w", p, err)
			}
		}
		return nil
	})
	// Partition 0 alone is asked, past idleAfter and a few ticks.
	waitPastIdle(t, s, 20*time.Second, func() error {
		_, err := lookup(s, 1, 2, slices.Clone(hot[0]))
		return err
	})
	if err := cacheHolds(cacheOf(1), hot[1]); err != nil {
		t.Fatalf("the quiet partition, beside one asked: %v", err)
	}
	if got := s.residentHot.Load(); got != cacheOf(0).Bytes()+cacheOf(1).Bytes() {
		t.Fatalf("%d cache bytes counted, want both caches' %d", got, cacheOf(0).Bytes()+cacheOf(1).Bytes())
	}
	if s.residentBytes(true) > 2*diskShardBudget {
		t.Fatalf("%d resident bytes over the budget %d", s.residentBytes(true), 2*diskShardBudget)
	}
}

// waitPastIdle calls meanwhile until idleAfter (and 3 HotIntervals) has
// passed since the call and the loader has then looked at the caches 3
// times more, or fails t after timeout.
func waitPastIdle(t *testing.T, s *Shard, timeout time.Duration, meanwhile func() error) {
	t.Helper()
	since, ticks := time.Now(), s.maintained.Load()
	testenv.Eventually(t, timeout, func() error {
		if err := meanwhile(); err != nil {
			return err
		}
		if time.Since(since) < idleAfter+3*s.opts.HotInterval {
			ticks = s.maintained.Load()
			return errors.New("not idle long enough yet")
		}
		if s.maintained.Load() < ticks+3 {
			return errors.New("the loader has not looked at the caches since")
		}
		return nil
	})
}
