package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

func equalShards(ids ...string) []Shard {
	out := make([]Shard, len(ids))
	for i, id := range ids {
		out[i] = Shard{ID: id, Weight: 1}
	}
	return out
}

// moved counts the replicas of next that current did not have.
func moved(current, next [][]string) int {
	n := 0
	for p := range next {
		for _, id := range next[p] {
			if p >= len(current) || !slices.Contains(current[p], id) {
				n++
			}
		}
	}
	return n
}

func randomName(rng *rand.Rand) string {
	b := make([]byte, 1+rng.IntN(12))
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789-"[rng.IntN(37)]
	}
	return string(b)
}

// TestScaleOutMovesLittle: for 1,000 random sets of shard names, adding a
// 5th shard to 4 (64 partitions, one replica) moves at most
// ceil(64/5) = 13 partitions, all to the new shard; removing it again
// moves only its own, back; a placement placed again does not change.
func TestScaleOutMovesLittle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	worst := 0
	for range 1000 {
		var ids []string
		for len(ids) < 5 {
			if id := randomName(rng); !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		model := randomName(rng)
		four := Place(model, nil, 64, 1, equalShards(ids[:4]...))
		if again := Place(model, four, 64, 1, equalShards(ids[:4]...)); !reflect.DeepEqual(again, four) {
			t.Fatalf("placing again moved %d", moved(four, again))
		}
		five := Place(model, four, 64, 1, equalShards(ids...))
		m := moved(four, five)
		worst = max(worst, m)
		if m > 13 {
			t.Fatalf("shards %v: adding %s moved %d partitions", ids[:4], ids[4], m)
		}
		for p := range five {
			if five[p][0] != four[p][0] && five[p][0] != ids[4] {
				t.Fatalf("partition %d moved from %s to %s, not to the new shard", p, four[p][0], five[p][0])
			}
		}
		back := Place(model, five, 64, 1, equalShards(ids[:4]...))
		for p := range back {
			if five[p][0] != ids[4] && back[p][0] != five[p][0] {
				t.Fatalf("removing %s moved partition %d off %s", ids[4], p, five[p][0])
			}
		}
	}
	t.Logf("adding a 5th shard moved at most %d of 64 partitions", worst)
}

// TestWeightedBalance: 10,000 partitions over 100 shards of weights 1, 2
// and 4: each shard within ±5% of its weight's share.
func TestWeightedBalance(t *testing.T) {
	shards, counts := weighted(100)
	var total float64
	for _, s := range shards {
		total += s.Weight
	}
	got := Place("m", nil, 10000, 1, shards)
	for _, r := range got {
		counts[r[0]]++
	}
	worst := 0.0
	for _, s := range shards {
		want := 10000 * s.Weight / total
		off := math.Abs(float64(counts[s.ID])-want) / want
		worst = max(worst, off)
		if off > 0.05 {
			t.Fatalf("shard %s (weight %g): %d partitions, share %.1f", s.ID, s.Weight, counts[s.ID], want)
		}
	}
	t.Logf("worst shard %.2f%% off its share", 100*worst)
}

func weighted(n int) ([]Shard, map[string]int) {
	rng := rand.New(rand.NewPCG(2, 2))
	var shards []Shard
	for i := range n {
		shards = append(shards, Shard{ID: fmt.Sprintf("s%03d", i), Weight: []float64{1, 2, 4}[rng.IntN(3)]})
	}
	return shards, map[string]int{}
}

// BenchmarkPlace10k: the target is under 50 ms.
func BenchmarkPlace10k(b *testing.B) {
	shards, _ := weighted(100)
	for b.Loop() {
		Place("m", nil, 10000, 1, shards)
	}
}

