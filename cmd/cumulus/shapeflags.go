package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/model"
)

// shapeFlags are the flags that describe a generated model's type:
// --type, --dim, --fields. Unset ones take the type's generator defaults
// (model.Shape.GenDefaults).
type shapeFlags struct{ s model.Shape }

func (f *shapeFlags) register(cmd *cobra.Command, prefix string) {
	cmd.Flags().StringVar(&f.s.Type, "type", model.LR, prefix+"model type: "+strings.Join(model.Types(), ", "))
	cmd.Flags().IntVar(&f.s.Dim, "dim", 0, prefix+"factors per feature (fm; per field for ffm); default fm 8, ffm 4")
	cmd.Flags().IntVar(&f.s.Fields, "fields", 0, prefix+"field count (ffm); default 8")
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
