package shard

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

// warmKeys is the hot keys the warming tests ask s for, and the value
// cache of a version's partition 0 (nil if none).
func warmKeys(s *Shard) (hotKeys []uint64, cacheOf func(v uint64) *valueCache) {
	hotKeys = make([]uint64, 1000)
	for i := range hotKeys {
		hotKeys[i] = uint64(1000 + 7*i)
	}
	return hotKeys, func(v uint64) *valueCache {
		sn := s.acquire()
		defer sn.done()
		ver := sn.get("m", v)
		if ver == nil || len(ver.layers[0]) == 0 {
			return nil
		}
		return ver.layers[0][0].cache.Load()
	}
}

// publishOtherValues publishes version 2 of diskShardOf's model: the
// same keys, each value 0.5 more.
func publishOtherValues(t *testing.T, repo loader.Repo) {
	t.Helper()
	m := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= 400000; k++ {
		m.Keys = append(m.Keys, k)
		m.Values = append(m.Values, float32(k%1000)+0.5)
	}
	if _, err := repo.Publish("m", m, 1, ""); err != nil {
		t.Fatal(err)
	}
}

// stageWarm has diskShardOf's shard learn hotKeys as version 1 is
// asked for them, then stages version 2 (other values) and waits until
// the shard reports it held, asking version 1 meanwhile. It returns the
// size of version 1's cache before staging.
func stageWarm(t *testing.T, s *Shard, cli *clientv3.Client, repo loader.Repo, hotKeys []uint64, cacheOf func(uint64) *valueCache) (live int64) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() error {
		if _, err := lookup(s, 1, 1, slices.Clone(hotKeys)); err != nil {
			return err
		}
		return cacheHolds(cacheOf(1), hotKeys)
	})
	live = cacheOf(1).Bytes()
	// Version 2: other weights. Staged, it is held once warm.
	publishOtherValues(t, repo)
	putMap(t, cli, repo, 1, 1, 2)
	testenv.Eventually(t, 30*time.Second, func() error {
		// The live version is asked meanwhile, as traffic would: a cache
		// no lookup asks for idleAfter is given back.
		if _, err := lookup(s, 1, 1, slices.Clone(hotKeys)); err != nil {
			return err
		}
		resp, err := cli.Get(context.Background(), topo.DefaultCluster.ShardKey("s1"))
		if err != nil || len(resp.Kvs) == 0 {
			return errors.New("no registration")
		}
		var info topo.ShardInfo
		if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
			return err
		}
		for _, l := range info.Loaded {
			if l.Version == 2 && slices.Contains(l.Have, 0) {
				return nil
			}
		}
		return fmt.Errorf("version 2 not reported held yet: %+v", info.Loaded)
	})
	return live
}