// TestReplicasAndZones: replicas are on distinct shards, and in distinct
// zones while there are as many zones as replicas; the answer does not
// depend on the order shards are given in.
func TestReplicasAndZones(t *testing.T) {
	var shards []Shard
	for i := range 6 {
		shards = append(shards, Shard{ID: fmt.Sprintf("s%d", i), Weight: 1, Zone: fmt.Sprintf("z%d", i%3)})
	}
	zone := map[string]string{}
	for _, s := range shards {
		zone[s.ID] = s.Zone
	}
	got := Place("m", nil, 30, 3, shards)
	shuffled := slices.Clone(shards)
	rand.New(rand.NewPCG(3, 3)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	if again := Place("m", nil, 30, 3, shuffled); !reflect.DeepEqual(again, got) {
		t.Fatal("the order of the shards changed the placement")
	}
	for p, r := range got {
		zones := map[string]bool{}
		for _, id := range r {
			zones[zone[id]] = true
		}
		if len(r) != 3 || len(zones) != 3 {
			t.Fatalf("partition %d: %v", p, r)
		}
	}
	// A current placement with two replicas in one zone is mended.
	cur := slices.Clone(got)
	cur[0] = []string{"s0", "s3", "s1"} // z0, z0, z1
	fixed := Place("m", cur, 30, 3, shards)
	zones := map[string]bool{}
	for _, id := range fixed[0] {
		zones[zone[id]] = true
	}
	if len(zones) != 3 {
		t.Fatalf("partition 0 kept two replicas in one zone: %v", fixed[0])
	}
	// More replicas than zones: distinct shards still.
	two := []Shard{{ID: "a", Weight: 1, Zone: "z"}, {ID: "b", Weight: 1, Zone: "z"}, {ID: "c", Weight: 1, Zone: "y"}}
	for p, r := range Place("m", nil, 10, 3, two) {
		if len(r) != 3 || r[0] == r[1] || r[1] == r[2] || r[0] == r[2] {
			t.Fatalf("partition %d: %v", p, r)
		}
	}
	// More replicas than shards: as many as there are shards.
	if r := Place("m", nil, 1, 5, two)[0]; len(r) != 3 {
		t.Fatalf("%v", r)
	}
}

// TestPlaceStands: placing again what Place gave moves nothing, with
// zones and weights too, over random clusters.
func TestPlaceStands(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for c := range 2000 {
		var shards []Shard
		zoned := c%2 == 0
		parts, reps := 1+rng.IntN(40), 1+rng.IntN(3)
		for i := range 2 + rng.IntN(8) {
			s := Shard{ID: fmt.Sprintf("s%d", i), Weight: float64(1 + rng.IntN(4))}
			if zoned {
				s.Zone = fmt.Sprintf("z%d", rng.IntN(3))
			}
			if rng.IntN(2) == 0 {
				s.Bounded, s.Room = true, rng.IntN(parts+1)
			}
			shards = append(shards, s)
		}
		got := Place("m", nil, parts, reps, shards)
		if again := Place("m", got, parts, reps, shards); !reflect.DeepEqual(again, got) {
			t.Fatalf("case %d (%d partitions, %d replicas, %v): placing again moved %d", c, parts, reps, shards, moved(got, again))
		}
		if zoned {
			continue // a zone may force a replica past a shard's room
		}
		// When the rooms hold every replica, no shard is past its room.
		room, n := 0, map[string]int{}
		for _, s := range shards {
			if s.Bounded {
				room += s.Room
			} else {
				room += parts
			}
		}
		for _, r := range got {
			for _, id := range r {
				n[id]++
			}
		}
		for _, s := range shards {
			if room >= parts*min(reps, len(shards)) && s.Bounded && n[s.ID] > s.Room {
				t.Fatalf("case %d (%d partitions, %d replicas, %v): %s holds %d, room for %d", c, parts, reps, shards, s.ID, n[s.ID], s.Room)
			}
		}
	}
}

// TestRoom: a shard bounded by its room takes no more replicas than fit
// while others have room; what fits nowhere goes by weight all the same;
// placing again moves nothing.
func TestRoom(t *testing.T) {
	count := func(reps [][]string) map[string]int {
		n := map[string]int{}
		for _, r := range reps {
			for _, id := range r {
				n[id]++
			}
		}
		return n
	}
	shards := equalShards("a", "b", "c")
	shards[0].Bounded, shards[0].Room = true, 2
	got := Place("m", nil, 12, 1, shards)
	if n := count(got); n["a"] != 2 || n["b"] != 5 || n["c"] != 5 {
		t.Fatalf("a with room for 2 of 12: %v", n)
	}
	if again := Place("m", got, 12, 1, shards); !reflect.DeepEqual(again, got) {
		t.Fatalf("placing again moved %d", moved(got, again))
	}
	// Room for 8 of 12 in all: the 4 left go by weight (equal), and a
	// shard already at its room takes its weight's share of them.
	for i := range shards {
		shards[i].Bounded = true
	}
	shards[0].Room, shards[1].Room, shards[2].Room = 2, 6, 0
	// Each takes a third of the 4 (one, and one of them a second).
	n := count(Place("m", nil, 12, 1, shards))
	if n["a"]+n["b"]+n["c"] != 12 || n["a"] < 3 || n["b"] < 7 || n["c"] < 1 {
		t.Fatalf("room for 8 of 12, the 4 beyond split by weight: %v", n)
	}
	// A room beyond the partitions, or negative, is one replica per
	// partition, or none.
	shards = equalShards("a", "b")
	shards[0].Bounded, shards[0].Room = true, 1000
	shards[1].Bounded, shards[1].Room = true, -5
	if n := count(Place("m", nil, 4, 2, shards)); n["a"] != 4 || n["b"] != 4 {
		t.Fatalf("two replicas of 4 on two shards: %v", n)
	}
	if n := count(Place("m", nil, 4, 1, shards)); n["a"] != 4 || n["b"] != 0 {
		t.Fatalf("b has no room: %v", n)
	}
}

// TestClusterScaleJoinLeave: at 4,096 partitions over 256 shards in 4
// zones, replicas 2, a shard joining takes its share (1/257 of the
// replicas), and what else moves (replicas a zone forces past a quota,
// and those they displace) is at most half as many again; a
// shard leaving moves only its own; and either placement, placed again,
// moves nothing (the passes reach their fixed point).
func TestClusterScaleJoinLeave(t *testing.T) {
	shards := zonedShards(257)
	const parts, reps = 4096, 2
	before := Place("m", nil, parts, reps, shards[:256])
	joined := Place("m", before, parts, reps, shards)
	left := Place("m", before, parts, reps, shards[1:256])
	for name, got := range map[string][][]string{"before": before, "joined": joined, "left": left} {
		ss := shards
		switch name {
		case "before":
			ss = shards[:256]
		case "left":
			ss = shards[1:256]
		}
		if again := Place("m", got, parts, reps, ss); !reflect.DeepEqual(again, got) {
			t.Fatalf("%s: placing again moved %d", name, moved(got, again))
		}
	}
	onto := 0
	for _, r := range joined {
		if slices.Contains(r, "shard-0256") {
			onto++
		}
	}
	share := parts * reps / 257
	if onto < share || onto > share+1 {
		t.Fatalf("the joining shard took %d replicas; its share is %d", onto, share)
	}
	if n := moved(before, joined); n > onto*3/2 {
		t.Fatalf("a join moved %d replicas, %d of them onto the new shard", n, onto)
	}
	own := 0
	for _, r := range before {
		if slices.Contains(r, "shard-0000") {
			own++
		}
	}
	if n := moved(before, left); n != own {
		t.Fatalf("a leave moved %d replicas; the shard held %d", n, own)
	}
}
