package model

import (
	"fmt"
	"math"
)

// Batch is one request as a scorer sees it: the request's inputs, and
// the values of its distinct ids. Pos and SharedPos map each feature
// occurrence to its distinct id's number u; Vals holds Width values per
// number at Vals[u*Width:], zeros for ids the model lacks.
type Batch struct {
	RowSplits    []int64   // row r's features are [RowSplits[r], RowSplits[r+1])
	Values       []float32 // per feature; nil: all 1
	SharedValues []float32 // per shared feature; nil: all 1
	Fields       []int32   // per feature; field-aware types only
	SharedFields []int32   // per shared feature; field-aware types only
	Dense        []float32 // rows × DenseInputs continuous features (DNN)
	Pos          []int32
	SharedPos    []int32
	Vals         []float32
}

// Scorer scores batches of one version. It holds no per-request state:
// one is built per version and used concurrently, each call with its own
// Scratch.
type Scorer interface {
	// Score writes each row's probability into out (one per row).
	Score(out []float32, b *Batch, s *Scratch)
}

// Scorer is the scorer of a version of shape s, global bias and, for a
// type with one (HasDense), dense part d, which must chain from the
// shape's inputs to one output.
func (s Shape) Scorer(bias float64, d *Dense) (Scorer, error) {
	if err := s.checkDense(d); err != nil {
		return nil, err
	}
	return s.kind().scorer(s, bias, d)
}

// checkDense validates s, and d against it.
func (s Shape) checkDense(d *Dense) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if !s.HasDense() {
		return nil
	}
	if err := d.Check(s.DenseIn()); err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	return nil
}

// Scratch is a scorer's reusable memory; its zero value is ready. Kept
// with the request's other scratch, it makes scoring allocation-free
// once grown.
type Scratch struct {
	f64   []float64
	f32   []float32
	flags []bool
	i32   []int32
}

// Bytes is the memory s holds.
func (s *Scratch) Bytes() int { return 8*cap(s.f64) + 4*cap(s.f32) + cap(s.flags) + 4*cap(s.i32) }

func (s *Scratch) float64s(n int) []float64 { s.f64 = grow(s.f64, n); return s.f64 }
func (s *Scratch) float32s(n int) []float32 { s.f32 = grow(s.f32, n); return s.f32 }
func (s *Scratch) bools(n int) []bool       { s.flags = grow(s.flags, n); return s.flags }
func (s *Scratch) int32s(n int) []int32     { s.i32 = grow(s.i32, n); return s.i32 }

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

func sigmoid(z float64) float32 { return float32(1 / (1 + math.Exp(-z))) }

func x32(vs []float32, i int) float32 {
	if vs == nil {
		return 1
	}
	return vs[i]
}

func xval(vs []float32, i int) float64 {
	if vs == nil {
		return 1
	}
	return float64(vs[i])
}

// CheckRequest checks what a version of shape s requires of a request
// beyond the tensor contract (which the front and router.Request check):
// a field-aware type needs fields for every feature, and shared_fields
// exactly when there are shared features, each in 0..Fields-1; an FFM
// row has at most RowLimit own features; a DNN with dense inputs needs
// them for every row. Types that are not field-aware ignore fields, and
// types without dense inputs ignore dense. Errors wrap ErrInvalid and
// name the input.
func (s Shape) CheckRequest(b *Batch, features, shared int) error {
	if s.DenseInputs > 0 {
		rows := max(len(b.RowSplits)-1, 0)
		switch {
		case b.Dense == nil:
			return fmt.Errorf("%w: missing input \"dense\" (FP32 [%d, %d]): this %s version takes %d continuous features per row", ErrInvalid, rows, s.DenseInputs, s.Type, s.DenseInputs)
		case len(b.Dense) != rows*s.DenseInputs:
			return fmt.Errorf("%w: input \"dense\" has %d elements; this %s version takes %d per row, %d for %d rows", ErrInvalid, len(b.Dense), s.Type, s.DenseInputs, rows*s.DenseInputs, rows)
		}
	}
	if !s.FieldAware() {
		return nil
	}
	if err := checkFields("fields", b.Fields, features, s.Fields); err != nil {
		return err
	}
	if shared > 0 || b.SharedFields != nil {
		if err := checkFields("shared_fields", b.SharedFields, shared, s.Fields); err != nil {
			return err
		}
	}
	if limit := s.RowLimit(); limit > 0 {
		for r := 0; r+1 < len(b.RowSplits); r++ {
			if n := b.RowSplits[r+1] - b.RowSplits[r]; n > int64(limit) {
				return fmt.Errorf("%w: row %d has %d features; this %s version takes at most %d per row (max_row_features; shared features do not count)", ErrInvalid, r, n, s.Type, limit)
			}
		}
	}
	return nil
}

func checkFields(name string, fields []int32, n, F int) error {
	switch {
	case fields == nil && n > 0:
		return fmt.Errorf("%w: missing input %q (INT32 or INT64 [%d]): a field-aware model needs each feature's field", ErrInvalid, name, n)
	case len(fields) != n:
		return fmt.Errorf("%w: input %q has %d elements for %d features", ErrInvalid, name, len(fields), n)
	}
	for i, f := range fields {
		if f < 0 || int(f) >= F {
			return fmt.Errorf("%w: %s[%d] = %d is outside 0..%d (the model has %d fields)", ErrInvalid, name, i, f, F-1, F)
		}
	}
	return nil
}

// Input is one input a version takes, as KServe metadata lists it.
type Input struct {
	Name     string
	Datatype string
	Shape    []int64
	Required bool
}

// Inputs lists the inputs a version of shape s takes: the tensor
// contract's five, and the fields a field-aware type requires.
func (s Shape) Inputs() []Input {
	in := []Input{
		{"ids", "INT64", []int64{-1}, true},
		{"values", "FP32", []int64{-1}, false},
		{"row_splits", "INT64", []int64{-1}, true},
		{"shared_ids", "INT64", []int64{-1}, false},
		{"shared_values", "FP32", []int64{-1}, false},
	}
	if s.FieldAware() {
		in = append(in, Input{"fields", "INT32", []int64{-1}, true}, Input{"shared_fields", "INT32", []int64{-1}, false})
	}
	if s.DenseInputs > 0 {
		in = append(in, Input{"dense", "FP32", []int64{-1, int64(s.DenseInputs)}, true})
	}
	return in
}

// Row is one row for the reference scorer: its features, the row's own
// and the shared ones alike, with their values and (field-aware types)
// fields; and its continuous features (DNN).
type Row struct {
	IDs    []uint64
	Xs     []float64
	Fields []int32
	Dense  []float32
}

// Reference scores rows the slow, obvious way (pairwise sums as the
// formulas are written, float64), sharing no code with the scorers:
// tests compare the serving path with it.
type Reference struct {
	z func(Row) float64
}

// Reference is the reference scorer of a version of shape s, bias and
// dense part d (for a type with one), whose records vec returns (nil for
// an id the model lacks).
func (s Shape) Reference(bias float64, vec func(id uint64) []float32, d *Dense) (*Reference, error) {
	if err := s.checkDense(d); err != nil {
		return nil, err
	}
	return &Reference{z: s.kind().reference(s, bias, vec, d)}, nil
}

// Score is the probability of row.
func (r *Reference) Score(row Row) float64 { return 1 / (1 + math.Exp(-r.z(row))) }
