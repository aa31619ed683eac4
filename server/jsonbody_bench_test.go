package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

// rank200Body is a JSON infer body shaped like bench's rank200 workload:
// 200 rows of 100 ids, 400 shared ids, with values.
func rank200Body() []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	var ids, splits []int64
	var vals []float32
	splits = append(splits, 0)
	for range 200 {
		for range 100 {
			ids = append(ids, rng.Int64N(1<<40))
			vals = append(vals, float32(rng.Float64()))
		}
		splits = append(splits, int64(len(ids)))
	}
	shared := make([]int64, 400)
	for i := range shared {
		shared[i] = rng.Int64N(1 << 40)
	}
	body, _ := json.Marshal(map[string]any{"id": "r1", "inputs": []map[string]any{
		{"name": "ids", "datatype": "INT64", "shape": []int{len(ids)}, "data": ids},
		{"name": "values", "datatype": "FP32", "shape": []int{len(vals)}, "data": vals},
		{"name": "row_splits", "datatype": "INT64", "shape": []int{len(splits)}, "data": splits},
		{"name": "shared_ids", "datatype": "INT64", "shape": []int{len(shared)}, "data": shared},
	}})
	return body
}

// BenchmarkDecodeJSONBody compares, on a rank200 body, the decoder the
// front uses (jsontext tokens, limits per element) with encoding/json
// unmarshalling into typed slices (the previous decoder's fast path) and
// with a hand-written scanner that only splits number arrays (no
// validation of the rest: a lower bound for a decoder of our own).
func BenchmarkDecodeJSONBody(b *testing.B) {
	body := rank200Body()
	lim := bodyLimits{maxIDs: 1 << 20, maxRows: 10_000}
	b.Run("jsontext", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := newJSONDecoder(bytes.NewBuffer(body), lim).decode(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		type input struct {
			Name     string          `json:"name"`
			Datatype string          `json:"datatype"`
			Shape    []int64         `json:"shape"`
			Data     json.RawMessage `json:"data"`
		}
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var req struct {
				ID     string  `json:"id"`
				Inputs []input `json:"inputs"`
			}
			if err := json.Unmarshal(body, &req); err != nil {
				b.Fatal(err)
			}
			for _, in := range req.Inputs {
				var err error
				if in.Datatype == "FP32" {
					var v []float32
					err = json.Unmarshal(in.Data, &v)
				} else {
					var v []int64
					err = json.Unmarshal(in.Data, &v)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("hand-scanner", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if n := scanNumbers(body); n != 20000+20000+201+400+4 {
				b.Fatal(fmt.Sprint("scanned ", n, " numbers"))
			}
		}
	})
}

// scanNumbers counts and parses every number in b, knowing nothing of
// JSON's structure: the least work a decoder of our own could do.
func scanNumbers(b []byte) int {
	n := 0
	for i := 0; i < len(b); {
		c := b[i]
		if c == '"' { // skip strings (no escapes in this body)
			i++
			for i < len(b) && b[i] != '"' {
				i++
			}
			i++
			continue
		}
		if c == '-' || (c >= '0' && c <= '9') {
			j := i + 1
			float := false
			for j < len(b) && (b[j] >= '0' && b[j] <= '9' || b[j] == '.' || b[j] == 'e' || b[j] == 'E' || b[j] == '-' || b[j] == '+') {
				float = float || b[j] == '.' || b[j] == 'e' || b[j] == 'E'
				j++
			}
			if float {
				strconv.ParseFloat(string(b[i:j]), 32)
			} else {
				strconv.ParseInt(string(b[i:j]), 10, 64)
			}
			n++
			i = j
			continue
		}
		i++
	}
	return n
}
