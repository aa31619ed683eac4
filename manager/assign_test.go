package manager

import (
	"fmt"
	"testing"
)

func TestAssign(t *testing.T) {
	shards := []string{"s0", "s1", "s2"}
	reps := Assign("a", nil, 8, shards, nil, 2, Fit{})
	load := map[string]int{}
	for p, r := range reps {
		if len(r) != 2 || r[0] == r[1] {
			t.Errorf("partition %d replicas %v, want 2 distinct", p, r)
		}
		for _, s := range r {
			load[s]++
		}
	}
	for _, s := range shards {
		if load[s] < 5 || load[s] > 6 { // 16 replicas over 3 shards
			t.Errorf("shard %s holds %d partitions, want 5 or 6", s, load[s])
		}
	}
	if fmt.Sprint(reps) != fmt.Sprint(Assign("a", nil, 8, shards, nil, 2, Fit{})) {
		t.Error("Assign is not deterministic")
	}
	if fmt.Sprint(reps) != fmt.Sprint(Assign("a", reps, 8, shards, nil, 2, Fit{})) {
		t.Error("Assign moved partitions with nothing changed")
	}
	if got := Assign("a", nil, 4, shards[:1], nil, 3, Fit{}); len(got[0]) != 1 {
		t.Errorf("replicas beyond shard count: %v", got)
	}
	if got := Assign("a", nil, 4, nil, nil, 1, Fit{}); len(got) != 4 || len(got[0]) != 0 {
		t.Errorf("with no shards: %v, want 4 empty lists", got)
	}
}
