package topo

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/model"
)

func digestIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		d := sha256.Sum256([]byte(fmt.Sprint(i)))
		out[i] = hex.EncodeToString(d[:])
	}
	return out
}

// TestVersionInfoForms: identities that are SHA-256 hex are stored as
// digests and chains as runs, and read back the same; other identities
// stay a list; schema 1's lists are read too.
func TestVersionInfoForms(t *testing.T) {
	chain := []uint64{900}
	for v := uint64(899); v >= 700; v-- {
		chain = append(chain, v)
	}
	chain = append(chain, 650, 640, 639, 1)
	for _, in := range []VersionInfo{
		{Version: 900, Shape: model.Shape{Type: "fm", Dim: 8}, Bias: 0.5, Hash: "h", IDs: digestIDs(64), Chain: chain},
		{Version: 3, Shape: model.Shape{Type: "lr"}, IDs: []string{"a", "b"}, Chain: []uint64{3}},
		{Version: 4, Shape: model.Shape{Type: "lr"}, IDs: append(digestIDs(1), strings.ToUpper(digestIDs(1)[0])), Chain: []uint64{4, 2}},
	} {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var out VersionInfo
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if !slices.Equal(out.IDs, in.IDs) || !slices.Equal(out.Chain, in.Chain) || out.Version != in.Version || out.Dim != in.Dim || out.Bias != in.Bias {
			t.Fatalf("round trip of %+v gave %+v", in, out)
		}
	}
	b, _ := json.Marshal(VersionInfo{Version: 900, IDs: digestIDs(64), Chain: chain})
	if n := len(b); n > 64*44+200 || !strings.Contains(string(b), `"runs":[[900,700],[650,650],[640,639],[1,1]]`) {
		t.Fatalf("compact form (%d bytes): %s", n, b)
	}
	var old VersionInfo
	if err := json.Unmarshal([]byte(`{"version":2,"type":"lr","dim":0,"bias":0,"hash":"h","ids":["x","y"],"chain":[2,1]}`), &old); err != nil ||
		!slices.Equal(old.IDs, []string{"x", "y"}) || !slices.Equal(old.Chain, []uint64{2, 1}) {
		t.Fatalf("schema 1 form: %+v %v", old, err)
	}
	for _, bad := range []string{
		`{"ids":["x"],"digests":"AAAA"}`,
		`{"chain":[1],"runs":[[1,1]]}`,
		`{"runs":[[1,2]]}`,
		`{"runs":[[5,3],[4,1]]}`,
		`{"runs":[[18446744073709551615,0]]}`,
		`{"runs":[[70000,1]]}`,
		`{"digests":"AAAA"}`,
		`{"digests":"!!"}`,
	} {
		var v VersionInfo
		if err := json.Unmarshal([]byte(bad), &v); err == nil {
			t.Errorf("%s accepted: %+v", bad, v)
		}
	}
}

// A record names the oldest reader that may act on it: this build reads
// schemas 1 to Schema and refuses newer ones.
func TestSchemaRule(t *testing.T) {
	for schema := 1; schema <= Schema; schema++ {
		if _, err := Decode[ShardInfo]("k", []byte(fmt.Sprintf(`{"schema":%d,"id":"a","future":1}`, schema))); err != nil {
			t.Fatalf("schema %d: %v", schema, err)
		}
	}
	for _, bad := range []string{`{"schema":0}`, `{}`, fmt.Sprintf(`{"schema":%d}`, Schema+1)} {
		if _, err := Decode[ShardInfo]("k", []byte(bad)); err == nil {
			t.Fatalf("%s accepted", bad)
		}
	}
}

// FuzzVersionInfo: any value either fails to decode or decodes to a chain
// and identities within bounds that encode and decode back the same.
func FuzzVersionInfo(f *testing.F) {
	b, _ := json.Marshal(VersionInfo{Version: 9, IDs: digestIDs(3), Chain: []uint64{9, 8, 7, 2}})
	f.Add(b)
	f.Add([]byte(`{"version":2,"ids":["x"],"chain":[2,1]}`))
	f.Add([]byte(`{"runs":[[3,1],[0,0]],"digests":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var v VersionInfo
		if json.Unmarshal(b, &v) != nil {
			return
		}
		if len(v.Chain) > MaxChainLen || len(v.IDs) > MaxPartitions {
			t.Fatalf("decoded beyond the bounds: chain %d, ids %d", len(v.Chain), len(v.IDs))
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var w VersionInfo
		if err := json.Unmarshal(again, &w); err != nil || !slices.Equal(w.IDs, v.IDs) || !slices.Equal(w.Chain, v.Chain) {
			t.Fatalf("%s → %s → %+v, %v", b, again, w, err)
		}
	})
}
