package server

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/cumulus-serving/cumulus/router"
)

// The tensor contract of every Cumulus model:
//
//	ids           INT64 or UINT64 [nnz]   feature ids (INT64 bits read as uint64)
//	values        FP32 [nnz]              optional; 1.0 when omitted
//	row_splits    INT64 or INT32 [batch+1] row r is ids[row_splits[r]:row_splits[r+1]]
//	shared_ids    INT64 or UINT64 [m]     optional; features of every row
//	shared_values FP32 [m]                optional
//	fields        INT32 or INT64 [nnz]    each feature's field: field-aware
//	shared_fields INT32 or INT64 [m]      types require them, others ignore them
//	dense         FP32 [batch, D]         continuous features, for a DNN that takes D
//	→ scores      FP32 [batch]            probability per row
//
// model.Shape.Inputs lists what each type takes.
const (
	inIDs          = "ids"
	inValues       = "values"
	inRowSplits    = "row_splits"
	inSharedIDs    = "shared_ids"
	inSharedValues = "shared_values"
	inFields       = "fields"
	inSharedFields = "shared_fields"
	inDense        = "dense"
	outScores      = "scores"
)

// tensor is one decoded input, whatever it arrived as.
type tensor struct {
	name     string
	datatype string
	shape    []int64
	ints     []uint64 // INT64/UINT64/INT32 data, as bit patterns
	floats   []float32
	isInt    bool
	// binarySize is parameters.binary_data_size: the tensor's bytes follow
	// the JSON header (binary tensor extension); -1 if it has JSON data.
	binarySize int64
	dataDepth  int // nesting of JSON data: 1 flat, else the rank
	leafLen    int // the length of nested JSON data's innermost arrays (-1: none)
}

func badInput(format string, args ...any) error {
	return fmt.Errorf("server: %w: "+format, append([]any{router.ErrInvalidArgument}, args...)...)
}

// elements checks a shape and returns its element count.
func elements(name string, shape []int64) (int, error) {
	if len(shape) > maxDataDepth {
		return 0, badInput("input %q: shape %v has more than %d dimensions", name, shape, maxDataDepth)
	}
	n := int64(1)
	for _, d := range shape {
		if d < 0 || d > math.MaxInt32 {
			return 0, badInput("input %q: shape %v has a dimension outside 0..2^31", name, shape)
		}
		n *= d
		if n > math.MaxInt32 {
			return 0, badInput("input %q: shape %v is too large", name, shape)
		}
	}
	return int(n), nil
}

// unsupported is the error for t's datatype when it is not one of
// Cumulus's (datatypeSize is 0).
func (t *tensor) unsupported() error {
	return badInput("input %q: datatype %q is not supported (use INT64, UINT64, INT32 or FP32)", t.name, t.datatype)
}

// datatypeSize is the bytes per element of a supported datatype, or 0.
func datatypeSize(datatype string) int {
	switch datatype {
	case "INT64", "UINT64":
		return 8
	case "INT32", "FP32":
		return 4
	}
	return 0
}

// appendFloat32s appends v little-endian.
func appendFloat32s(dst []byte, v []float32) []byte {
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
	}
	return dst
}

// decodeRaw fills t from little-endian raw bytes.
func (t *tensor) decodeRaw(raw []byte) error {
	n, err := t.rawElements(len(raw))
	if err != nil {
		return err
	}
	t.allocate(n)
	t.fill(0, raw)
	return nil
}

// readRaw fills t from size little-endian bytes read from r, a few KiB
// at a time: the bytes are never gathered in one buffer.
func (t *tensor) readRaw(r io.Reader, size int) error {
	n, err := t.rawElements(size)
	if err != nil {
		return err
	}
	t.allocate(n)
	var buf [4096]byte
	width := datatypeSize(t.datatype)
	for i := 0; i < n; {
		k := min(n-i, len(buf)/width)
		if _, err := io.ReadFull(r, buf[:k*width]); err != nil {
			return badInput("input %q: reading its binary data: %v", t.name, err)
		}
		t.fill(i, buf[:k*width])
		i += k
	}
	return nil
}

// rawElements checks that size raw bytes fit t's shape and datatype and
// returns its element count.
func (t *tensor) rawElements(size int) (int, error) {
	n, err := elements(t.name, t.shape)
	if err != nil {
		return 0, err
	}
	width := datatypeSize(t.datatype)
	if width == 0 {
		return 0, t.unsupported()
	}
	if size != n*width {
		return 0, badInput("input %q: %d raw bytes for shape %v of %s (want %d)", t.name, size, t.shape, t.datatype, n*width)
	}
	return n, nil
}

// allocate makes room for n elements of t's (supported) datatype.
func (t *tensor) allocate(n int) {
	if t.datatype == "FP32" {
		t.floats = make([]float32, n)
		return
	}
	t.isInt, t.ints = true, make([]uint64, n)
}

