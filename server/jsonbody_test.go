package server

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/router"
)

var testLimits = bodyLimits{maxIDs: 10, maxRows: 3}

func decodeString(body string) (*inferBody, error) {
	return newJSONDecoder(strings.NewReader(body), testLimits).decode()
}

func TestDecodeInferJSON(t *testing.T) {
	b, err := decodeString(`{"id":"req-7","parameters":{"timeout":2500,"other":[1,{"x":null}]},
		"inputs":[{"name":"ids","shape":[2,2],"datatype":"INT64","data":[[1,-2],[3,9223372036854775807]]},
		          {"data":[0,2,4],"name":"row_splits","datatype":"INT32","shape":[3]},
		          {"name":"values","datatype":"FP32","shape":[4],"data":[0.5,1e3,-2,0]},
		          {"name":"shared_ids","datatype":"UINT64","shape":[1],"data":[18446744073709551615]}],
		"outputs":[{"name":"scores","parameters":{"binary_data":true}}],"extra":"ignored"}`)
	if err != nil {
		t.Fatal(err)
	}
	if b.id != "req-7" || !b.idSet || b.timeout != 2500*time.Microsecond || !b.binaryOutput() || len(b.inputs) != 4 {
		t.Fatalf("decoded %+v", b)
	}
	m1 := uint64(1<<64 - 2)
	if want := []uint64{1, m1, 3, 1<<63 - 1}; !slices.Equal(b.inputs[0].ints, want) {
		t.Errorf("ids %v, want %v", b.inputs[0].ints, want)
	}
	// data before datatype is decoded once the datatype is known
	if want := []uint64{0, 2, 4}; !slices.Equal(b.inputs[1].ints, want) {
		t.Errorf("row_splits %v, want %v", b.inputs[1].ints, want)
	}
	if want := []float32{0.5, 1000, -2, 0}; !slices.Equal(b.inputs[2].floats, want) {
		t.Errorf("values %v, want %v", b.inputs[2].floats, want)
	}
	if b.inputs[3].ints[0] != 1<<64-1 {
		t.Errorf("shared_ids %v", b.inputs[3].ints)
	}
	if b, err := decodeString(`{"inputs":[{"name":"ids","datatype":"INT64","shape":[0],"data":null}]} `); err != nil || len(b.inputs[0].ints) != 0 {
		t.Errorf("null data: %v %v", b, err)
	}
	if b, err := decodeString(`{"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"parameters":{"binary_data_size":16}}],"parameters":{"binary_data_output":true}}`); err != nil || b.inputs[0].binarySize != 16 || !b.binaryOutput() || b.idSet {
		t.Errorf("binary header: %+v %v", b, err)
	}
}