// TestWarmStaged: a new version staged beside the live one, both served
// from disk, is reported held only once its value cache holds the live
// cache's hot keys with its own values, within the budget (the live
// cache keeps its most asked half to make room). Committed, its first
// lookups of the hot keys are all cache hits, and its cache then grows
// to the live one's size once the old version's memory is gone.
func TestWarmStaged(t *testing.T) {
	const budget = 1 << 20 // each version's directory (100 KB) and a cache of 32,768 slots, halved when staging
	s, cli, repo := diskShardOf(t, budget)
	hotKeys, cacheOf := warmKeys(s)
	holdsHot := func(c *valueCache) error { return cacheHolds(c, hotKeys) }
	live := stageWarm(t, s, cli, repo, hotKeys, cacheOf)
	// Reported held: warm already, with version 2's values.
	if err := holdsHot(cacheOf(2)); err != nil {
		t.Fatalf("version 2 reported held before its cache was warm: %v", err)
	}
	val := make([]byte, 4)
	if !cacheOf(2).get(codec.KeyHash(1007), val) || math.Float32frombits(binary.LittleEndian.Uint32(val)) != 7.5 {
		t.Fatalf("version 2's cache holds key 1007 as %v, want 7.5", math.Float32frombits(binary.LittleEndian.Uint32(val)))
	}
	if err := holdsHot(cacheOf(1)); err != nil || cacheOf(1).Bytes() >= live {
		t.Fatalf("the live cache (%d bytes, before %d) lost its hot keys making room: %v", cacheOf(1).Bytes(), live, err)
	}
	if got := s.residentBytes(true); got > budget {
		t.Fatalf("%d bytes resident and cached, over the budget %d", got, budget)
	}

	// Committed (version 1 retired): the first lookups of the hot keys
	// are cache hits.
	putMap(t, cli, repo, 1, 2, 0)
	hits := testutil.ToFloat64(s.metrics.cacheHits)
	r, err := lookup(s, 2, 1, slices.Clone(hotKeys))
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.metrics.cacheHits) - hits; got < float64(len(hotKeys)) {
		t.Fatalf("%v of the %d hot keys' first lookups after the commit were cache hits", got, len(hotKeys))
	}
	if r.Value(1, 0) != 7.5 {
		t.Fatalf("key 1007 reads %v from version 2, want 7.5", r.Value(1, 0))
	}
	// The old version's directory and cache go; the new cache grows into
	// the room, keeping its keys.
	testenv.Eventually(t, 20*time.Second, func() error {
		if _, err := lookup(s, 2, 1, slices.Clone(hotKeys)); err != nil {
			return err
		}
		if c := cacheOf(2); c == nil || c.Bytes() < live {
			return fmt.Errorf("version 2's cache has not grown to %d bytes yet", live)
		}
		return holdsHot(cacheOf(2))
	})
}

// TestWarmCommitQuiet: a staged version's warm cache is not dropped as
// idle after its commit before its first lookups are sampled. A shard of
// hundreds of partitions samples each only now and then, and the loader's
// ticks after a commit can hear nothing of a partition yet: dropped, its
// cache was learned again from nothing under load (at 1,024 partitions,
// up to 25,000 keys a tenth of a second read from disk, and a second of
// refused requests).
func TestWarmCommitQuiet(t *testing.T) {
	s, cli, repo := diskShardOf(t, 1<<20)
	hotKeys, cacheOf := warmKeys(s)
	stageWarm(t, s, cli, repo, hotKeys, cacheOf)
	putMap(t, cli, repo, 1, 2, 0) // committed; version 1 retired
	testenv.Eventually(t, 20*time.Second, func() error {
		if s.snap.Load().get("m", 1) != nil {
			return errors.New("version 1 not retired yet")
		}
		return nil
	})
	// Ticks with no lookup of version 2.
	ticks := s.maintained.Load()
	testenv.Eventually(t, 20*time.Second, func() error {
		if s.maintained.Load() < ticks+3 {
			return errors.New("the loader has not ticked three times yet")
		}
		return nil
	})
	if err := cacheHolds(cacheOf(2), hotKeys); err != nil {
		t.Fatalf("version 2's warm cache, after the commit and before any lookup: %v", err)
	}
	hits := testutil.ToFloat64(s.metrics.cacheHits)
	if _, err := lookup(s, 2, 1, slices.Clone(hotKeys)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.metrics.cacheHits) - hits; got < float64(len(hotKeys)) {
		t.Fatalf("%v of the %d hot keys' first lookups after the commit were cache hits", got, len(hotKeys))
	}
}

