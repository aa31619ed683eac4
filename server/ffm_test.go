package server_test

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// fieldRequest is one request to a field-aware model, in both fronts'
// terms.
type fieldRequest struct {
	ids, splits, fields, shared, sharedFields []int64
	uint64Fields                              bool // send an empty UINT64 fields input
}

func (r fieldRequest) json() string {
	in := []map[string]any{
		{"name": "ids", "datatype": "INT64", "shape": []int{len(r.ids)}, "data": r.ids},
		{"name": "row_splits", "datatype": "INT64", "shape": []int{len(r.splits)}, "data": r.splits},
	}
	if r.fields != nil {
		in = append(in, map[string]any{"name": "fields", "datatype": "INT32", "shape": []int{len(r.fields)}, "data": r.fields})
	}
	if r.uint64Fields {
		in = append(in, map[string]any{"name": "fields", "datatype": "UINT64", "shape": []int{0}, "data": []int{}})
	}
	if r.shared != nil {
		in = append(in, map[string]any{"name": "shared_ids", "datatype": "INT64", "shape": []int{len(r.shared)}, "data": r.shared})
	}
	if r.sharedFields != nil {
		in = append(in, map[string]any{"name": "shared_fields", "datatype": "INT32", "shape": []int{len(r.sharedFields)}, "data": r.sharedFields})
	}
	b, _ := json.Marshal(map[string]any{"inputs": in})
	return string(b)
}

func (r fieldRequest) grpc(name string) *kservepb.ModelInferRequest {
	req := &kservepb.ModelInferRequest{ModelName: name}
	add := func(n string, v []int64) {
		if v != nil {
			req.Inputs = append(req.Inputs, &kservepb.ModelInferRequest_InferInputTensor{Name: n, Datatype: "INT64",
				Shape: []int64{int64(len(v))}, Contents: &kservepb.InferTensorContents{Int64Contents: v}})
		}
	}
	add("ids", r.ids)
	add("row_splits", r.splits)
	add("fields", r.fields)
	if r.uint64Fields {
		req.Inputs = append(req.Inputs, &kservepb.ModelInferRequest_InferInputTensor{Name: "fields", Datatype: "UINT64",
			Shape: []int64{0}, Contents: &kservepb.InferTensorContents{Uint64Contents: []uint64{}}})
	}
	add("shared_ids", r.shared)
	add("shared_fields", r.sharedFields)
	return req
}

// want is each row's reference score.
func (r fieldRequest) want(ref *reference.Model) []float64 {
	var out []float64
	for i := 0; i+1 < len(r.splits); i++ {
		var row model.Row
		for j := r.splits[i]; j < r.splits[i+1]; j++ {
			row.IDs, row.Xs, row.Fields = append(row.IDs, uint64(r.ids[j])), append(row.Xs, 1), append(row.Fields, int32(r.fields[j]))
		}
		for j, id := range r.shared {
			row.IDs, row.Xs, row.Fields = append(row.IDs, uint64(id)), append(row.Xs, 1), append(row.Fields, int32(r.sharedFields[j]))
		}
		out = append(out, ref.ScoreRow(row))
	}
	return out
}

