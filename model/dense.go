package model

import (
	"bytes"
	"fmt"
	"math"
)

// Dense is a version's dense part: the layers of its MLP, in order, each
// a linear map followed by ReLU, except the last, which has one output.
// Routers run it; it travels as an extra file of the version (role
// "dense", in the safetensors format: ReadSafetensors).
type Dense struct {
	Layers []Layer
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
func (d *Dense) Check(in int) error {
	if d == nil || len(d.Layers) == 0 {
		return fmt.Errorf("no dense layers")
	}
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
