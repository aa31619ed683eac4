package topo

import (
	"encoding/json"
	"testing"
)

// TestShardReports: a shard's registration and its reports assemble to
// what it holds; a report says nothing of a version kept since after
// its Seq, nor of a partition it lists as missing.
func TestShardReports(t *testing.T) {
	c := DefaultCluster
	reg, _ := json.Marshal(ShardInfo{Schema: ShardInfoSchema, ID: "s1", Addr: "a:1"})
	held, _ := json.Marshal(HeldRecord{Schema: ShardInfoSchema, Seq: 10, Except: []Except{{Version: 7, Missing: []uint32{3}}}})
	parts, _ := json.Marshal(PartsRecord{Schema: ShardInfoSchema, Parts: []uint32{1, 3, 5}})
	kv := map[string][]byte{c.ShardKey("s1"): reg, c.HeldKey("s1", "m"): held, c.PartsKey("s1", "m"): parts,
		c.HeldKey("s1", "other"): held} // no parts: nothing of "other"
	si, ok := Shards(kv, c)["s1"]
	if !ok || si.Held["m"] == nil || si.Held["other"] != nil {
		t.Fatalf("assembled %+v", si)
	}
	a := &Assignment{Model: "m", KeptSince: map[uint64]uint64{6: 4, 7: 9, 8: 11}}
	for _, c := range []struct {
		v    uint64
		p    uint32
		want bool
	}{{6, 1, true}, {6, 3, true}, {7, 3, false}, {7, 5, true}, {6, 2, false}, {8, 1, false}} {
		if got := si.HoldsIn(a, c.v, c.p); got != c.want {
			t.Errorf("version %d partition %d: holds %v, want %v", c.v, c.p, got, c.want)
		}
	}
	if n := si.Held["m"].Count(7, 9); n != 2 {
		t.Errorf("count of version 7: %d, want 2", n)
	}
	// Refused: partitions out of order, exceptions out of order, a
	// report without its registration, a registration under another ID.
	for name, kv := range map[string]map[string][]byte{
		"parts":    {c.ShardKey("s1"): reg, c.HeldKey("s1", "m"): held, c.PartsKey("s1", "m"): []byte(`{"schema":4,"parts":[3,1]}`)},
		"except":   {c.ShardKey("s1"): reg, c.PartsKey("s1", "m"): parts, c.HeldKey("s1", "m"): []byte(`{"schema":4,"seq":1,"except":[{"version":2,"missing":[5,1]}]}`)},
		"orphan":   {c.HeldKey("s1", "m"): held, c.PartsKey("s1", "m"): parts},
		"under id": {c.ShardKey("s2"): reg},
	} {
		if si := Shards(kv, c)["s1"]; si.Held["m"] != nil {
			t.Errorf("%s: assembled %+v", name, si.Held["m"])
		}
	}
}

// FuzzShardReports: no report makes a reader panic.
func FuzzShardReports(f *testing.F) {
	c := DefaultCluster
	f.Add([]byte(`{"schema":4,"id":"s1"}`), []byte(`{"schema":4,"seq":10,"except":[{"version":7,"missing":[3]}]}`), []byte(`{"schema":4,"parts":[1,3,5]}`))
	f.Fuzz(func(t *testing.T, reg, held, parts []byte) {
		si := Shards(map[string][]byte{c.ShardKey("s1"): reg, c.HeldKey("s1", "m"): held, c.PartsKey("s1", "m"): parts}, c)["s1"]
		si.HoldsIn(&Assignment{Model: "m"}, 7, 3)
		si.Held["m"].Count(7, 0)
	})
}
