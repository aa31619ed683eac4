package placement

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// passes is Place as whole passes, repeated until the answer stands:
// what again must give at the cost of what it changes.
func passes(model string, current [][]string, partitions, replicas int, shards []Shard) [][]string {
	if len(shards) == 0 || partitions == 0 {
		return make([][]string, partitions)
	}
	c := newPlacer(model, partitions, replicas, shards)
	out := c.place(c.grid(current))
	for range maxPasses {
		next := c.place(out)
		if slices.Equal(next, out) {
			break
		}
		out = next
	}
	return c.names(out)
}

// TestAgainIsAPass: over random clusters (zones with few shards, rooms,
// weights, current placements naming gone shards), and at 4,096
// partitions over 257 shards, Place gives what whole passes give.
func TestAgainIsAPass(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := range 2000 {
		n := 1 + rng.IntN(30)
		zones := 1 + rng.IntN(4)
		var shards []Shard
		for i := range n {
			s := Shard{ID: fmt.Sprintf("s%d", i), Weight: float64(1 + rng.IntN(3))}
			if rng.IntN(5) > 0 {
				s.Zone = fmt.Sprintf("z%d", rng.IntN(zones))
			}
			if rng.IntN(3) == 0 {
				s.Bounded, s.Room = true, rng.IntN(40)
			}
			shards = append(shards, s)
		}
		parts, reps := rng.IntN(200), 1+rng.IntN(3)
		var cur [][]string
		if rng.IntN(3) > 0 {
			cur = make([][]string, rng.IntN(parts+3))
			for p := range cur {
				for range rng.IntN(5) {
					cur[p] = append(cur[p], fmt.Sprintf("s%d", rng.IntN(n+2)))
				}
			}
		}
		model := fmt.Sprint("m", trial)
		if got, want := Place(model, cur, parts, reps, shards), passes(model, cur, parts, reps, shards); !reflect.DeepEqual(got, want) {
			t.Fatalf("trial %d: Place differs from whole passes", trial)
		}
	}
	shards := zonedShards(257)
	cur := Place("m", nil, 4096, 2, shards[:256])
	if got, want := Place("m", cur, 4096, 2, shards), passes("m", cur, 4096, 2, shards); !reflect.DeepEqual(got, want) {
		t.Fatal("a join at 4,096 partitions: Place differs from whole passes")
	}
}
