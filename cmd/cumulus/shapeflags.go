package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

// shapeFlags are the flags that describe a generated model's type:
// --type, --dim, --fields, and a dnn's --pooling, --dense-inputs and
// --layers. Unset ones take the type's generator defaults
// (model.Shape.GenDefaults).
type shapeFlags struct {
	s      model.Shape
	layers []int
}

func (f *shapeFlags) register(cmd *cobra.Command, prefix string) {
	cmd.Flags().StringVar(&f.s.Type, "type", model.LR, prefix+"model type: "+strings.Join(model.Types(), ", "))
	cmd.Flags().IntVar(&f.s.Dim, "dim", 0, prefix+"factors per feature (fm; per field for ffm; embedding size for dnn); default fm 8, ffm 4, dnn 16")
	cmd.Flags().IntVar(&f.s.Fields, "fields", 0, prefix+"field count (ffm, dnn); default 8")
	cmd.Flags().StringVar(&f.s.Pooling, "pooling", "", prefix+"dnn: sum (default) or mean")
	cmd.Flags().IntVar(&f.s.DenseInputs, "dense-inputs", 0, prefix+"dnn: continuous features per row")
	cmd.Flags().IntSliceVar(&f.layers, "layers", nil, prefix+"dnn: hidden layers' widths (default 256,128)")
}

// spec is a generator spec of the flags' shape (filled and validated).
func (f *shapeFlags) spec(name string, params int64, seed uint64) (loader.GenSpec, error) {
	s, err := f.shape()
	if len(f.layers) > 0 && !s.HasDense() {
		err = fmt.Errorf("--layers: an %s model has no dense layers", s.Type)
	}
	return loader.GenSpec{Name: name, Shape: s, Params: params, Seed: seed, Layers: f.layers}, err
}

// shape is the shape the flags describe, defaults filled and validated.
func (f *shapeFlags) shape() (model.Shape, error) {
	s := f.s
	s.GenDefaults()
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("--type %s: %w", s.Type, err)
	}
	return s, nil
}
