// Package golden reads and writes golden request files: one KServe v2
// JSON infer body per line, as a ranking service sends it, with extra
// members for the validation gates:
//
//	{"inputs": [...], "want": [0.12, 0.83]}     golden requests (golden.jsonl)
//	{"inputs": [...], "labels": [0, 1]}         a hold-out set
//
// "want" holds the score each row must get (the trainer's, or the
// reference scorer's on the version the file is published with);
// "labels" each row's outcome, 0 or 1. Requests are decoded as the front
// decodes them (server.DecodeJSON), within the front's limits.
//
// The manager's gates read files of the repository and operators' files
// with it; neither is trusted: a line that does not read is an error
// naming the line, the file's size is bounded by codec.MaxGoldenBytes,
// and every request by router.Limits.
package golden

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
)

// Case is one line: its request, and what the file says of its rows.
type Case struct {
	Line   int // 1-based
	Req    *router.Request
	Want   []float64 // nil: the line has none
	Labels []float64 // nil: the line has none
	raw    []byte    // the line, as read
}

// Bounds on a file, besides codec.MaxGoldenBytes: a gate sends every
// request, one after another, within its timeout.
const (
	MaxRequests  = 10_000
	MaxLineBytes = 16 << 20
)

// Set is a file's requests, for one model.
type Set struct {
	Cases []Case
	// KeepWant: File keeps the "want" of a line that has one (the
	// trainer's) and scores only the others.
	KeepWant bool
}

// ErrFormat is wrapped by every error about a file's content.
var ErrFormat = errors.New("golden: bad file")

// Parse reads a file of requests for model within lim. Blank lines are
// skipped.
func Parse(b []byte, modelName string, lim router.Limits) (*Set, error) {
	if len(b) > codec.MaxGoldenBytes {
		return nil, fmt.Errorf("%w: %d bytes, over the limit of %d", ErrFormat, len(b), codec.MaxGoldenBytes)
	}
	lim, err := lim.OrDefault()
	if err != nil {
		return nil, err
	}
	s := &Set{}
	for n, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		switch {
		case len(line) == 0:
			continue
		case len(line) > MaxLineBytes:
			return nil, fmt.Errorf("%w: line %d: %d bytes, over the limit of %d", ErrFormat, n+1, len(line), MaxLineBytes)
		case len(s.Cases) == MaxRequests:
			return nil, fmt.Errorf("%w: more than %d requests", ErrFormat, MaxRequests)
		}
		c, err := parseLine(line, modelName, lim)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrFormat, n+1, err)
		}
		c.Line = n + 1
		s.Cases = append(s.Cases, c)
	}
	if len(s.Cases) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrFormat)
	}
	return s, nil
}

func parseLine(line []byte, modelName string, lim router.Limits) (Case, error) {
	c := Case{raw: line}
	var extra struct {
		Want   json.RawMessage `json:"want"`
		Labels json.RawMessage `json:"labels"`
	}
	if err := json.Unmarshal(line, &extra); err != nil {
		return c, err
	}
	req, err := server.DecodeJSON(line, modelName, lim)
	if err != nil {
		return c, err
	}
	if err := req.Validate(lim); err != nil {
		return c, err
	}
	c.Req = req
	if raw := extra.Want; raw != nil {
		if c.Want, err = numbers(raw, req.Rows(), "want"); err != nil {
			return c, err
		}
	}
	if raw := extra.Labels; raw != nil {
		if c.Labels, err = numbers(raw, req.Rows(), "labels"); err != nil {
			return c, err
		}
		for i, l := range c.Labels {
			if l != 0 && l != 1 {
				return c, fmt.Errorf(`"labels"[%d] is %v; labels are 0 or 1`, i, l)
			}
		}
	}
	return c, nil
}

// numbers reads raw as an array of n numbers: null (which a trainer's
// NaN becomes) is refused, not read as 0.
func numbers(raw json.RawMessage, n int, what string) ([]float64, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil || len(elems) != n {
		return nil, fmt.Errorf(`%q must be an array of %d numbers, one per row`, what, n)
	}
	out := make([]float64, n)
	for i, e := range elems {
		if err := json.Unmarshal(e, &out[i]); err != nil || string(e) == "null" {
			return nil, fmt.Errorf(`%q[%d] is %s, not a number`, what, i, short(e))
		}
	}
	return out, nil
}

func short(b []byte) string {
	if len(b) > 32 {
		return string(b[:32]) + "…"
	}
	return string(b)
}

// Rows is the number of rows of all the requests.
func (s *Set) Rows() int {
	n := 0
	for _, c := range s.Cases {
		n += c.Req.Rows()
	}
	return n
}

// RequireWant refuses a set with a line that has no "want".
func (s *Set) RequireWant() error {
	for _, c := range s.Cases {
		if c.Want == nil {
			return fmt.Errorf(`%w: line %d has no "want"`, ErrFormat, c.Line)
		}
	}
	return nil
}

