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
