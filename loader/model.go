package loader

import (
	"fmt"
	"math"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
)

// Sparse is a whole model in memory, as importers produce it. Values
// holds 1+Dim floats per key: the linear weight, then the FM factors.
type Sparse struct {
	Type   string
	Dim    int
	Bias   float64
	Keys   []uint64
	Values []float32
}

// Width is the number of values per key.
func (s *Sparse) Width() int { return 1 + s.Dim }

// check refuses duplicate keys and non-finite numbers.
func (s *Sparse) check() error {
	if len(s.Values) != len(s.Keys)*s.Width() {
		return fmt.Errorf("loader: %d values for %d keys of width %d", len(s.Values), len(s.Keys), s.Width())
	}
	if math.IsNaN(s.Bias) || math.IsInf(s.Bias, 0) {
		return fmt.Errorf("loader: bias %v is not finite", s.Bias)
	}
	seen := make(map[uint64]struct{}, len(s.Keys))
	for i, k := range s.Keys {
		if _, dup := seen[k]; dup {
			return fmt.Errorf("loader: feature id %d appears twice", k)
		}
		seen[k] = struct{}{}
		for _, v := range s.Values[i*s.Width() : (i+1)*s.Width()] {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("loader: feature id %d has a non-finite value %v", k, v)
			}
		}
	}
	return nil
}

// Publish splits a model into partitions and publishes it as the next
// version of name.
func (r Repo) Publish(name string, s *Sparse, partitions uint32, source string) (*codec.Manifest, error) {
	return r.PublishEncoded(name, s, partitions, "", source)
}

// PublishEncoded is Publish with FM factors stored in encoding (fp32,
// fp16 or int8; "" means fp32).
func (r Repo) PublishEncoded(name string, s *Sparse, partitions uint32, encoding, source string) (*codec.Manifest, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	w, err := r.NewVersion(Spec{Name: name, Type: s.Type, Dim: s.Dim, Bias: s.Bias, Partitions: partitions, Encoding: encoding, Source: source})
	if err != nil {
		return nil, err
	}
	width := s.Width()
	keys := make([][]uint64, partitions)
	vals := make([][]float32, partitions)
	for i, k := range s.Keys {
		p := partition.Of(k, partitions)
		keys[p] = append(keys[p], k)
		vals[p] = append(vals[p], s.Values[i*width:(i+1)*width]...)
	}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for p := range partitions {
		g.Go(func() error { return w.WritePartition(p, keys[p], vals[p]) })
	}
	if err := g.Wait(); err != nil {
		w.Abort()
		return nil, err
	}
	return w.Commit()
}
