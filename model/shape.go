// Package model owns everything that varies with a model's type: the
// shape a manifest declares and its rules, the values stored per key,
// the inputs a version takes, the scorer the router runs, the reference
// scorer tests compare it with, the text format's headers and the
// generator's defaults. It sits below codec, so manifest validation uses
// it; grep finds the type names here and in the importers only.
//
// A type is one file: lr.go, fm.go, ffm.go, dnn.go. Each implements kind.
package model

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Type names, as manifests, the serving map and the text format spell
// them.
const (
	LR  = "lr"  // σ(bias + Σ w_i x_i); one value per key
	FM  = "fm"  // adds Σ_{i<j} ⟨v_i, v_j⟩ x_i x_j; 1+dim values per key
	FFM = "ffm" // adds Σ_{i<j} ⟨v_{i,f_j}, v_{j,f_i}⟩ x_i x_j; 1+fields·dim values per key
	DNN = "dnn" // embedding + MLP: pooled embeddings per field through dense layers; 1+dim values per key
)

// Limits of a shape. A record has at most MaxWidth values; an FFM
// request's per-field sums (three sets of fields²·dim float32s) stay
// within 3·MaxFieldSums, 12 MiB of scratch.
const (
	MaxDim       = 1024
	MaxFields    = 1024
	MaxWidth     = 1 << 13
	MaxFieldSums = 1 << 20
	// DefaultMaxRowFeatures is an FFM version's limit on a row's own
	// features when its manifest names none.
	DefaultMaxRowFeatures = 1024
)

// ErrInvalid marks a request a version cannot score as sent: a missing
// input it requires, a field outside its range, a row over its limit.
var ErrInvalid = errors.New("invalid input")

// Shape is what a version declares about its type; codec.Manifest and
// the serving map's version records embed it, so its fields are theirs
// in JSON. Fields a type does not use are zero.
type Shape struct {
	Type string `json:"type"`
	// Dim is the factor dimension k: FM's factors per key, FFM's per
	// field. 0 for LR.
	Dim int `json:"dim"`
	// Fields is the field count F of a field-aware type: requests give
	// each feature a field in 0..F-1.
	Fields int `json:"fields,omitempty"`
	// MaxRowFeatures bounds an FFM request's own features per row (shared
	// ones excepted); 0 means DefaultMaxRowFeatures.
	MaxRowFeatures int `json:"max_row_features,omitempty"`
	// Pooling is how a DNN pools a field's embeddings: "sum", or "mean"
	// over the features present.
	Pooling string `json:"pooling,omitempty"`
	// DenseInputs is the number D of continuous features a DNN takes per
	// row (input "dense", FP32 [rows, D]), after the pooled fields.
	DenseInputs int `json:"dense_inputs,omitempty"`
}

// kind is one model type.
type kind interface {
	// check validates the type's own fields of s; Validate has checked
	// that fields the type does not take are zero.
	check(s Shape) error
	// takes lists the optional shape fields the type uses, by header name.
	takes() []string
	width(s Shape) int
	// fieldAware types require fields and shared_fields.
	fieldAware() bool
	// scorer is the type's scorer; d is the version's dense part (nil
	// for types without one).
	scorer(s Shape, bias float64, d *Dense) (Scorer, error)
	reference(s Shape, bias float64, vec func(id uint64) []float32, d *Dense) func(Row) float64
	// genDefaults fills the generator's defaults for unset fields.
	genDefaults(s *Shape)
}

var kinds = map[string]kind{LR: lr{}, FM: fm{}, FFM: ffm{}, DNN: dnn{}}