// TestFFMThroughFronts: an FFM model's scores through the HTTP and gRPC
// fronts equal the pairwise reference, shared features included; its
// inputs are checked and listed; other types take fields and ignore
// them.
func TestFFMThroughFronts(t *testing.T) {
	dir := t.TempDir()
	shape := model.Shape{Type: model.FFM, Fields: 6, Dim: 3, MaxRowFeatures: 40}
	rng := rand.New(rand.NewPCG(7, 7))
	m := &loader.Sparse{Shape: shape, Bias: -0.3}
	for id := range uint64(500) {
		m.Keys = append(m.Keys, id)
		for range shape.Width() {
			m.Values = append(m.Values, float32(rng.NormFloat64()*0.2))
		}
	}
	repo := loader.Repo{Dir: dir}
	if _, err := repo.Publish("ffm", m, 3, "test"); err != nil {
		t.Fatal(err)
	}
	lr := &loader.Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{1, 2, 3}, Values: []float32{0.5, -1, 2}}
	if _, err := repo.Publish("lr", lr, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: dir, Shards: 2, ScanInterval: time.Hour})
	s, client := serve(t, server.Options{Predictor: c.Router})
	ref := reference.New(m)

	var req fieldRequest
	req.splits = []int64{0}
	for range 60 {
		for range rng.IntN(40) {
			req.ids = append(req.ids, rng.Int64N(600)) // some absent
			req.fields = append(req.fields, rng.Int64N(6))
		}
		req.splits = append(req.splits, int64(len(req.ids)))
	}
	for range 30 {
		req.shared = append(req.shared, rng.Int64N(600))
		req.sharedFields = append(req.sharedFields, rng.Int64N(6))
	}
	want := req.want(ref)
	check := func(how string, got []float32) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d scores for %d rows", how, len(got), len(want))
		}
		for r := range got {
			if d := math.Abs(float64(got[r]) - want[r]); !(d <= 1e-5) {
				t.Fatalf("%s: row %d scores %v, reference %v", how, r, got[r], want[r])
			}
		}
	}
	code, body := post(t, s, "/v2/models/ffm/infer", req.json())
	if code != 200 {
		t.Fatalf("http: %d %s", code, body)
	}
	check("http", scoresOf(t, body))
	resp, err := client.ModelInfer(context.Background(), req.grpc("ffm"))
	if err != nil {
		t.Fatal(err)
	}
	check("grpc", resp.Outputs[0].Contents.Fp32Contents)

	// Bad fields are refused, naming the problem.
	for _, bad := range []struct {
		name string
		edit func(r *fieldRequest)
		want string
	}{
		{"no fields", func(r *fieldRequest) { r.fields = nil }, `missing input \"fields\"`},
		{"no shared fields", func(r *fieldRequest) { r.sharedFields = nil }, `missing input \"shared_fields\"`},
		{"field too large", func(r *fieldRequest) { r.fields[3] = 6 }, "fields[3] = 6 is outside 0..5"},
		{"negative field", func(r *fieldRequest) { r.sharedFields[1] = -2 }, "shared_fields[1] = -2 is not a field number"},
		{"short fields", func(r *fieldRequest) { r.fields = r.fields[1:] }, "fields for"},
		{"no ids, uint64 fields", func(r *fieldRequest) {
			r.ids, r.fields, r.splits, r.sharedFields, r.shared = []int64{}, nil, []int64{0, 0}, nil, nil
			r.uint64Fields = true
		}, "datatype UINT64, want INT32 or INT64"},
		{"row too long", func(r *fieldRequest) {
			r.ids, r.fields, r.splits = make([]int64, 41), make([]int64, 41), []int64{0, 41}
		}, "row 0 has 41 features; this ffm version takes at most 40"},
	} {
		b := req
		b.ids, b.fields, b.sharedFields, b.splits = append([]int64{}, req.ids...), append([]int64{}, req.fields...), append([]int64{}, req.sharedFields...), append([]int64{}, req.splits...)
		bad.edit(&b)
		code, body := post(t, s, "/v2/models/ffm/infer", b.json())
		if code != 400 || !strings.Contains(body, bad.want) {
			t.Errorf("http %s: %d %s, want 400 saying %s", bad.name, code, body, bad.want)
		}
		_, err := client.ModelInfer(context.Background(), b.grpc("ffm"))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), strings.ReplaceAll(bad.want, `\"`, `"`)) {
			t.Errorf("grpc %s: %v, want InvalidArgument saying %s", bad.name, err, bad.want)
		}
	}

	// Metadata lists the inputs each type takes.
	_, body = get(t, s, "/v2/models/ffm")
	if !strings.Contains(body, `"platform":"cumulus_ffm"`) || !strings.Contains(body, `"name":"fields"`) || !strings.Contains(body, `"name":"shared_fields"`) {
		t.Errorf("ffm metadata: %s", body)
	}
	_, body = get(t, s, "/v2/models/lr")
	if strings.Contains(body, `"fields"`) {
		t.Errorf("lr metadata lists fields: %s", body)
	}

	// LR takes fields, even out of any range, and ignores them.
	lrReq := fieldRequest{ids: []int64{1, 2, 3}, splits: []int64{0, 2, 3}, fields: []int64{0, 7, 99}}
	code, body = post(t, s, "/v2/models/lr/infer", lrReq.json())
	if code != 200 {
		t.Fatalf("lr with fields: %d %s", code, body)
	}
	got := scoresOf(t, body)
	for r, z := range []float64{0.5 - 1, 2} {
		if want := 1 / (1 + math.Exp(-z)); math.Abs(float64(got[r])-want) > 1e-6 {
			t.Errorf("lr row %d: %v, want %v", r, got[r], want)
		}
	}
}
