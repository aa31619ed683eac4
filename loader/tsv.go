package loader

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/cumulus-serving/cumulus/model"
)

// ParseTSV reads Cumulus's text model format (docs/model-format.md):
//
//	# comment
//	type  fm        (lr, fm or ffm: see package model)
//	dim   4         (fm, ffm: factors per feature, per field for ffm)
//	fields 20       (ffm: the field count)
//	bias  -1.25
//	17    0.5   0.1 0.2 0.3 0.4    (feature id, weight, then the factors)
//
// Fields are separated by tabs or spaces. Header lines come before the
// first feature line. A line's first field decides its kind: a decimal
// number starts a feature line. A refused file yields no model and an
// error naming the line, where one line is at fault.
func ParseTSV(r io.Reader) (*Sparse, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	m := &Sparse{Shape: model.Shape{Type: model.LR}}
	headerLine := map[string]int{} // header → its line
	inBody := false
	seen := map[uint64]int{} // feature id → its line
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		id, idErr := strconv.ParseUint(f[0], 10, 64)
		if c := f[0][0]; idErr != nil && (c >= '0' && c <= '9' || c == '-' || c == '+') {
			// A number, but not a feature id: say so, not "unknown header".
			return nil, fmt.Errorf("loader: tsv: line %d: feature id %q is not an integer in 0..2^64-1", line, f[0])
		}
		if idErr != nil {
			if inBody {
				return nil, fmt.Errorf("loader: tsv: line %d: %q is not a feature id (headers come first)", line, f[0])
			}
			if len(f) != 2 {
				return nil, fmt.Errorf("loader: tsv: line %d: header %q wants one value", line, f[0])
			}
			if first, dup := headerLine[f[0]]; dup {
				return nil, fmt.Errorf("loader: tsv: line %d: header %q given twice (first on line %d)", line, f[0], first)
			}
			headerLine[f[0]] = line
			ok, err := m.SetHeader(f[0], f[1])
			if !ok && f[0] == "bias" {
				ok, m.HasBias = true, true
				m.Bias, err = strconv.ParseFloat(f[1], 64)
				if err == nil && (math.IsNaN(m.Bias) || math.IsInf(m.Bias, 0)) {
					err = fmt.Errorf("bias %v is not finite", m.Bias)
				}
			}
			if !ok {
				return nil, fmt.Errorf("loader: tsv: line %d: unknown header %q", line, f[0])
			}
			if err != nil {
				return nil, fmt.Errorf("loader: tsv: line %d: %w", line, err)
			}
			continue
		}
		if !inBody {
			inBody = true
			if headerLine["type"] == 0 {
				return nil, fmt.Errorf("loader: tsv: line %d: no \"type\" header before the first feature", line)
			}
			if err := tsvShape(m, headerLine); err != nil {
				return nil, err
			}
		}
		if len(f) != 1+m.Width() {
			return nil, fmt.Errorf("loader: tsv: line %d: feature %d has %d values, want %d", line, id, len(f)-1, m.Width())
		}
		if first, dup := seen[id]; dup {
			return nil, fmt.Errorf("loader: tsv: line %d: feature id %d appears twice (first on line %d)", line, id, first)
		}
		seen[id] = line
		m.Keys = append(m.Keys, id)
		for _, s := range f[1:] {
			v, err := strconv.ParseFloat(s, 32)
			if err != nil {
				return nil, fmt.Errorf("loader: tsv: line %d: %w", line, err)
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("loader: tsv: line %d: feature %d has a non-finite value %s", line, id, s)
			}
			m.Values = append(m.Values, float32(v))
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("loader: tsv: line %d: longer than 16 MiB", line+1)
		}
		return nil, fmt.Errorf("loader: tsv: line %d: %w", line+1, err)
	}
	if headerLine["type"] == 0 {
		return nil, fmt.Errorf("loader: tsv: no \"type\" header")
	}
	if err := tsvShape(m, headerLine); err != nil {
		return nil, err
	}
	return m, nil
}

// tsvShape checks that the headers describe a valid shape (model.Shape.
// Validate), naming the line of the header at fault: the type's, for a
// header the type needs and the file lacks.
func tsvShape(m *Sparse, headerLine map[string]int) error {
	err := m.Shape.Validate()
	if err == nil {
		return nil
	}
	var se *model.Error
	line := headerLine["type"]
	if errors.As(err, &se) && headerLine[se.Header] != 0 {
		line = headerLine[se.Header]
	} else if errors.As(err, &se) {
		return fmt.Errorf("loader: tsv: line %d: an %s model needs a %q header (%v)", line, m.Type, se.Header, err)
	}
	return fmt.Errorf("loader: tsv: line %d: %w", line, err)
}
