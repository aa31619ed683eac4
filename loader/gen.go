package loader

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"unsafe"

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
	// ValueSeed, if set, draws the values from it instead of Seed: the
	// same features with other values, as a model's next full version.
	ValueSeed uint64
	Dense     bool // ids 0..Params-1 instead of hashed 64-bit ids
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
		Source:    fmt.Sprintf("cumulus model gen --type %s --params %d --seed %d --value-seed %d --ids %s (%s)", spec.Type, spec.Params, spec.Seed, cmp.Or(spec.ValueSeed, spec.Seed), gi.IDs, spec.Shape),
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
// the ranks sorts their ids by partition (a spill: in memory up to
// spillBudget ids, then in runs appended to one file in the version's
// hidden directory, never published); then each worker takes one
// partition's ids, makes their values and writes the partition. So the
// work is one pass whatever the partition count (one pass per partition
// would cost partitions × params), and a worker holds one partition's
// keys and values at a time, beside the spill's bounded buffer.
func (w *VersionWriter) generate(spec GenSpec, gi codec.GenInfo) error {
	sp := newSpill(w.tmp, spec.Partitions, spillBudget)
	defer sp.close()
	for rank := uint64(0); rank < uint64(spec.Params); rank++ {
		id := GenID(gi, rank)
		if err := sp.add(partition.Of(id, spec.Partitions), id); err != nil {
			return err
		}
	}
	width := spec.Width()
	vseed := cmp.Or(spec.ValueSeed, spec.Seed)
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for p := range spec.Partitions {
		g.Go(func() error {
			keys, err := sp.ids(p)
			if err != nil {
				return err
			}
			vals := make([]float32, 0, len(keys)*width)
			for _, id := range keys {
				vals = append(vals, genValue(vseed, id, 0, 0.5))
				for j := 1; j < width; j++ {
					vals = append(vals, genValue(vseed, id, j, 0.1))
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

// spillBudget is how many ids a spill buffers in memory (32 MiB).
const spillBudget = 4 << 20

// spill sorts ids by partition within bounded memory: ids are buffered
// per partition, and when the buffers hold spillBudget ids they are
// appended to one temporary file, partition after partition, each run
// remembered as an extent. The file is the process's own, read back by
// it alone: ids are written in memory order, not encoded.
type spill struct {
	dir     string
	budget  int      // ids buffered before a flush
	f       *os.File // created at the first flush
	off     int64
	n       int          // ids buffered
	buckets [][]uint64   // per partition, buffered
	extents [][][2]int64 // per partition: (offset, ids) runs in f
}

func newSpill(dir string, parts uint32, budget int) *spill {
	return &spill{dir: dir, budget: budget, buckets: make([][]uint64, parts), extents: make([][][2]int64, parts)}
}

func (s *spill) add(p uint32, id uint64) error {
	s.buckets[p] = append(s.buckets[p], id)
	if s.n++; s.n >= s.budget {
		return s.flush()
	}
	return nil
}

func (s *spill) flush() error {
	if s.f == nil {
		f, err := os.CreateTemp(s.dir, ".ids-")
		if err != nil {
			return fmt.Errorf("loader: gen: %w", err)
		}
		s.f = f
	}
	for p, b := range s.buckets {
		if len(b) == 0 {
			continue
		}
		if _, err := s.f.WriteAt(idBytes(b), s.off); err != nil {
			return fmt.Errorf("loader: gen: spilling ids: %w", err)
		}
		s.extents[p] = append(s.extents[p], [2]int64{s.off, int64(len(b))})
		s.off += int64(8 * len(b))
		s.buckets[p] = nil // the next run's buffers grow again; the total stays within the budget
	}
	s.n = 0
	return nil
}

// ids returns partition p's ids, in the order added. Safe for
// concurrent calls for different partitions once adding is over.
func (s *spill) ids(p uint32) ([]uint64, error) {
	n := len(s.buckets[p])
	for _, e := range s.extents[p] {
		n += int(e[1])
	}
	out := make([]uint64, n)
	at := 0
	for _, e := range s.extents[p] {
		if _, err := s.f.ReadAt(idBytes(out[at:at+int(e[1])]), e[0]); err != nil {
			return nil, fmt.Errorf("loader: gen: reading spilled ids: %w", err)
		}
		at += int(e[1])
	}
	copy(out[at:], s.buckets[p])
	s.buckets[p] = nil
	return out, nil
}

func (s *spill) close() {
	if s.f != nil {
		s.f.Close()
		os.Remove(s.f.Name())
	}
}

// idBytes is ids' memory as bytes.
func idBytes(ids []uint64) []byte {
	if len(ids) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 8*len(ids))
}

// CheckGenDeltas checks GenerateDeltas's counts against a model of
// params features, before anything is written.
func CheckGenDeltas(n, keys int, params int64) error {
	switch {
	case n < 0 || n > MaxChain:
		return fmt.Errorf("loader: gen: %d deltas; a chain holds 0 to %d", n, MaxChain)
	case n > 0 && (keys <= 0 || int64(keys) > params):
		return fmt.Errorf("loader: gen: each delta changes %d features; want 1 to %d (the model's)", keys, params)
	}
	return nil
}

// GenerateDeltas publishes n deltas on a generated model's newest
// version, each a delta on the one before, of keys upserts: ids of the
// model drawn uniformly from its ranks (so traffic finds them), new values
// drawn from seed. It is how benchmarks make a model with a long chain.
func (r Repo) GenerateDeltas(name string, n, keys int, seed uint64) ([]*codec.Manifest, error) {
	v, err := r.Latest(name)
	if err != nil {
		return nil, err
	}
	chain, err := r.Chain(name, v)
	if err != nil {
		return nil, err
	}
	base := chain[len(chain)-1]
	if base.Generator == nil {
		return nil, fmt.Errorf("loader: gen: model %s was not made by 'cumulus model gen'", name)
	}
	if err := CheckGenDeltas(n, keys, base.Params); err != nil {
		return nil, err
	}
	if r.Manifests == nil {
		r.Manifests = NewManifestCache() // each delta reads its chain again
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var out []*codec.Manifest
	for i := range n {
		up := &Sparse{Shape: base.Shape}
		seen := map[uint64]bool{}
		for len(up.Keys) < keys {
			id := GenID(*base.Generator, rng.Uint64N(uint64(base.Params)))
			if seen[id] {
				continue
			}
			seen[id] = true
			up.Keys = append(up.Keys, id)
			for j := range up.Width() {
				up.Values = append(up.Values, genValue(seed+uint64(i)+1, id, j, 0.1))
			}
		}
		m, err := r.PublishDelta(name, Delta{Upserts: up, Parent: v, Pack: true,
			Source: fmt.Sprintf("cumulus model gen --deltas: delta %d of %d, %d keys", i+1, n, keys)})
		if err != nil {
			return out, err
		}
		out = append(out, m)
		v = m.Version
	}
	return out, nil
}