// fill decodes raw's elements into t from element i on.
func (t *tensor) fill(i int, raw []byte) {
	switch t.datatype {
	case "INT64", "UINT64":
		for j := range t.ints[i : i+len(raw)/8] {
			t.ints[i+j] = binary.LittleEndian.Uint64(raw[8*j:])
		}
	case "INT32":
		for j := range t.ints[i : i+len(raw)/4] {
			t.ints[i+j] = uint64(int64(int32(binary.LittleEndian.Uint32(raw[4*j:]))))
		}
	case "FP32":
		for j := range t.floats[i : i+len(raw)/4] {
			t.floats[i+j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
		}
	}
}

// checkCount verifies the data matches the shape.
func (t *tensor) checkCount() error {
	n, err := elements(t.name, t.shape)
	if err != nil {
		return err
	}
	got := len(t.floats)
	if t.isInt {
		got = len(t.ints)
	}
	if got != n {
		return badInput("input %q: %d elements for shape %v", t.name, got, t.shape)
	}
	return nil
}

// knownInput refuses an input name outside the tensor contract.
func knownInput(name string) error {
	switch name {
	case inIDs, inSharedIDs, inRowSplits, inValues, inSharedValues, inFields, inSharedFields, inDense:
		return nil
	}
	return badInput("unknown input %q (inputs are ids, values, row_splits, shared_ids, shared_values, fields, shared_fields, dense)", name)
}

// buildRequest turns decoded inputs into a router request.
func buildRequest(model, version string, inputs []tensor) (*router.Request, error) {
	req := &router.Request{Model: model}
	switch version {
	case "":
	case router.TrackStable, router.TrackCanary:
		req.Track = version
	default:
		v, err := strconv.ParseUint(version, 10, 64)
		if err != nil || v == 0 {
			return nil, badInput("model version %q is not a positive integer, %q or %q", version, router.TrackStable, router.TrackCanary)
		}
		req.Version = v
	}
	seen := map[string]bool{}
	for i := range inputs {
		t := &inputs[i]
		if seen[t.name] {
			return nil, badInput("input %q given twice", t.name)
		}
		seen[t.name] = true
		if err := knownInput(t.name); err != nil {
			return nil, err
		}
		if t.name == inDense {
			if len(t.shape) != 2 {
				return nil, badInput("input %q has shape %v; it is [batch, D]", t.name, t.shape)
			}
		} else if len(t.shape) != 1 {
			return nil, badInput("input %q has shape %v: every input but dense is 1-D (ids [nnz], row_splits [batch+1]); flatten it", t.name, t.shape)
		}
		if err := t.checkCount(); err != nil {
			return nil, err
		}
		wantInt := t.name != inValues && t.name != inSharedValues && t.name != inDense
		if wantInt != t.isInt {
			want := "FP32"
			switch t.name {
			case inIDs, inSharedIDs:
				want = "INT64 or UINT64"
			case inRowSplits, inFields, inSharedFields:
				want = "INT64 or INT32"
			}
			return nil, badInput("input %q has datatype %s, want %s", t.name, t.datatype, want)
		}
		switch t.name {
		case inIDs:
			req.IDs = t.ints
		case inSharedIDs:
			req.SharedIDs = t.ints
		case inRowSplits:
			req.RowSplits = make([]int64, len(t.ints))
			for j, x := range t.ints {
				req.RowSplits[j] = int64(x)
			}
		case inValues:
			req.Values = t.floats
		case inSharedValues:
			req.SharedValues = t.floats
		case inDense:
			req.Dense, req.DenseShape = t.floats, [2]int64{t.shape[0], t.shape[1]}
			if req.Dense == nil {
				req.Dense = []float32{} // sent, with no elements: not missing
			}
		case inFields, inSharedFields:
			f, err := fieldNumbers(t)
			if err != nil {
				return nil, err
			}
			if t.name == inFields {
				req.Fields = f
			} else {
				req.SharedFields = f
			}
		}
	}
	if !seen[inRowSplits] {
		return nil, badInput("missing input %q (INT64 [batch+1])", inRowSplits)
	}
	if !seen[inIDs] {
		return nil, badInput("missing input %q (INT64 [nnz])", inIDs)
	}
	if seen[inSharedValues] && !seen[inSharedIDs] {
		return nil, badInput("shared_values without shared_ids")
	}
	if seen[inSharedFields] && !seen[inSharedIDs] {
		return nil, badInput("shared_fields without shared_ids")
	}
	return req, nil
}

// fieldNumbers is a fields input as int32s, refusing a field that is not
// one: negative, or past 2^31-1. (The version's field count is checked
// once the version is chosen.)
func fieldNumbers(t *tensor) ([]int32, error) {
	if t.datatype == "UINT64" {
		return nil, badInput("input %q has datatype UINT64, want INT32 or INT64", t.name)
	}
	out := make([]int32, len(t.ints))
	for i, x := range t.ints {
		f := int64(x)
		if f < 0 || f > math.MaxInt32 {
			return nil, badInput("%s[%d] = %d is not a field number", t.name, i, f)
		}
		out[i] = int32(f)
	}
	return out, nil
}
