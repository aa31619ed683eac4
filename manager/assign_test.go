package manager

import (
	"fmt"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

func TestAssign(t *testing.T) {
	shards := []string{"s0", "s1", "s2"}
	as := Assign([]Model{{"a", 3, 8}, {"b", 1, 2}}, shards, 2)
	if len(as) != 2 {
		t.Fatalf("%d assignments", len(as))
	}
	for _, a := range as {
		load := map[string]int{}
		for p, reps := range a.Replicas {
			if len(reps) != 2 || reps[0] == reps[1] {
				t.Errorf("%s partition %d replicas %v, want 2 distinct", a.Model, p, reps)
			}
			for _, s := range reps {
				load[s]++
			}
		}
		if a.Model == "a" {
			for _, s := range shards {
				if load[s] < 5 || load[s] > 6 { // 16 replicas over 3 shards
					t.Errorf("shard %s holds %d partitions of a, want 5 or 6", s, load[s])
				}
			}
		}
	}
	// Deterministic: the same inputs give the same answer.
	if fmt.Sprint(as) != fmt.Sprint(Assign([]Model{{"a", 3, 8}, {"b", 1, 2}}, shards, 2)) {
		t.Error("Assign is not deterministic")
	}
	if got := Assign([]Model{{"a", 1, 4}}, shards[:1], 3); len(got[0].Replicas[0]) != 1 {
		t.Errorf("replicas beyond shard count: %v", got[0].Replicas)
	}
	if Assign([]Model{{"a", 1, 4}}, nil, 1) != nil {
		t.Error("assignment with no shards")
	}
}

func TestReady(t *testing.T) {
	a := topo.Assignment{Model: "m", Version: 2, Live: 1, Partitions: 2, Replicas: [][]string{{"a", "b"}, {"b"}}}
	holds := func(v uint64, have ...uint32) []topo.Loaded {
		return []topo.Loaded{{Model: "m", Version: 1, Have: []uint32{0, 1}}, {Model: "m", Version: v, Have: have}}
	}
	shards := map[string]topo.ShardInfo{"a": {ID: "a", Loaded: holds(2, 0)}, "b": {ID: "b", Loaded: holds(2, 0)}}
	if Ready(a, shards) {
		t.Error("ready while b lacks partition 1 of version 2")
	}
	shards["b"] = topo.ShardInfo{ID: "b", Loaded: holds(2, 0, 1)}
	if !Ready(a, shards) {
		t.Error("not ready though every replica holds version 2")
	}
	delete(shards, "a")
	if Ready(a, shards) {
		t.Error("ready with replica a gone")
	}
}

func TestHandover(t *testing.T) {
	loaded := func(v uint64, have ...uint32) topo.Loaded { return topo.Loaded{Model: "m", Version: v, Have: have} }
	info := func(id string, ls ...topo.Loaded) topo.ShardInfo { return topo.ShardInfo{ID: id, Loaded: ls} }
	// s0 held both partitions of version 1; s1 joins and takes partition 1.
	prev := topo.Assignment{Model: "m", Version: 1, Live: 1, Partitions: 2, Replicas: [][]string{{"s0"}, {"s0"}}}
	target := topo.Assignment{Model: "m", Version: 1, Live: 1, Partitions: 2, Replicas: [][]string{{"s0"}, {"s1"}}}
	shards := map[string]topo.ShardInfo{"s0": info("s0", loaded(1, 0, 1)), "s1": info("s1")}
	got := Handover(target, prev, shards)
	if want := [][]string{{"s0"}, {"s1", "s0"}}; fmt.Sprint(got.Replicas) != fmt.Sprint(want) {
		t.Errorf("while s1 loads: %v, want %v", got.Replicas, want)
	}
	if fmt.Sprint(target.Replicas) != "[[s0] [s1]]" {
		t.Errorf("Handover changed its input: %v", target.Replicas)
	}
	// Published again while s1 still loads, the union stands.
	if again := Handover(target, got, shards); fmt.Sprint(again.Replicas) != fmt.Sprint(got.Replicas) {
		t.Errorf("second pass while s1 loads: %v", again.Replicas)
	}
	shards["s1"] = info("s1", loaded(1, 1))
	if got := Handover(target, got, shards); fmt.Sprint(got.Replicas) != fmt.Sprint(target.Replicas) {
		t.Errorf("once s1 holds partition 1: %v, want the target %v", got.Replicas, target.Replicas)
	}

	// A previous holder that is gone, or never loaded the partition, is
	// not kept.
	shards = map[string]topo.ShardInfo{"s1": info("s1"), "s2": info("s2")}
	prev = topo.Assignment{Model: "m", Version: 1, Live: 1, Partitions: 2, Replicas: [][]string{{"s0"}, {"s2"}}}
	target = topo.Assignment{Model: "m", Version: 1, Live: 1, Partitions: 2, Replicas: [][]string{{"s1"}, {"s1"}}}
	if got := Handover(target, prev, shards); fmt.Sprint(got.Replicas) != "[[s1] [s1]]" {
		t.Errorf("gone or empty previous holders kept: %v", got.Replicas)
	}

	// Mid-rollout: the old holder of live version 1 stays until the new
	// holder has version 2.
	prev = topo.Assignment{Model: "m", Version: 1, Live: 1, Partitions: 1, Replicas: [][]string{{"s0"}}}
	target = topo.Assignment{Model: "m", Version: 2, Live: 1, Partitions: 1, Replicas: [][]string{{"s1"}}}
	shards = map[string]topo.ShardInfo{"s0": info("s0", loaded(1, 0)), "s1": info("s1", loaded(1))}
	if got := Handover(target, prev, shards); fmt.Sprint(got.Replicas) != "[[s1 s0]]" {
		t.Errorf("rollout and move: %v", got.Replicas)
	}
	shards["s1"] = info("s1", loaded(2, 0))
	if got := Handover(target, prev, shards); fmt.Sprint(got.Replicas) != "[[s1]]" {
		t.Errorf("rollout and move, new holder ready: %v", got.Replicas)
	}

	// A new partition count has no correspondence: the target as it is.
	shards["s1"] = info("s1")
	prev.Partitions, prev.Replicas = 2, [][]string{{"s0"}, {"s0"}}
	if got := Handover(target, prev, shards); fmt.Sprint(got.Replicas) != "[[s1]]" {
		t.Errorf("repartitioned: %v", got.Replicas)
	}
}