// Types lists the type names, sorted.
func Types() []string {
	out := make([]string, 0, len(kinds))
	for t := range kinds {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func (s Shape) kind() kind { return kinds[s.Type] }

// Error is a shape refused for one field, named by its text-format
// header ("type", "dim", "fields", "max_row_features", "pooling",
// "dense"), so an importer can point at the line that set it.
type Error struct {
	Header string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func shapeErr(header, format string, args ...any) error {
	return &Error{Header: header, Msg: fmt.Sprintf(format, args...)}
}

// headers are the optional numeric shape fields, by text-format header
// name ("dense" is DenseInputs); "pooling" is the one text field.
var headers = []string{"dim", "fields", "max_row_features", "dense"}

func (s *Shape) field(header string) *int {
	switch header {
	case "dim":
		return &s.Dim
	case "fields":
		return &s.Fields
	case "max_row_features":
		return &s.MaxRowFeatures
	case "dense":
		return &s.DenseInputs
	}
	panic("model: unknown header " + header)
}

// Validate checks the shape: a known type, the fields it takes within
// their bounds, none it does not take.
func (s Shape) Validate() error {
	k := s.kind()
	if k == nil {
		return shapeErr("type", "unknown model type %q (%s)", s.Type, strings.Join(Types(), ", "))
	}
	for _, h := range headers {
		if v := *s.field(h); v != 0 && !slices.Contains(k.takes(), h) {
			return shapeErr(h, "an %s model takes no %s (it has %d)", s.Type, h, v)
		}
	}
	if s.Pooling != "" && !slices.Contains(k.takes(), "pooling") {
		return shapeErr("pooling", "an %s model takes no pooling (it has %q)", s.Type, s.Pooling)
	}
	return k.check(s)
}

// Width is the number of float32 values stored per key: the linear
// weight first, then the type's factors.
func (s Shape) Width() int {
	if k := s.kind(); k != nil {
		return k.width(s)
	}
	return 1
}

// FieldAware reports whether the type requires each feature's field.
func (s Shape) FieldAware() bool {
	k := s.kind()
	return k != nil && k.fieldAware()
}

// HasDense reports whether versions of the type carry a dense part.
func (s Shape) HasDense() bool { return s.Type == DNN }

// RowLimit is the most own features a row may have; 0 for no limit.
func (s Shape) RowLimit() int {
	if s.Type != FFM {
		return 0
	}
	if s.MaxRowFeatures == 0 {
		return DefaultMaxRowFeatures
	}
	return s.MaxRowFeatures
}

// String describes the shape compactly: "fm dim 8", "ffm fields 20 dim
// 4", "dnn fields 20 dim 16 pooling sum".
func (s Shape) String() string {
	var b strings.Builder
	b.WriteString(s.Type)
	for _, h := range []string{"fields", "dim", "max_row_features"} {
		if v := *s.field(h); v != 0 {
			fmt.Fprintf(&b, " %s %d", h, v)
		}
	}
	if s.Pooling != "" {
		fmt.Fprintf(&b, " pooling %s", s.Pooling)
	}
	if s.DenseInputs != 0 {
		fmt.Fprintf(&b, " dense %d", s.DenseInputs)
	}
	return b.String()
}

// SetHeader sets the shape field a text-format header names ("type",
// "dim", "fields", "max_row_features", "pooling", "dense"); ok is false
// for any other header. A value that is not a positive integer (or, for
// type, a known type; for pooling, sum or mean) is an error.
func (s *Shape) SetHeader(header, value string) (ok bool, err error) {
	switch header {
	case "type":
		if kinds[value] == nil {
			return true, fmt.Errorf("type %q is not one of %s", value, strings.Join(Types(), ", "))
		}
		s.Type = value
		return true, nil
	case "pooling":
		if value != "sum" && value != "mean" {
			return true, fmt.Errorf("pooling %q is not sum or mean", value)
		}
		s.Pooling = value
		return true, nil
	}
	if !slices.Contains(headers, header) {
		return false, nil
	}
	n, err := strconv.Atoi(value)
	if err != nil || n < 1 {
		return true, fmt.Errorf("%s %q is not a positive integer", header, value)
	}
	*s.field(header) = n
	return true, nil
}

// GenDefaults fills what the generator picks when its flags leave a
// field unset: FM dim 8; FFM dim 4 over 8 fields; DNN dim 16 over 8
// fields, sum pooling.
func (s *Shape) GenDefaults() {
	if k := s.kind(); k != nil {
		k.genDefaults(s)
	}
}

// FieldOf is the field the generator's documented rule gives feature id
// in a model of F fields (load generators send it): id mod F.
func FieldOf(id uint64, F int) int32 { return int32(id % uint64(F)) }

func checkRange(header string, v, lo, hi int) error {
	if v < lo || v > hi {
		return shapeErr(header, "%s %d outside %d..%d", header, v, lo, hi)
	}
	return nil
}
