package manager

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/model"
)

// FuzzShardReports: whatever a shard reports, Decide neither panics nor
// publishes a map the routers would refuse, and never counts a report as
// holding content it does not name.
func FuzzShardReports(f *testing.F) {
	si, _ := json.Marshal(topo.ShardInfo{Schema: 1, ID: "s0", Addr: "x:1", Applied: map[string]uint64{"m": 1},
		Loaded: []topo.Loaded{{Model: "m", Version: 1, Have: []uint32{0, 1}, IDs: []string{"i0", "i1"}}}})
	f.Add(si)
	f.Add([]byte(`{"schema":1,"id":"s0","applied":{"m":18446744073709551615},"loaded":[{"model":"m","version":1,"have":[1,1,0,4294967295],"ids":["i1"]}]}`))
	f.Add([]byte(`{"schema":1,"id":"s0","mismatched":[{"model":"m","version":1,"have":[7],"ids":[]}]}`))
	f.Fuzz(func(t *testing.T, report []byte) {
		s := &State{Models: map[string]*ModelState{"m": {Schema: 1, Name: "m", Partitions: 2, Live: 1, Seq: 1,
			Replicas: [][]string{{"s0"}, {"s0"}},
			Versions: []Version{{Version: 1, Kind: "full", Phase: PhaseLive, Info: &topo.VersionInfo{Version: 1, Shape: model.Shape{Type: "lr"}, IDs: []string{"i0", "i1"}}},
				{Version: 2, Kind: "full", Phase: PhaseReady, Info: &topo.VersionInfo{Version: 2, Shape: model.Shape{Type: "lr"}, IDs: []string{"j0", "j1"}}}}}}}
		shards := topo.Shards(map[string][]byte{topo.DefaultCluster.ShardKey("s0"): report}, topo.DefaultCluster)
		next, _, _ := Decide(s, ShardsChanged{Shards: shards}, Policy{Replicas: 1, KeepVersions: 2, KeepDeltas: 20})
		m := next.Models["m"]
		a := m.Assignment()
		if err := a.Check(); err != nil {
			t.Fatalf("published map fails its own check: %v", err)
		}
		if m.Live == 2 {
			for p := range 2 {
				if !shards["s0"].Holds("m", 2, uint32(p), fmtID(p)) {
					t.Fatalf("committed version 2 without a report holding partition %d", p)
				}
			}
		}
	})
}

func fmtID(p int) string { return []string{"j0", "j1"}[p] }

// FuzzAdminBody: a request body is decoded or refused with a reason;
// nothing else.
func FuzzAdminBody(f *testing.F) {
	for _, b := range []string{`{"version": 2}`, `{"version": 2}}`, `{"to": 1} x`, ``, `{"version": -1}`, `{"version": 1e400}`, `[`, "{\"version\":\u00002}"} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r, _ := http.NewRequest(http.MethodPut, "/", strings.NewReader(body))
		var v struct {
			Version *uint64 `json:"version"`
		}
		err := readBody(r, &v, false)
		if err == nil && strings.TrimSpace(body) == "" {
			t.Fatal("an empty body accepted where one is required")
		}
		if err == nil && !json.Valid([]byte(body)) {
			t.Fatalf("accepted a body that is not one JSON document: %q", body)
		}
	})
}