// TestDecodeInferJSONRejects: each bad body is a 400 naming its problem.
func TestDecodeInferJSONRejects(t *testing.T) {
	in := func(fields string) string { return `{"inputs":[{"name":"ids","datatype":"INT64",` + fields + `}]}` }
	deep := strings.Repeat("[", 9990) + "1" + strings.Repeat("]", 9990)
	for _, tc := range []struct{ body, want string }{
		{``, "ends early"},
		{`[]`, "must be an object"},
		{`{"inputs":[]} {}`, "after the JSON document"},
		{`{"inputs":[]} x`, "after the JSON document"},
		{`{"inputs":[]`, "ends early"},
		{`{"id":1}`, "id must be a string"},
		{`{"id":"a","id":"b"}`, "duplicate"},
		{`{"parameters":{"timeout":-1}}`, "timeout"},
		{`{"parameters":{"timeout":1.5}}`, "timeout"},
		{`{"parameters":{"binary_data_output":"yes"}}`, "binary_data_output must be true or false"},
		{`{"outputs":[{"name":"probabilities"}]}`, `unknown output "probabilities"`},
		{`{"outputs":[],"outputs":[]}`, "duplicate"},
		{in(`"shape":[1],"data":` + deep), "nested deeper than 4"},
		{in(`"shape":[2],"data":[1,[2]]`), "nested unevenly"},
		{in(`"shape":[2],"data":[[1,2]]`), "nested 2 deep for a shape of rank 1"},
		{in(`"shape":[1],"data":[1.5]`), "element 0 is 1.5, not an INT64"},
		{in(`"shape":[1],"data":["1"]`), "element 0 is a string, not a number"},
		{in(`"shape":[1],"data":[true]`), "not a number"},
		{in(`"shape":[1],"data":[99999999999999999999]`), "not an INT64"},
		{in(`"shape":[1],"data":1`), "data must be an array"},
		{in(`"shape":[1],"data":{}`), "data must be an array"},
		{in(`"shape":[11],"data":[1,2,3,4,5,6,7,8,9,10,11,12]`), `input "ids" has more than 10 elements`},
		{in(`"shape":[1],"data":[1],"data":[2]`), "duplicate"},
		{in(`"shape":[1]`), `input "ids" has no data`},
		{in(`"shape":[1],"data":[1],"parameters":{"binary_data_size":8}`), "both data and parameters.binary_data_size"},
		{in(`"shape":[1,1,1,1,1],"data":[1]`), "more than 4 dimensions"},
		{in(`"shape":[-1],"data":[1]`), "shape dimension must be an integer in 0.."},
		{`{"inputs":[{"name":"ids","datatype":"STRING","data":[1]}]}`, `datatype "STRING" is not supported`},
		{`{"inputs":[{"name":"values","datatype":"FP32","data":[1e39]}]}`, "not a finite FP32"},
		{`{"inputs":[{"name":"row_splits","datatype":"INT32","data":[0,1,2,3,4]}]}`, `"row_splits" has more than 4 elements`},
		{`{"inputs":[{"name":"row_splits","datatype":"INT32","data":[2147483648]}]}`, "not an INT32"},
		{"{\"id\":\"\xff\"}", "invalid UTF-8"},
		{`{"outputs":[{"parameters":{"binary_data":true}}]}`, "an output has no name"},
		{`{"parameters":{` + strings.Repeat(`"a":1,`, 300) + `"b":1}}`, `duplicate member "a"`},
		{`{"parameters":{` + members(300) + `}}`, "parameters has more than 256 members"},
		{`{"inputs":[{"name":"` + strings.Repeat("x", 100) + `"}]}`, "longer than 64 bytes"},
		{in(`"shape":[1],"data":[` + strings.Repeat("9", 1000) + `]`), "element 0 is 9999999999999999999999999999999999999999…, not an INT64"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","data":[1]},{"name":"ids","datatype":"INT64","data":[2]}]}`, `input "ids" given twice`},
		{`{"inputs":[{"name":"idz","datatype":"INT64","data":[1]}]}`, `unknown input "idz"`},
		{`{"inputs":[{"name":"dense","datatype":"FP32","shape":[1,2],"data":[[1],[2]]}]}`, `innermost data arrays of 1 numbers for shape [1 2]`},
		{`{"inputs":[{"name":"dense","datatype":"FP32","shape":[2,2],"data":[[1,2],[3]]}]}`, `nested unevenly (innermost arrays of 2 and 1 numbers)`},
	} {
		_, err := decodeString(tc.body)
		if !errors.Is(err, router.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			short := tc.body
			if len(short) > 80 {
				short = short[:80] + "…"
			}
			t.Errorf("%s: %v, want invalid argument naming %q", short, err, tc.want)
		}
	}
}

// TestDecodeStopsAtTheLimit: a body far past a limit is refused at the
// first element past it, not after reading the rest (here, a body that
// never ends).
func TestDecodeStopsAtTheLimit(t *testing.T) {
	endless := &repeatReader{head: `{"inputs":[{"name":"ids","datatype":"INT64","data":[`, body: "1,"}
	_, err := newJSONDecoder(endless, testLimits).decode()
	if err == nil || !strings.Contains(err.Error(), "more than 10 elements") {
		t.Fatalf("endless ids: %v", err)
	}
	if endless.read > 1<<20 {
		t.Errorf("read %d bytes of an endless body before refusing it", endless.read)
	}
	// Inputs are bounded in all, each within its own cap; a repeated
	// one is refused as it ends, before the next is read.
	four := `{"inputs":[{"name":"ids","datatype":"INT64","data":[1,2,3,4,5,6,7,8,9]},` +
		`{"name":"values","datatype":"FP32","data":[1,2,3,4,5,6,7,8,9]},` +
		`{"name":"fields","datatype":"INT32","data":[1,2,3,4,5,6,7,8,9]},` +
		`{"name":"shared_fields","datatype":"INT32","data":[1,2,3,4,5,6,7,8,9]},` +
		`{"name":"shared_ids","datatype":"INT64","data":[1,2,3,4,5,6,7,8,9]}]}`
	if _, err := decodeString(four); err == nil || !strings.Contains(err.Error(), "more than 44 elements in all") {
		t.Errorf("45 elements over five inputs: %v", err)
	}
	var many strings.Builder
	many.WriteString(`{"inputs":[`)
	for i := range 100 {
		fmt.Fprintf(&many, `%s{"name":"ids","datatype":"INT64","data":[1,2,3,4,5,6,7,8,9]}`, map[bool]string{true: ",", false: ""}[i > 0])
	}
	many.WriteString(`]}`)
	d := newJSONDecoder(strings.NewReader(many.String()), testLimits)
	if _, err := d.decode(); err == nil || !strings.Contains(err.Error(), `input "ids" given twice`) || d.elements != 18 {
		t.Errorf("100 inputs of 9 ids: %v after %d elements, want refused as a repetition after 18", err, d.elements)
	}
}

type repeatReader struct {
	head, body string
	read       int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		src := r.body
		if r.read < len(r.head) {
			src = r.head[r.read:]
		}
		c := copy(p[n:], src)
		n += c
		r.read += c
	}
	return n, nil
}

