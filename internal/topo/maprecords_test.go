package topo

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/model"
)

// mapKV is the records of one model: a full version 5, a delta 6 on it
// touching partition 2, and a delta 7 on 6 touching partition 0; 7 live,
// 5 and 6 standby.
func mapKV(t testing.TB) (map[string][]byte, [][]string) {
	c := DefaultCluster
	ids5 := digestIDs(4)
	ids6 := slices.Clone(ids5)
	ids6[2] = digestIDs(9)[8]
	ids7 := slices.Clone(ids6)
	ids7[0] = digestIDs(10)[9]
	shape := model.Shape{Type: model.LR}
	put := func(kv map[string][]byte, key string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		kv[key] = b
	}
	kv := map[string][]byte{}
	put(kv, c.VersionKey("m", 5), NewVersionRecord("m", VersionInfo{Version: 5, Shape: shape, Hash: "h", IDs: ids5, Chain: []uint64{5}}, 0, nil))
	put(kv, c.VersionKey("m", 6), NewVersionRecord("m", VersionInfo{Version: 6, Shape: shape, Hash: "h", IDs: ids6, Chain: []uint64{6, 5}}, 5, ids5))
	put(kv, c.VersionKey("m", 7), NewVersionRecord("m", VersionInfo{Version: 7, Shape: shape, Hash: "h", IDs: ids7, Chain: []uint64{7, 6, 5}}, 6, ids6))
	put(kv, c.PlacementKey("m"), NewPlacement("m", 3, [][]string{{"a", "b"}, {"b", "c"}, {"c", "a"}, {"a", "b"}}))
	put(kv, c.ModelKey("m"), ModelHead{Schema: AssignmentSchema, Model: "m", Seq: 9, Live: 7, Standby: []uint64{6, 5}, Partitions: 4, PlaceSeq: 3})
	return kv, [][]string{ids5, ids6, ids7}
}

// TestMapRecords: a head, a placement and version records based on one
// another assemble to the whole map; a delta's record lists only what it
// changed; what changes is decoded again, and only that.
func TestMapRecords(t *testing.T) {
	kv, ids := mapKV(t)
	var rec VersionRecord
	if err := json.Unmarshal(kv[DefaultCluster.VersionKey("m", 7)], &rec); err != nil || rec.Base != 6 || !slices.Equal(rec.Changed, []uint32{0}) {
		t.Fatalf("delta 7's record: base %d, changed %v (%v); want base 6, changed [0]", rec.Base, rec.Changed, err)
	}
	r := NewMapReader(DefaultCluster)
	a, ok := r.Assignments(kv)["m"]
	if !ok {
		t.Fatal("no map assembled")
	}
	if a.Live != 7 || a.Seq != 9 || a.PlaceSeq != 3 || !slices.Equal(a.Replicas[1], []string{"b", "c"}) {
		t.Fatalf("assembled %+v", a)
	}
	for i, v := range []uint64{5, 6, 7} {
		if info := a.Info(v); info == nil || !slices.Equal(info.IDs, ids[i]) {
			t.Errorf("version %d: identities %v, want %v", v, info, ids[i])
		}
	}
	// A new head alone: the version records are not decoded again.
	cached := r.cache[DefaultCluster.VersionKey("m", 7)].val
	kv[DefaultCluster.ModelKey("m")] = []byte(`{"schema":4,"model":"m","seq":10,"live":6,"standby":[7,5],"partitions":4,"place_seq":3}`)
	if a := r.Assignments(kv)["m"]; a.Live != 6 || a.Seq != 10 {
		t.Fatalf("after a rollback: %+v", a)
	}
	if r.cache[DefaultCluster.VersionKey("m", 7)].val != cached {
		t.Error("an unchanged version record was decoded again")
	}
	// A schema 2 record, whole, is still read.
	old, _ := json.Marshal(Assignment{Schema: 2, Model: "o", Seq: 1, Live: 5, Partitions: 4, Replicas: a.Replicas, Versions: []VersionInfo{*a.Info(5)}})
	kv[DefaultCluster.ModelKey("o")] = old
	if o, ok := r.Assignments(kv)["o"]; !ok || o.Live != 5 || len(o.Info(5).IDs) != 4 {
		t.Fatalf("a schema 2 record: %+v, %v", o, ok)
	}
}