// TestWarmLive: a version served from disk that goes live with no value
// cache (rolled back to, after standing by) is warmed at once from the
// cache of the version it replaces, with its own values and within the
// budget, without a lookup asking it first; and the same again the other
// way.
func TestWarmLive(t *testing.T) {
	const budget = 1 << 20
	s, cli, repo := diskShardOf(t, budget)
	hotKeys, cacheOf := warmKeys(s)
	publishOtherValues(t, repo)
	val := make([]byte, 4)
	for _, step := range []struct{ live, standby uint64 }{{2, 1}, {1, 2}} {
		// The live version is asked for the hot keys and caches them.
		testenv.Eventually(t, 20*time.Second, func() error {
			if _, err := lookup(s, step.standby, 1, slices.Clone(hotKeys)); err != nil {
				return err
			}
			return cacheHolds(cacheOf(step.standby), hotKeys)
		})
		// Another goes live at once, not staged first: cold, as a
		// rollback's version; it is asked nothing before its cache is read.
		putMap(t, cli, repo, 1, step.live, 0, step.standby)
		testenv.Eventually(t, 20*time.Second, func() error { return cacheHolds(cacheOf(step.live), hotKeys) })
		want := float32(7) + 0.5*float32(step.live-1)
		if !cacheOf(step.live).get(codec.KeyHash(1007), val) || math.Float32frombits(binary.LittleEndian.Uint32(val)) != want {
			t.Fatalf("version %d's cache holds key 1007 as %v, want %v", step.live, math.Float32frombits(binary.LittleEndian.Uint32(val)), want)
		}
		if got := s.residentBytes(true); got > budget {
			t.Fatalf("%d bytes resident and cached, over the budget %d", got, budget)
		}
	}
}

// TestStandbyKeepsCache: the newest standby version, served from disk,
// keeps a cache of the live one's hot keys with its own values, in the
// room the live cache leaves and within the budget, so that a rollback's
// first lookups are cache hits; rolled back to, it keeps that cache (and
// grows it), and the version it replaced becomes the standby that keeps
// one.
func TestStandbyKeepsCache(t *testing.T) {
	const budget = 1 << 20 // two directories (200 KB) and a live cache of 32,768 slots (557 KB): 8,192 slots' room left
	s, cli, repo := diskShardOf(t, budget)
	hotKeys, cacheOf := warmKeys(s)
	publishOtherValues(t, repo)
	val := make([]byte, 4)
	valueOf := func(v uint64) float32 {
		if c := cacheOf(v); c == nil || !c.get(codec.KeyHash(1007), val) {
			return -1
		}
		return math.Float32frombits(binary.LittleEndian.Uint32(val))
	}
	for _, step := range []struct{ live, standby uint64 }{{2, 1}, {1, 2}} {
		putMap(t, cli, repo, 1, step.live, 0, step.standby)
		// The live version is asked for the hot keys; the standby one
		// comes to hold them too, each with its own value.
		testenv.Eventually(t, 20*time.Second, func() error {
			if _, err := lookup(s, step.live, 1, slices.Clone(hotKeys)); err != nil {
				return err
			}
			if err := cacheHolds(cacheOf(step.live), hotKeys); err != nil {
				return fmt.Errorf("live version %d: %w", step.live, err)
			}
			if err := cacheHolds(cacheOf(step.standby), hotKeys); err != nil {
				return fmt.Errorf("standby version %d: %w", step.standby, err)
			}
			if got := s.residentBytes(true); got > budget {
				return fmt.Errorf("%d bytes resident and cached, over the budget %d", got, budget)
			}
			if live, standby := cacheOf(step.live), cacheOf(step.standby); live == nil || standby == nil || standby.Bytes() >= live.Bytes() {
				return errors.New("the standby cache is not smaller than the live one (or one of them is gone)")
			}
			return nil
		})
		if want := 7 + 0.5*float32(step.standby-1); valueOf(step.standby) != want {
			t.Fatalf("standby version %d's cache holds key 1007 as %v, want %v", step.standby, valueOf(step.standby), want)
		}
		// Rolled back to, its first lookups of the hot keys are hits.
		hits := testutil.ToFloat64(s.metrics.cacheHits)
		if _, err := lookup(s, step.standby, 1, slices.Clone(hotKeys)); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(s.metrics.cacheHits) - hits; got < float64(len(hotKeys)) {
			t.Fatalf("%v of the %d hot keys' first lookups of the standby version were cache hits", got, len(hotKeys))
		}
	}
}
