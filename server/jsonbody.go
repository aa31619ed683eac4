package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/cumulus-serving/cumulus/router"
)

// The JSON body of a KServe v2 infer request is decoded in one streaming
// pass over its tokens (jsontext, the token layer of the Go team's
// encoding/json/v2): numbers go straight into the tensors' slices, with no
// allocation per number and no tree of the document, and every limit is
// checked as the elements arrive, so a body past one costs what was read
// up to the first element past it.
//
// Why jsontext (BenchmarkDecodeJSONBody, a rank200 body of 40,600
// numbers): 4.2–4.6 ms against 9.5–11 ms for encoding/json into typed
// slices, and it validates strictly (invalid UTF-8, trailing data) and
// bounds nesting; duplicate member names are refused by object. A scanner of our own that only splits
// out and parses the numbers, validating nothing, takes 2.7 ms: a whole
// decoder of our own could gain at most 1.6×, and would have to get JSON's
// strings, escapes and validation right again. Binary bodies (the tensor
// extension) are the fast path for callers who care.

// maxDataDepth bounds a shape's rank, and the nesting of an input's data
// while it is read, before its shape may be known: Cumulus's tensors have
// rank 1, and KServe clients nest at most to a tensor's rank.
const maxDataDepth = 4

// inferBody is a decoded infer request: the JSON document, or the JSON
// header of a binary-extension body with its binary inputs still to read.
type inferBody struct {
	id        string
	idSet     bool
	canaryKey string        // parameters.canary_key
	timeout   time.Duration // parameters.timeout (µs); 0 if absent
	// binaryDataOutput is parameters.binary_data_output; scoresBinary is
	// the scores output's parameters.binary_data, which overrides it
	// (0 unset, 1 false, 2 true).
	binaryDataOutput bool
	scoresBinary     int8
	inputs           []tensor
}

// binaryOutput reports whether the scores go back as binary data.
func (b *inferBody) binaryOutput() bool {
	if b.scoresBinary != 0 {
		return b.scoresBinary == 2
	}
	return b.binaryDataOutput
}

// bodyLimits bound what a body may carry, checked while decoding.
type bodyLimits struct {
	maxIDs  int // ids plus shared ids; also bounds values and fields, and their shared ones, and dense
	maxRows int // row_splits has at most maxRows+1 elements
}

// total is the most elements all inputs may carry together: ids, values
// and fields (each with its shared counterpart), dense, and row_splits.
func (l bodyLimits) total() int { return 4*l.maxIDs + l.maxRows + 1 }

// elementCap is the most elements input name may carry.
func (l bodyLimits) elementCap(name string) int {
	if name == inRowSplits {
		return l.maxRows + 1
	}
	return l.maxIDs
}

// jsonDecoder decodes one infer body. Its slices are the decoded tensors:
// they are not reused across bodies.
type jsonDecoder struct {
	dec *jsontext.Decoder
	lim bodyLimits
	// elements counts every element decoded so far: at most total() over
	// all inputs, so repeating an input cannot multiply
	// the work before the repetition is refused.
	elements int
}

func newJSONDecoder(r io.Reader, lim bodyLimits) *jsonDecoder {
	return &jsonDecoder{dec: jsontext.NewDecoder(r, jsontext.AllowDuplicateNames(true)), lim: lim}
}

// syntaxError turns a token error into a 400 naming where it happened.
func (d *jsonDecoder) syntaxError(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return badInput("request body ends early at byte %d: the JSON document is incomplete", d.dec.InputOffset())
	}
	return badInput("request body is not valid JSON: %v", err)
}

func (d *jsonDecoder) token() (jsontext.Token, error) {
	tok, err := d.dec.ReadToken()
	if err != nil {
		return tok, d.syntaxError(err)
	}
	return tok, nil
}

// expect reads one token of kind k.
func (d *jsonDecoder) expect(k jsontext.Kind, what string) error {
	tok, err := d.token()
	if err != nil {
		return err
	}
	if tok.Kind() != k {
		return badInput("%s must be %s, got %s", what, kindName(k), kindName(tok.Kind()))
	}
	return nil
}

