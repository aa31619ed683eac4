package loader

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
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
	if err := w.generate(spec, gi); err != nil {
		w.Abort()
		return nil, err
	}
	return w.Commit()
}

// generate writes every partition of a generated model. One pass over
// the ranks sorts their ids by partition into spill files (8 bytes an
// id, in the version's hidden directory, never published); then each
// worker reads one partition's ids back, makes their values and writes
// the partition. So the work is one pass whatever the partition count
// (one pass per partition would cost partitions × params), and a worker
// holds one partition's keys and values at a time.
func (w *VersionWriter) generate(spec GenSpec, gi codec.GenInfo) error {
	spill, err := os.MkdirTemp(w.tmp, ".ids-")
	if err != nil {
		return fmt.Errorf("loader: gen: %w", err)
	}
	defer os.RemoveAll(spill)
	counts, err := spillIDs(spill, spec, gi)
	if err != nil {
		return err
	}
	width := spec.Width()
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for p := range spec.Partitions {
		g.Go(func() error {
			keys, err := readIDs(spillName(spill, p), counts[p])
			if err != nil {
				return err
			}
			vals := make([]float32, 0, len(keys)*width)
			for _, id := range keys {
				vals = append(vals, genValue(spec.Seed, id, 0, 0.5))
				for j := 1; j < width; j++ {
					vals = append(vals, genValue(spec.Seed, id, j, 0.1))
				}
			}
			if spec.Progress != nil {
				spec.Progress(int64(len(keys)))
			}
			return w.WritePartition(p, keys, vals)
		})
	}
	return g.Wait()
}

func spillName(dir string, p uint32) string { return filepath.Join(dir, fmt.Sprintf("%05d", p)) }

// spillIDs writes the ids of the model's ranks, by partition, to one file
// each in dir, and returns how many each holds.
func spillIDs(dir string, spec GenSpec, gi codec.GenInfo) ([]int, error) {
	files := make([]*os.File, spec.Partitions)
	bufs := make([]*bufio.Writer, spec.Partitions)
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	for p := range files {
		f, err := os.Create(spillName(dir, uint32(p)))
		if err != nil {
			return nil, fmt.Errorf("loader: gen: %w", err)
		}
		files[p], bufs[p] = f, bufio.NewWriterSize(f, 8<<10)
	}
	counts := make([]int, spec.Partitions)
	var b [8]byte
	for rank := uint64(0); rank < uint64(spec.Params); rank++ {
		id := GenID(gi, rank)
		p := partition.Of(id, spec.Partitions)
		binary.LittleEndian.PutUint64(b[:], id)
		if _, err := bufs[p].Write(b[:]); err != nil {
			return nil, fmt.Errorf("loader: gen: %w", err)
		}
		counts[p]++
	}
	for p, b := range bufs {
		if err := b.Flush(); err != nil {
			return nil, fmt.Errorf("loader: gen: %w", err)
		}
		if err := files[p].Close(); err != nil {
			return nil, fmt.Errorf("loader: gen: %w", err)
		}
		files[p] = nil
	}
	return counts, nil
}

// readIDs reads back a spill file of n ids.
func readIDs(path string, n int) ([]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loader: gen: %w", err)
	}
	if len(b) != 8*n {
		return nil, fmt.Errorf("loader: gen: %s holds %d bytes, want %d", path, len(b), 8*n)
	}
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return keys, nil
}
