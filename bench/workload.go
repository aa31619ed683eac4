package bench

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// Workload is the shape of one predict call.
type Workload struct {
	Name       string
	Rows       int // candidates per request
	PerRow     int // features of each candidate, shared ones included
	Shared     int // features common to every candidate
	ZipfS      float64
	RowIDsOnly bool
}

// Workloads by name.
var Workloads = map[string]Workload{
	// A ranking call: 200 candidates × 500 features, 400 of them the
	// user's and context's, shared by every candidate.
	"rank200": {Name: "rank200", Rows: 200, PerRow: 500, Shared: 400, ZipfS: 1.1},
	// A small call: 100 rows × 39 features (Criteo-like), nothing shared.
	"small": {Name: "small", Rows: 100, PerRow: 39, Shared: 0, ZipfS: 1.1},
}

// Generator draws requests whose ids follow Zipf(s) over a generated
// model's feature ranks, so hot features are hot as in real traffic.
type Generator struct {
	w    Workload
	gen  codec.GenInfo
	zipf *rand.Zipf
	// fields, when positive, is the model's field count: requests carry
	// each feature's field, by model.FieldOf.
	fields int
	// denseInputs, when positive, is the continuous features per row the
	// model takes: requests carry them (input dense).
	denseInputs int
	rng         *rand.Rand
}

// ForModel draws ids from generated model m (its generator settings and
// feature count), with the fields it needs when it is field-aware.
func ForModel(w Workload, m *codec.Manifest, seed uint64) (*Generator, error) {
	if m.Generator == nil {
		return nil, fmt.Errorf("bench: model %s was not made by 'cumulus model gen': no id generator to draw traffic from", m.Name)
	}
	g, err := NewGenerator(w, *m.Generator, m.Params, seed)
	if err == nil && m.FieldAware() {
		g.fields = m.Fields
	}
	if err == nil {
		g.denseInputs = m.DenseInputs
		g.rng = rand.New(rand.NewPCG(seed, 0xde45e))
	}
	return g, err
}

// NewGenerator draws ids from a model generated with gen and params
// features.
func NewGenerator(w Workload, gen codec.GenInfo, params int64, seed uint64) (*Generator, error) {
	if params <= 1 {
		return nil, fmt.Errorf("bench: model must have more than one feature")
	}
	rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
	return &Generator{w: w, gen: gen, zipf: rand.NewZipf(rng, w.ZipfS, 1, uint64(params-1))}, nil
}

func (g *Generator) id() uint64 { return loader.GenID(g.gen, g.zipf.Uint64()) }

// Request builds one KServe request with raw contents.
func (g *Generator) Request(model string) *kservepb.ModelInferRequest {
	w := g.w
	own := w.PerRow - w.Shared
	ids := make([]uint64, 0, w.Rows*own)
	splits := make([]uint64, 0, w.Rows+1)
	splits = append(splits, 0)
	for range w.Rows {
		for range own {
			ids = append(ids, g.id())
		}
		splits = append(splits, uint64(len(ids)))
	}
	req := &kservepb.ModelInferRequest{ModelName: model}
	add := func(name, dt string, b []byte, n int) {
		req.Inputs = append(req.Inputs, &kservepb.ModelInferRequest_InferInputTensor{Name: name, Datatype: dt, Shape: []int64{int64(n)}})
		req.RawInputContents = append(req.RawInputContents, b)
	}
	add("ids", "UINT64", RawUint64(ids), len(ids))
	add("row_splits", "INT64", RawUint64(splits), len(splits))
	if g.fields > 0 {
		add("fields", "INT32", g.rawFields(ids), len(ids))
	}
	if g.denseInputs > 0 {
		dense := make([]float32, w.Rows*g.denseInputs)
		for i := range dense {
			dense[i] = float32(g.rng.NormFloat64())
		}
		add("dense", "FP32", RawFloat32(dense), len(dense))
		req.Inputs[len(req.Inputs)-1].Shape = []int64{int64(w.Rows), int64(g.denseInputs)}
	}
	if w.Shared > 0 {
		shared := make([]uint64, w.Shared)
		for i := range shared {
			shared[i] = g.id()
		}
		add("shared_ids", "UINT64", RawUint64(shared), len(shared))
		if g.fields > 0 {
			add("shared_fields", "INT32", g.rawFields(shared), len(shared))
		}
	}
	return req
}

// rawFields is ids' fields (model.FieldOf) as raw INT32 contents.
func (g *Generator) rawFields(ids []uint64) []byte {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(model.FieldOf(id, g.fields)))
	}
	return b
}

// RawUint64 and RawFloat32 encode tensors as KServe raw contents:
// little-endian, row-major.
func RawUint64(v []uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

// Scores decodes a response's scores, raw or typed.
func Scores(resp *kservepb.ModelInferResponse) ([]float32, error) {
	if len(resp.Outputs) != 1 {
		return nil, fmt.Errorf("bench: %d outputs, want 1", len(resp.Outputs))
	}
	if len(resp.RawOutputContents) == 1 {
		b := resp.RawOutputContents[0]
		out := make([]float32, len(b)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out, nil
	}
	if c := resp.Outputs[0].Contents; c != nil {
		return c.Fp32Contents, nil
	}
	return nil, fmt.Errorf("bench: response has no scores")
}

func RawFloat32(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