func kindName(k jsontext.Kind) string {
	switch k {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a " + k.String()
}

// object calls field for each member of the object that comes next.
// maxMembers bounds the members of an object the decoder reads (the
// request, its parameters, an input, an output): a body of millions of
// members is refused at the first past it.
const maxMembers = 256

// object calls field for each member of the object that comes next. A
// name given twice is refused (the decoder itself lets duplicates pass, so
// that skipping an unknown object costs no set of its names).
func (d *jsonDecoder) object(what string, field func(name string) error) error {
	if err := d.expect('{', what); err != nil {
		return err
	}
	var seen []string
	for d.dec.PeekKind() != '}' {
		tok, err := d.token()
		if err != nil {
			return err
		}
		if tok.Kind() != '"' {
			return badInput("%s: member name expected", what)
		}
		name := tok.String()
		if slices.Contains(seen, name) {
			return badInput("%s: duplicate member %q", what, short(name))
		}
		if seen = append(seen, name); len(seen) > maxMembers {
			return badInput("%s has more than %d members", what, maxMembers)
		}
		if err := field(name); err != nil {
			return err
		}
	}
	_, err := d.token()
	return err
}

// short is s cut to a length fit for an error message: an error must not
// repeat a megabyte the caller sent.
func short(s string) string {
	if len(s) <= 40 {
		return s
	}
	return s[:40] + "…"
}

// array calls elem for each element of the array that comes next.
func (d *jsonDecoder) array(what string, elem func(i int) error) error {
	if err := d.expect('[', what); err != nil {
		return err
	}
	for i := 0; d.dec.PeekKind() != ']'; i++ {
		if err := elem(i); err != nil {
			return err
		}
	}
	_, err := d.token()
	return err
}

func (d *jsonDecoder) skip() error {
	if err := d.dec.SkipValue(); err != nil {
		return d.syntaxError(err)
	}
	return nil
}

func (d *jsonDecoder) str(what string) (string, error) {
	tok, err := d.token()
	if err != nil {
		return "", err
	}
	if tok.Kind() != '"' {
		return "", badInput("%s must be a string, got %s", what, kindName(tok.Kind()))
	}
	return tok.String(), nil
}

func (d *jsonDecoder) boolean(what string) (bool, error) {
	tok, err := d.token()
	if err != nil {
		return false, err
	}
	if k := tok.Kind(); k != 't' && k != 'f' {
		return false, badInput("%s must be true or false, got %s", what, kindName(k))
	}
	return tok.Bool(), nil
}

func (d *jsonDecoder) integer(what string, lo, hi int64) (int64, error) {
	tok, err := d.token()
	if err != nil {
		return 0, err
	}
	if tok.Kind() != '0' {
		return 0, badInput("%s must be an integer, got %s", what, kindName(tok.Kind()))
	}
	v, err := tok.Int()
	if err != nil || v < lo || v > hi {
		return 0, badInput("%s must be an integer in %d..%d, got %s", what, lo, hi, short(tok.String()))
	}
	return v, nil
}

// decode reads one infer request document and then the end of input:
// anything after the document is an error.
func (d *jsonDecoder) decode() (*inferBody, error) {
	b := &inferBody{}
	err := d.object("the request", func(name string) error {
		switch name {
		case "id":
			id, err := d.str("id")
			b.id, b.idSet = id, true
			return err
		case "parameters":
			return d.object("parameters", func(name string) error {
				switch name {
				case "timeout": // 0: none, as Triton reads it
					us, err := d.integer("parameters.timeout (microseconds)", 0, math.MaxInt64/1000)
					b.timeout = time.Duration(us) * time.Microsecond
					return err
				case "canary_key":
					k, err := d.str("parameters.canary_key")
					b.canaryKey = k
					return err
				case "binary_data_output":
					v, err := d.boolean("parameters.binary_data_output")
					b.binaryDataOutput = v
					return err
				}
				return d.skip()
			})
		case "inputs":
			return d.array("inputs", func(i int) error {
				t, err := d.input(i)
				if err != nil {
					return err
				}
				// Refused now, not after more inputs: each may hold up to
				// a limit's worth of elements.
				if err := knownInput(t.name); err != nil {
					return err
				}
				for _, seen := range b.inputs {
					if seen.name == t.name {
						return badInput("input %q given twice", t.name)
					}
				}
				b.inputs = append(b.inputs, t)
				return nil
			})
		case "outputs": // object refuses a second "outputs" member
			return d.array("outputs", func(i int) error { return d.output(b) })
		}
		return d.skip()
	})
	if err != nil {
		return nil, err
	}
	if _, err := d.dec.ReadToken(); err != io.EOF {
		return nil, badInput("request body has data after the JSON document, at byte %d", d.dec.InputOffset())
	}
	return b, nil
}

func (d *jsonDecoder) output(b *inferBody) error {
	named := false
	err := d.object("an output", func(name string) error {
		switch name {
		case "name":
			o, err := d.str("output name")
			if err == nil && o != outScores {
				err = badInput("unknown output %q (the output is %q)", short(o), outScores)
			}
			named = true
			return err
		case "parameters":
			return d.object("output parameters", func(name string) error {
				if name == "binary_data" {
					v, err := d.boolean("output parameters.binary_data")
					b.scoresBinary = 1
					if v {
						b.scoresBinary = 2
					}
					return err
				}
				return d.skip()
			})
		}
		return d.skip()
	})
	if err == nil && !named {
		err = badInput("an output has no name (the output is %q)", outScores)
	}
	return err
}

// input decodes inputs[i]. Its data may come before its name, datatype
// or shape (JSON members are unordered): then it is kept as raw JSON,
// under the same limits, and decoded once the datatype is known.
func (d *jsonDecoder) input(i int) (tensor, error) {
	t := tensor{binarySize: -1}
	var raw jsontext.Value
	var haveData bool
	err := d.object(fmt.Sprintf("inputs[%d]", i), func(name string) error {
		switch name {
		case "name":
			n, err := d.str("input name")
			if err == nil && len(n) > 64 {
				err = badInput("inputs[%d]: name %q is longer than 64 bytes", i, short(n))
			}
			t.name = n
			return err
		case "datatype":
			dt, err := d.str("datatype")
			if err == nil && len(dt) > 16 {
				err = badInput("inputs[%d]: datatype %q is longer than 16 bytes", i, short(dt))
			}
			t.datatype = dt
			return err
		case "shape":
			t.shape = t.shape[:0]
			return d.array("shape", func(j int) error {
				if j >= maxDataDepth {
					return badInput("input %q: shape has more than %d dimensions", t.name, maxDataDepth)
				}
				n, err := d.integer("a shape dimension", 0, math.MaxInt32)
				t.shape = append(t.shape, n)
				return err
			})
		case "parameters":
			return d.object("input parameters", func(name string) error {
				if name == "binary_data_size" {
					n, err := d.integer("parameters.binary_data_size", 0, math.MaxInt32)
					t.binarySize = n
					return err
				}
				return d.skip()
			})
		case "data": // object refuses a second "data" member
			haveData = true
			if t.datatype == "" {
				// Rare: data before datatype. Keep its bytes (no more than
				// the body, which has been read whole) and decode them
				// below, under the same limits.
				v, err := d.dec.ReadValue()
				if err != nil {
					return d.syntaxError(err)
				}
				raw = v.Clone()
				return nil
			}
			return d.data(&t)
		}
		return d.skip()
	})
	if err != nil {
		return t, err
	}
	if raw != nil {
		sub := &jsonDecoder{dec: jsontext.NewDecoder(bytes.NewBuffer(raw), jsontext.AllowDuplicateNames(true)), lim: d.lim, elements: d.elements}
		if err := sub.data(&t); err != nil {
			return t, err
		}
		d.elements = sub.elements
	}
	switch {
	case haveData && t.binarySize >= 0:
		return t, badInput("input %q has both data and parameters.binary_data_size", t.name)
	case !haveData && t.binarySize < 0:
		return t, badInput("input %q has no data", t.name)
	}
	if haveData && t.dataDepth > 1 && t.dataDepth != len(t.shape) {
		return t, badInput("input %q: data nested %d deep for a shape of rank %d (nest to the rank, or not at all)", t.name, t.dataDepth, len(t.shape))
	}
	if haveData && t.dataDepth > 1 && t.leafLen >= 0 && int64(t.leafLen) != t.shape[len(t.shape)-1] {
		return t, badInput("input %q: innermost data arrays of %d numbers for shape %v", t.name, t.leafLen, t.shape)
	}
	return t, nil
}

// data decodes a tensor's data, flat or nested row-major, into t.ints or
// t.floats, stopping at the first element past a limit.
func (d *jsonDecoder) data(t *tensor) error {
	var kind int // 0 int64 bits, 1 uint64, 2 int32, 3 fp32
	switch t.datatype {
	case "INT64":
	case "UINT64":
		kind = 1
	case "INT32":
		kind = 2
	case "FP32":
		kind = 3
	default:
		return t.unsupported()
	}
	t.isInt = kind != 3
	// The slices grow with the elements that arrive, never from what the
	// shape announces: announcing costs the sender nothing.
	limit := d.lim.elementCap(t.name)
	total := d.lim.total()
	depth, leafDepth := 0, 0
	leafStart := 0 // the element count when the current innermost array began
	t.leafLen = -1
	for {
		tok, err := d.dec.ReadToken()
		if err != nil {
			return d.syntaxError(err)
		}
		switch tok.Kind() {
		case '[':
			depth++
			if depth > maxDataDepth {
				return badInput("input %q: data is nested deeper than %d arrays", t.name, maxDataDepth)
			}
			leafStart = t.count()
			continue
		case ']':
			if depth == leafDepth && leafDepth > 1 {
				// The innermost arrays must all be as long as the shape's
				// last dimension (checked with the shape).
				n := t.count() - leafStart
				if t.leafLen >= 0 && n != t.leafLen {
					return badInput("input %q: data is nested unevenly (innermost arrays of %d and %d numbers)", t.name, t.leafLen, n)
				}
				t.leafLen = n
			}
			depth--
			if depth == 0 {
				t.dataDepth = leafDepth
				return nil
			}
			continue
		case '0':
		case 'n':
			if depth == 0 { // null: an empty tensor, as encoders write one
				return nil
			}
			fallthrough
		default:
			if depth == 0 {
				return badInput("input %q: data must be an array, got %s", t.name, kindName(tok.Kind()))
			}
			return badInput("input %q: element %d is %s, not a number", t.name, t.count(), kindName(tok.Kind()))
		}
		if depth == 0 {
			return badInput("input %q: data must be an array, got a number", t.name)
		}
		if leafDepth == 0 {
			leafDepth = depth
		} else if depth != leafDepth {
			return badInput("input %q: data is nested unevenly (numbers at depth %d and %d)", t.name, leafDepth, depth)
		}
		n := t.count()
		if n >= limit {
			return badInput("input %q has more than %d elements", t.name, limit)
		}
		if d.elements++; d.elements > total {
			return badInput("inputs have more than %d elements in all", total)
		}
		switch kind {
		case 0:
			v, err := tok.Int()
			if err != nil {
				return badInput("input %q: element %d is %s, not an INT64", t.name, n, short(tok.String()))
			}
			t.ints = append(t.ints, uint64(v))
		case 1:
			v, err := tok.Uint()
			if err != nil {
				return badInput("input %q: element %d is %s, not a UINT64", t.name, n, short(tok.String()))
			}
			t.ints = append(t.ints, v)
		case 2:
			v, err := tok.Int()
			if err != nil || v < math.MinInt32 || v > math.MaxInt32 {
				return badInput("input %q: element %d is %s, not an INT32", t.name, n, short(tok.String()))
			}
			t.ints = append(t.ints, uint64(v))
		case 3:
			v, err := tok.Float32()
			if err != nil || math.IsInf(float64(v), 0) {
				return badInput("input %q: element %d is %s, not a finite FP32", t.name, n, short(tok.String()))
			}
			t.floats = append(t.floats, v)
		}
	}
}

// count is the number of elements decoded so far.
func (t *tensor) count() int {
	if t.isInt {
		return len(t.ints)
	}
	return len(t.floats)
}

// appendJSONResponse writes a KServe v2 infer response. With binary, the
// scores travel as binary data after the JSON (the binary tensor
// extension) and are not in it.
func appendJSONResponse(dst []byte, model string, version uint64, id string, idSet bool, scores []float32, binary bool) []byte {
	dst = append(dst, `{"model_name":`...)
	dst, _ = jsontext.AppendQuote(dst, model)
	dst = append(dst, `,"model_version":"`...)
	dst = strconv.AppendUint(dst, version, 10)
	dst = append(dst, '"')
	if idSet {
		dst = append(dst, `,"id":`...)
		dst, _ = jsontext.AppendQuote(dst, id)
	}
	dst = append(dst, `,"outputs":[{"name":"scores","datatype":"FP32","shape":[`...)
	dst = strconv.AppendInt(dst, int64(len(scores)), 10)
	dst = append(dst, ']')
	if binary {
		dst = append(dst, `,"parameters":{"binary_data_size":`...)
		dst = strconv.AppendInt(dst, int64(4*len(scores)), 10)
		return append(dst, `}}]}`...)
	}
	dst = append(dst, `,"data":[`...)
	for i, s := range scores {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendFloat(dst, float64(s), 'g', -1, 32)
	}
	return append(dst, `]}]}`...)
}

// DecodeJSON reads body, one KServe v2 JSON infer request (members it
// does not know are skipped; inputs are inline, the binary extension
// takes a header this has not), as a request for model within lim. The
// golden files' tools and gate read their requests with it, as the
// front would.
func DecodeJSON(body []byte, model string, lim router.Limits) (*router.Request, error) {
	lim, err := lim.OrDefault()
	if err != nil {
		return nil, err
	}
	b, err := newJSONDecoder(bytes.NewReader(body), bodyLimits{maxIDs: lim.MaxIDs, maxRows: lim.MaxRows}).decode()
	if err != nil {
		return nil, err
	}
	for _, t := range b.inputs {
		if t.binarySize >= 0 {
			return nil, badInput("input %q has parameters.binary_data_size: a JSON request holds its inputs inline", t.name)
		}
	}
	return buildRequest(model, "", b.inputs)
}
