package router

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/model"
)

// FuzzBuildTable: whatever a serving map record and a shard's report
// say, a router builds a table without panicking, and routes a version
// only when every partition has a replica the map assigns and whose
// report carries the identity the map expects.
func FuzzBuildTable(f *testing.F) {
	good := topo.Assignment{Schema: 1, Model: "m", Seq: 3, Live: 2, Standby: []uint64{1}, Partitions: 2,
		Replicas: [][]string{{"s0"}, {"s0", "s1"}},
		Versions: []topo.VersionInfo{{Version: 2, Shape: model.Shape{Type: "lr"}, IDs: []string{"a", "b"}, Chain: []uint64{2}},
			{Version: 1, Shape: model.Shape{Type: "fm", Dim: 4}, IDs: []string{"c", "d"}, Chain: []uint64{1}}}}
	shard := topo.ShardInfo{Schema: 1, ID: "s0", Addr: "x:1", Applied: map[string]uint64{"m": 3},
		Loaded: []topo.Loaded{{Model: "m", Version: 2, Have: []uint32{0, 1}, IDs: []string{"a", "b"}}}}
	a, _ := json.Marshal(good)
	s, _ := json.Marshal(shard)
	f.Add(a, s)
	f.Add([]byte(`{"schema":1,"model":"m","live":1,"partitions":3,"replicas":[["s0"]],"versions":[]}`), s)
	f.Add([]byte(`{"schema":1,"model":"m","live":1,"partitions":1,"replicas":[["s0"]],"versions":[{"version":1,"type":"lr","dim":-5,"ids":["a"]}]}`),
		[]byte(`{"schema":1,"id":"s0","addr":"x:1","loaded":[{"model":"m","version":1,"have":[4294967295,0],"ids":["a"]}]}`))
	staged := good
	staged.Live, staged.Staged, staged.Canary, staged.CanaryFraction = 1, 2, 0, 0
	a2, _ := json.Marshal(staged)
	f.Add(a2, s)
	f.Add([]byte(`{"schema":2}`), []byte(`{"schema":1,"loaded":[{"have":[0,0,0],"ids":[]}]}`))
	f.Fuzz(func(t *testing.T, assign, report []byte) {
		c := topo.DefaultCluster
		as := topo.Assignments(map[string][]byte{c.ModelKey("m"): assign}, c)
		shards := topo.Shards(map[string][]byte{c.ShardKey("s0"): report}, c)
		backends := map[string]*backend{}
		for _, si := range shards {
			backends[si.Addr] = &backend{id: si.ID, addr: si.Addr}
		}
		tab := buildTable(shards, as, backends, newDenseCache(), false)
		for name, mr := range tab.models {
			a := as[name]
			if mr.canary != nil && (a.Canary == 0 || mr.canary.version != a.Canary) {
				t.Fatalf("canary %d routed; the map names %d", mr.canary.version, a.Canary)
			}
			for v, vr := range mr.versions {
				if v != a.Live && v != a.Canary && !slices.Contains(a.Standby, v) {
					t.Fatalf("version %d routed to users: live %d, canary %d, standby %v (staged %d)", v, a.Live, a.Canary, a.Standby, a.Staged)
				}
				info := a.Info(v)
				if info == nil || len(vr.replicas) != int(a.Partitions) || vr.partitions != a.Partitions {
					t.Fatalf("version %d routed with %d replica lists for %d partitions (info %v)", v, len(vr.replicas), a.Partitions, info)
				}
				for p, reps := range vr.replicas {
					if len(reps) == 0 {
						t.Fatalf("version %d routed with no replica for partition %d", v, p)
					}
					for _, b := range reps {
						if !shards["s0"].Holds(name, v, uint32(p), info.IDs[p]) || b.id != shards["s0"].ID {
							t.Fatalf("partition %d of version %d routed to a shard not reporting its content", p, v)
						}
					}
				}
			}
		}
	})
}