// RequireLabels refuses a set with a line that has no "labels".
func (s *Set) RequireLabels() error {
	for _, c := range s.Cases {
		if c.Labels == nil {
			return fmt.Errorf(`%w: line %d has no "labels"`, ErrFormat, c.Line)
		}
	}
	return nil
}

// IDs lists the distinct feature ids the requests ask for.
func (s *Set) IDs() []uint64 {
	seen := map[uint64]bool{}
	var out []uint64
	for _, c := range s.Cases {
		for _, ids := range [][]uint64{c.Req.IDs, c.Req.SharedIDs} {
			for _, id := range ids {
				if !seen[id] {
					seen[id] = true
					out = append(out, id)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// File is the set as a golden file: every line with its "want" as ref
// scores it (unless KeepWant and it has one; its other members as read,
// "labels" dropped), so that a version published with it is checked
// against its own scores.
func (s *Set) File(ref *model.Reference) ([]byte, error) {
	var out []byte
	for _, c := range s.Cases {
		want := make([]float64, 0, c.Req.Rows())
		if s.KeepWant && c.Want != nil {
			want = c.Want
		}
		for _, row := range c.Req.ReferenceRows()[len(want):] {
			p := ref.Score(row)
			if math.IsNaN(p) || math.IsInf(p, 0) {
				return nil, fmt.Errorf("golden: line %d: the reference score is %v", c.Line, p)
			}
			want = append(want, p)
		}
		var body map[string]json.RawMessage
		if err := json.Unmarshal(c.raw, &body); err != nil {
			return nil, err
		}
		delete(body, "labels")
		w, err := json.Marshal(want)
		if err != nil {
			return nil, err
		}
		body["want"] = w
		line, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		out = append(append(out, line...), '\n')
	}
	return out, nil
}

// LogLoss is the mean log-loss of scores (one per row of every request,
// in order) against the set's labels; a score is clamped to [1e-15,
// 1-1e-15] first, as is usual, so one confident miss costs about 34.5,
// not infinity.
func (s *Set) LogLoss(scores []float32) (float64, error) {
	if err := s.RequireLabels(); err != nil {
		return 0, err
	}
	if len(scores) != s.Rows() {
		return 0, fmt.Errorf("golden: %d scores for %d rows", len(scores), s.Rows())
	}
	var sum float64
	i := 0
	for _, c := range s.Cases {
		for _, y := range c.Labels {
			p := min(max(float64(scores[i]), 1e-15), 1-1e-15)
			if math.IsNaN(p) {
				return math.Inf(1), nil
			}
			sum -= y*math.Log(p) + (1-y)*math.Log(1-p)
			i++
		}
	}
	return sum / float64(len(scores)), nil
}

// Line is req as one line of a file: a KServe v2 JSON infer body with
// inline inputs (ids as UINT64), and want and labels if not nil.
func Line(req *router.Request, want, labels []float64) ([]byte, error) {
	type input struct {
		Name     string  `json:"name"`
		Datatype string  `json:"datatype"`
		Shape    []int64 `json:"shape"`
		Data     any     `json:"data"`
	}
	var in []input
	add := func(name, dt string, n int, data any) {
		in = append(in, input{Name: name, Datatype: dt, Shape: []int64{int64(n)}, Data: data})
	}
	add("ids", "UINT64", len(req.IDs), req.IDs)
	add("row_splits", "INT64", len(req.RowSplits), req.RowSplits)
	if req.Values != nil {
		add("values", "FP32", len(req.Values), req.Values)
	}
	if req.Fields != nil {
		add("fields", "INT32", len(req.Fields), req.Fields)
	}
	if req.SharedIDs != nil {
		add("shared_ids", "UINT64", len(req.SharedIDs), req.SharedIDs)
	}
	if req.SharedValues != nil {
		add("shared_values", "FP32", len(req.SharedValues), req.SharedValues)
	}
	if req.SharedFields != nil {
		add("shared_fields", "INT32", len(req.SharedFields), req.SharedFields)
	}
	if req.Dense != nil {
		in = append(in, input{Name: "dense", Datatype: "FP32", Shape: req.DenseShape[:], Data: req.Dense})
	}
	body := map[string]any{"inputs": in}
	if want != nil {
		body["want"] = want
	}
	if labels != nil {
		body["labels"] = labels
	}
	return json.Marshal(body)
}

// Lines is reqs as a file: request i's line with want(i) and labels(i)
// (nil: none), each line ended by a newline.
func Lines(reqs []*router.Request, want, labels func(i int) []float64) ([]byte, error) {
	var b []byte
	for i, r := range reqs {
		line, err := Line(r, want(i), labels(i))
		if err != nil {
			return nil, err
		}
		b = append(append(b, line...), '\n')
	}
	return b, nil
}

// None is a want or labels function for Lines that gives none.
func None(int) []float64 { return nil }