func TestAppendJSONResponse(t *testing.T) {
	got := string(appendJSONResponse(nil, "m\"x", 12, "a\nb", true, []float32{0.25, 1e-7}, false))
	want := `{"model_name":"m\"x","model_version":"12","id":"a\nb","outputs":[{"name":"scores","datatype":"FP32","shape":[2],"data":[0.25,1e-07]}]}`
	if got != want {
		t.Errorf("json response\n got %s\nwant %s", got, want)
	}
	got = string(appendJSONResponse(nil, "m", 1, "", false, []float32{1, 2, 3}, true))
	want = `{"model_name":"m","model_version":"1","outputs":[{"name":"scores","datatype":"FP32","shape":[3],"parameters":{"binary_data_size":12}}]}`
	if got != want {
		t.Errorf("binary header\n got %s\nwant %s", got, want)
	}
}

// members is n distinct JSON members.
func members(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"m%d":%d`, i, i)
	}
	return b.String()
}

// TestEmptyDenseIsSent: a dense input with no elements is sent, not
// missing (the version's check then names its size).
func TestEmptyDenseIsSent(t *testing.T) {
	b, err := decodeString(`{"inputs":[{"name":"ids","datatype":"INT64","shape":[0],"data":[]},` +
		`{"name":"row_splits","datatype":"INT64","shape":[3],"data":[0,0,0]},` +
		`{"name":"dense","datatype":"FP32","shape":[2,0],"data":[]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	req, err := buildRequest("m", "", b.inputs)
	if err != nil || req.Dense == nil || len(req.Dense) != 0 || req.DenseShape != [2]int64{2, 0} {
		t.Fatalf("request %+v, %v", req, err)
	}
}

// TestCanaryParameters: parameters.canary_key is read as a string, and a
// model version may name a track.
func TestCanaryParameters(t *testing.T) {
	in := `"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[1]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]`
	b, err := decodeString(`{"id":"r1","parameters":{"canary_key":"user-7"},` + in + `}`)
	if err != nil || b.canaryKey != "user-7" || b.id != "r1" {
		t.Fatalf("%+v %v", b, err)
	}
	if _, err := decodeString(`{"parameters":{"canary_key":7},` + in + `}`); err == nil || !strings.Contains(err.Error(), "parameters.canary_key") {
		t.Fatalf("a numeric canary_key: %v", err)
	}
	b, _ = decodeString(`{` + in + `}`)
	for version, want := range map[string]string{"canary": "canary", "stable": "stable", "": "", "3": ""} {
		req, err := buildRequest("m", version, b.inputs)
		if err != nil || req.Track != want {
			t.Fatalf("version %q: %+v %v", version, req, err)
		}
	}
	if _, err := buildRequest("m", "beta", b.inputs); err == nil || !strings.Contains(err.Error(), `"canary"`) {
		t.Fatalf("version beta: %v", err)
	}
}