// TestMapRecordsRefused: records that cannot describe the map the head
// names leave the model out, saying why; the other models stay.
func TestMapRecordsRefused(t *testing.T) {
	cases := map[string]func(kv map[string][]byte){
		"a base missing":      func(kv map[string][]byte) { delete(kv, DefaultCluster.VersionKey("m", 6)) },
		"a kept version gone": func(kv map[string][]byte) { delete(kv, DefaultCluster.VersionKey("m", 7)) },
		"no placement":        func(kv map[string][]byte) { delete(kv, DefaultCluster.PlacementKey("m")) },
		"placement too short": func(kv map[string][]byte) {
			b, _ := json.Marshal(NewPlacement("m", 3, [][]string{{"a"}}))
			kv[DefaultCluster.PlacementKey("m")] = b
		},
		"shard index out of range": func(kv map[string][]byte) {
			kv[DefaultCluster.PlacementKey("m")] = []byte(`{"schema":4,"model":"m","seq":3,"shards":["a"],"replicas":[[0],[0],[0],[7]]}`)
		},
		"changed out of range": func(kv map[string][]byte) { editRecord(kv, 7, func(r *VersionRecord) { r.Changed = []uint32{9} }) },
		"changed descending": func(kv map[string][]byte) {
			editRecord(kv, 7, func(r *VersionRecord) { r.Changed, r.Info.IDs = []uint32{1, 0}, append(r.Info.IDs, r.Info.IDs[0]) })
		},
		"base above":          func(kv map[string][]byte) { editRecord(kv, 6, func(r *VersionRecord) { r.Base = 7 }) },
		"changed, no ids":     func(kv map[string][]byte) { editRecord(kv, 7, func(r *VersionRecord) { r.Info.IDs = nil }) },
		"full, too few ids":   func(kv map[string][]byte) { editRecord(kv, 5, func(r *VersionRecord) { r.Info.IDs = r.Info.IDs[:3] }) },
		"filed under another": func(kv map[string][]byte) { editRecord(kv, 6, func(r *VersionRecord) { r.Info.Version = 8 }) },
		"newer schema": func(kv map[string][]byte) {
			kv[DefaultCluster.ModelKey("m")] = []byte(`{"schema":99,"model":"m"}`)
		},
		"not json":    func(kv map[string][]byte) { kv[DefaultCluster.PlacementKey("m")] = []byte("{") },
		"other model": func(kv map[string][]byte) { editRecord(kv, 5, func(r *VersionRecord) { r.Model = "x" }) },
	}
	for name, edit := range cases {
		kv, _ := mapKV(t)
		good, _ := mapKV(t)
		for k, v := range good {
			kv[strings.Replace(k, "/models/m", "/models/g", 1)] = []byte(strings.ReplaceAll(string(v), `"model":"m"`, `"model":"g"`))
		}
		edit(kv)
		as := NewMapReader(DefaultCluster).Assignments(kv)
		if _, ok := as["m"]; ok {
			t.Errorf("%s: the model was assembled", name)
		}
		if _, ok := as["g"]; !ok {
			t.Errorf("%s: the other model was left out too", name)
		}
	}
}

func editRecord(kv map[string][]byte, v uint64, edit func(*VersionRecord)) {
	key := DefaultCluster.VersionKey("m", v)
	var r VersionRecord
	json.Unmarshal(kv[key], &r)
	edit(&r)
	kv[key], _ = json.Marshal(r)
}

// FuzzMapRecords: no record makes a reader panic, and what it assembles
// passes Check.
func FuzzMapRecords(f *testing.F) {
	kv, _ := mapKV(f)
	c := DefaultCluster
	f.Add(kv[c.ModelKey("m")], kv[c.PlacementKey("m")], kv[c.VersionKey("m", 5)], kv[c.VersionKey("m", 6)], kv[c.VersionKey("m", 7)])
	f.Fuzz(func(t *testing.T, head, place, v5, v6, v7 []byte) {
		kv := map[string][]byte{c.ModelKey("m"): head, c.PlacementKey("m"): place,
			c.VersionKey("m", 5): v5, c.VersionKey("m", 6): v6, c.VersionKey("m", 7): v7}
		r := NewMapReader(c)
		for range 2 { // the second from the cache
			for _, a := range r.Assignments(kv) {
				if err := a.Check(); err != nil {
					t.Fatalf("assembled a map that fails Check: %v", err)
				}
			}
		}
	})
}
