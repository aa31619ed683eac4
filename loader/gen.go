package loader

import (
	"fmt"
	"math"
	"runtime"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/model"
)

// GenSpec describes a synthetic model.
type GenSpec struct {
	Name        string
	model.Shape        // unset fields get model.Shape.GenDefaults
	Params      int64  // number of features
	Partitions  uint32 // default 8
	Encoding    string // factors: fp32 (default), fp16 or int8
	Seed        uint64
	Dense       bool // ids 0..Params-1 instead of hashed 64-bit ids
	// Layers are the hidden layers' widths of a type with a dense part
	// (model.Shape.HasDense); default 256, 128.
	Layers []int
	// Progress, if set, is called with the number of features written
	// since the last call. It is called from several goroutines.
	Progress func(n int64)
}

// GenID is the id of rank r in a generated model (see codec.GenInfo).
func GenID(g codec.GenInfo, r uint64) uint64 {
	if g.IDs == "dense" {
		return r
	}
	return splitmix64(g.Seed + r)
}

// splitmix64 is a bijection on uint64, so distinct ranks give distinct ids.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// genValue is a deterministic value in [-scale, scale) for (id, j).
func genValue(seed, id uint64, j int, scale float32) float32 {
	u := splitmix64(id ^ seed*0x2545f4914f6cdd1d ^ uint64(j)<<56)
	return (float32(u>>40)/float32(1<<24)*2 - 1) * scale
}

// GenDense is a generated dense part: in inputs through hidden layers to
// one output, weights uniform in ±1/√(inputs) (PyTorch's nn.Linear
// initialisation), drawn from seed.
func GenDense(seed uint64, in int, hidden []int) *model.Dense {
	d := &model.Dense{}
	for n, out := range append(slices.Clone(hidden), 1) {
		l := model.Layer{In: in, Out: out, W: make([]float32, in*out), B: make([]float32, out)}
		scale := float32(1 / math.Sqrt(float64(in)))
		for i := range l.W {
			l.W[i] = genValue(seed^0xde45e, uint64(n)<<40|uint64(i), 1, scale)
		}
		for i := range l.B {
			l.B[i] = genValue(seed^0xb1a5, uint64(n)<<40|uint64(i), 2, scale)
		}
		d.Layers = append(d.Layers, l)
		in = out
	}
	return d
}

// Generate writes a synthetic model as the next version of spec.Name.
// Each partition is produced by one pass over all ranks, keeping only its
// own ids, so memory stays at one partition per worker however large the
// model is.
func (r Repo) Generate(spec GenSpec) (*codec.Manifest, error) {
	if spec.Partitions == 0 {
		spec.Partitions = 8
	}
	spec.GenDefaults()
	if spec.Params <= 0 {
		return nil, fmt.Errorf("loader: gen: params must be positive")
	}
	if spec.HasDense() {
		if len(spec.Layers) == 0 {
			spec.Layers = []int{256, 128}
		}
		if err := spec.Shape.Validate(); err != nil {
			return nil, fmt.Errorf("loader: gen: %w", err)
		}
		if err := model.CheckLayers(spec.DenseIn(), spec.Layers); err != nil {
			return nil, fmt.Errorf("loader: gen: %w", err)
		}
	}
	gi := codec.GenInfo{Seed: spec.Seed, IDs: "hashed"}
	if spec.Dense {
		gi.IDs = "dense"
	}
	w, err := r.NewVersion(Spec{
		Name: spec.Name, Shape: spec.Shape, Bias: -1.5, Partitions: spec.Partitions, Encoding: spec.Encoding,
		Source:    fmt.Sprintf("cumulus model gen --type %s --params %d --seed %d --ids %s (%s)", spec.Type, spec.Params, spec.Seed, gi.IDs, spec.Shape),
		Generator: &gi,
	})
	if err != nil {
		return nil, err
	}
	if spec.HasDense() {
		if err := w.WriteDense(GenDense(spec.Seed, spec.DenseIn(), spec.Layers)); err != nil {
			w.Abort()
			return nil, err
		}
	}
	width := spec.Width()
	expect := spec.Params/int64(spec.Partitions) + spec.Params/int64(spec.Partitions)/16 + 16
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for p := range spec.Partitions {
		g.Go(func() error {
			keys := make([]uint64, 0, expect)
			vals := make([]float32, 0, expect*int64(width))
			var reported int64
			for rank := uint64(0); rank < uint64(spec.Params); rank++ {
				id := GenID(gi, rank)
				if partition.Of(id, spec.Partitions) != p {
					continue
				}
				keys = append(keys, id)
				vals = append(vals, genValue(spec.Seed, id, 0, 0.5))
				for j := 1; j < width; j++ {
					vals = append(vals, genValue(spec.Seed, id, j, 0.1))
				}
				if spec.Progress != nil && len(keys)%65536 == 0 {
					spec.Progress(65536)
					reported += 65536
				}
			}
			if spec.Progress != nil {
				spec.Progress(int64(len(keys)) - reported)
			}
			return w.WritePartition(p, keys, vals)
		})
	}
	if err := g.Wait(); err != nil {
		w.Abort()
		return nil, err
	}
	return w.Commit()
}
