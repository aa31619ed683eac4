package model

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// Dense is a version's dense part: the layers of its MLP, in order, each
// a linear map followed by ReLU, except the last, which has one output.
// Routers run it; it travels as an extra file of the version (role
// "dense", in the safetensors format: ReadSafetensors).
type Dense struct {
	Layers []Layer

	// The layers as scorers multiply them, made once and shared by every
	// version (every scorer) using this dense part.
	once     sync.Once
	prepared []dnnLayer
	checked  atomic.Int64 // 1 + the input count Check last passed for
}

// Layer is one linear layer, stored as PyTorch's nn.Linear stores it.
type Layer struct {
	In, Out int
	W       []float32 // [Out][In]: W[o*In+i]
	B       []float32 // [Out]
}

// Limits of a dense part: it is read whole into memory, and every router
// holds one per version it can score.
const (
	MaxLayers     = 16
	MaxLayerWidth = 1 << 14
	MaxDenseBytes = 256 << 20
)

// Check verifies that the layers chain from in inputs to one output, hold
// what their sizes say, and are finite.
//
// A pass is remembered: a router checks the dense part each time it
// builds a scorer for a version that uses it, and only the first costs a
// look at every parameter.
func (d *Dense) Check(in int) error {
	if d == nil || len(d.Layers) == 0 {
		return fmt.Errorf("no dense layers")
	}
	if d.checked.Load() == int64(in)+1 {
		return nil
	}
	if err := d.check(in); err != nil {
		return err
	}
	d.checked.Store(int64(in) + 1)
	return nil
}

func (d *Dense) check(in int) error {
	if len(d.Layers) > MaxLayers {
		return fmt.Errorf("%d dense layers; at most %d", len(d.Layers), MaxLayers)
	}
	for n, l := range d.Layers {
		switch {
		case l.In != in:
			return fmt.Errorf("dense layer %d takes %d inputs; it is given %d", n, l.In, in)
		case l.Out < 1 || l.Out > MaxLayerWidth:
			return fmt.Errorf("dense layer %d has %d outputs, outside 1..%d", n, l.Out, MaxLayerWidth)
		case len(l.W) != l.In*l.Out || len(l.B) != l.Out:
			return fmt.Errorf("dense layer %d holds %d weights and %d biases for %d×%d", n, len(l.W), len(l.B), l.Out, l.In)
		}
		for _, v := range [][]float32{l.W, l.B} {
			for _, x := range v {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return fmt.Errorf("dense layer %d has a non-finite parameter %v", n, x)
				}
			}
		}
		in = l.Out
	}
	if in != 1 {
		return fmt.Errorf("the last dense layer has %d outputs, want 1", in)
	}
	return nil
}

// CheckLayers checks hidden layer widths for a dense part of in inputs
// before one is made: each width in 1..MaxLayerWidth, at most MaxLayers
// layers, and the parameters (as F32) within MaxDenseBytes.
func CheckLayers(in int, hidden []int) error {
	if len(hidden)+1 > MaxLayers {
		return fmt.Errorf("%d dense layers; at most %d", len(hidden)+1, MaxLayers)
	}
	params := 0
	for _, out := range append(slices.Clone(hidden), 1) {
		if out < 1 || out > MaxLayerWidth {
			return fmt.Errorf("a dense layer of width %d; widths are 1..%d", out, MaxLayerWidth)
		}
		params += (in + 1) * out
		in = out
	}
	if 4*params > MaxDenseBytes-(1<<20) {
		return fmt.Errorf("dense layers of %d parameters are over the %d MiB a dense part may hold", params, MaxDenseBytes>>20)
	}
	return nil
}

// ReadDense reads a dense part's file (safetensors) and checks that its
// layers fit shape s.
func (s Shape) ReadDense(b []byte) (*Dense, error) {
	d, err := ReadSafetensors(bytes.NewReader(b))
	if err == nil {
		err = d.Check(s.DenseIn())
	}
	return d, err
}

// MultiplyAdds is the multiply-adds the layers cost per row.
func (d *Dense) MultiplyAdds() int {
	n := 0
	for _, l := range d.Layers {
		n += l.In * l.Out
	}
	return n
}
