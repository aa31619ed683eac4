package router

import (
	"errors"
	"fmt"
	"math"

	"github.com/cumulus-serving/cumulus/model"
)

// Request is one batched predict call: rows of sparse features in the
// ragged-row layout (row r is IDs[RowSplits[r]:RowSplits[r+1]]), plus
// features shared by every row (the user's and the context's), sent once.
// Values and SharedValues may be nil, meaning 1.0 for every feature.
type Request struct {
	Model        string
	Version      uint64 // 0 for the live version
	IDs          []uint64
	Values       []float32
	RowSplits    []int64
	SharedIDs    []uint64
	SharedValues []float32
	// Fields and SharedFields give each feature's field, for field-aware
	// types (which require them); other types ignore them.
	Fields       []int32
	SharedFields []int32
	// Dense holds each row's continuous features, row after row, for a
	// type that takes them; others ignore it. Nil: not sent. DenseShape
	// is its shape as sent: [rows, D].
	Dense      []float32
	DenseShape [2]int64
	// Track, for an unpinned request, names the arm that answers it:
	// TrackStable (the live version) or TrackCanary; "" lets its key
	// choose (see canary.go).
	Track string
	// CanaryKey places the request on one arm of a canary split: the
	// same key, the same arm, on every router. "" draws at random.
	CanaryKey string
}

// Rows is the batch size.
func (r *Request) Rows() int { return max(len(r.RowSplits)-1, 0) }

// Response holds one score per row: the model's probability.
type Response struct {
	Model   string
	Version uint64
	Scores  []float32
}

// Limits bound one request. Zero values mean the documented default.
type Limits struct {
	MaxRows int // default 10,000
	MaxIDs  int // ids plus shared ids; default 1,048,576
	// MaxValues bounds the values a request fetches: its distinct ids
	// times the version's values per key (1 for LR; 1+fields·dim for
	// FFM). Default 1<<25 (128 MiB of float32s).
	MaxValues int
}

// OrDefault is l with defaults for its zero fields; negative ones are an
// error.
func (l Limits) OrDefault() (Limits, error) {
	if l.MaxIDs < 0 || l.MaxRows < 0 || l.MaxValues < 0 {
		return l, errors.New("router: request limits must not be negative")
	}
	l.fill()
	return l, nil
}

func (l *Limits) fill() {
	if l.MaxRows == 0 {
		l.MaxRows = 10_000
	}
	if l.MaxIDs == 0 {
		l.MaxIDs = 1 << 20
	}
	if l.MaxValues == 0 {
		l.MaxValues = 1 << 25
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("router: %w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// Validate checks the request's shape and numbers against l.
func (r *Request) Validate(l Limits) error {
	l.fill()
	switch {
	case r.Model == "":
		return invalid("no model name")
	case len(r.RowSplits) < 2:
		return invalid("empty batch: row_splits needs at least 2 entries (batch+1), got %d", len(r.RowSplits))
	case r.Rows() > l.MaxRows:
		return invalid("batch of %d rows is over the limit of %d", r.Rows(), l.MaxRows)
	case len(r.IDs)+len(r.SharedIDs) > l.MaxIDs:
		return invalid("%d feature ids are over the limit of %d", len(r.IDs)+len(r.SharedIDs), l.MaxIDs)
	case r.Values != nil && len(r.Values) != len(r.IDs):
		return invalid("%d values for %d ids", len(r.Values), len(r.IDs))
	case r.SharedValues != nil && len(r.SharedValues) != len(r.SharedIDs):
		return invalid("%d shared values for %d shared ids", len(r.SharedValues), len(r.SharedIDs))
	case r.Fields != nil && len(r.Fields) != len(r.IDs):
		return invalid("%d fields for %d ids", len(r.Fields), len(r.IDs))
	case r.SharedFields != nil && len(r.SharedFields) != len(r.SharedIDs):
		return invalid("%d shared fields for %d shared ids", len(r.SharedFields), len(r.SharedIDs))
	case r.Track != "" && r.Track != TrackStable && r.Track != TrackCanary:
		return invalid("track %q: want %q or %q", r.Track, TrackStable, TrackCanary)
	case r.Track != "" && r.Version != 0:
		return invalid("a request names a version or a track, not both")
	case r.RowSplits[0] != 0:
		return invalid("row_splits must start at 0, starts at %d", r.RowSplits[0])
	case r.RowSplits[len(r.RowSplits)-1] != int64(len(r.IDs)):
		return invalid("row_splits must end at the number of ids (%d), ends at %d", len(r.IDs), r.RowSplits[len(r.RowSplits)-1])
	}
	for i := 1; i < len(r.RowSplits); i++ {
		if r.RowSplits[i] < r.RowSplits[i-1] {
			return invalid("row_splits must not decrease: entry %d is %d after %d", i, r.RowSplits[i], r.RowSplits[i-1])
		}
	}
	if i := nonFinite(r.Values); i >= 0 {
		return invalid("value %d is %v; values must be finite", i, r.Values[i])
	}
	if i := nonFinite(r.SharedValues); i >= 0 {
		return invalid("shared value %d is %v; values must be finite", i, r.SharedValues[i])
	}
	if r.Dense != nil && r.DenseShape[0] != int64(r.Rows()) {
		return invalid("dense has shape %v for %d rows; it is [batch, D]", r.DenseShape, r.Rows())
	}
	if i := nonFinite(r.Dense); i >= 0 {
		return invalid("dense value %d is %v; values must be finite", i, r.Dense[i])
	}
	return nil
}

func nonFinite(v []float32) int {
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return i
		}
	}
	return -1
}

// ReferenceRows is the request as rows for a reference scorer
// (model.Reference): each row's shared features, then its own, with
// their values (1 when not sent) and fields (0 when not sent), and its
// continuous features. The request must be valid (Validate).
func (r *Request) ReferenceRows() []model.Row {
	at := func(vs []float32, i int) float64 {
		if vs == nil {
			return 1
		}
		return float64(vs[i])
	}
	field := func(fs []int32, i int) int32 {
		if fs == nil {
			return 0
		}
		return fs[i]
	}
	rows := make([]model.Row, r.Rows())
	for k := range rows {
		row := &rows[k]
		for i, id := range r.SharedIDs {
			row.IDs, row.Xs, row.Fields = append(row.IDs, id), append(row.Xs, at(r.SharedValues, i)), append(row.Fields, field(r.SharedFields, i))
		}
		for i := int(r.RowSplits[k]); i < int(r.RowSplits[k+1]); i++ {
			row.IDs, row.Xs, row.Fields = append(row.IDs, r.IDs[i]), append(row.Xs, at(r.Values, i)), append(row.Fields, field(r.Fields, i))
		}
		if D := int(r.DenseShape[1]); r.Dense != nil && D > 0 {
			row.Dense = r.Dense[k*D : (k+1)*D]
		}
	}
	return rows
}
