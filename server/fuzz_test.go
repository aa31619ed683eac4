package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// The fuzz targets of the front's network decoders. Each checks, besides
// not panicking, that a refusal is an InvalidArgument and that what is
// accepted is what the bytes say, judged by a decoder written another way.
// Their corpora are kept under testdata/fuzz.

var fuzzLimits = bodyLimits{maxIDs: 64, maxRows: 8}

// FuzzInferJSON: an accepted JSON body is valid JSON, and every input's
// numbers are the ones encoding/json reads from its data, flattened.
func FuzzInferJSON(f *testing.F) {
	for _, seed := range []string{
		oneRowJSON,
		`{"id":"x","parameters":{"timeout":5,"binary_data_output":false},"inputs":[{"name":"ids","shape":[2,1],"datatype":"UINT64","data":[[1],[18446744073709551615]]},{"name":"row_splits","datatype":"INT32","shape":[2],"data":[0,2]},{"name":"values","datatype":"FP32","shape":[2],"data":[1.5,-0]}],"outputs":[{"name":"scores","parameters":{"binary_data":true}}]}`,
		`{"inputs":[{"data":[3,4],"name":"ids","datatype":"INT64","shape":[2]}]}`,
		`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[[[[[1]]]]]}]}`,
		`{"inputs":[]} garbage`,
		`{"inputs":[{"name":"ids","datatype":"INT64","data":null}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := newJSONDecoder(bytes.NewReader(body), fuzzLimits).decode()
		if err != nil {
			if !errors.Is(err, router.ErrInvalidArgument) {
				t.Fatalf("refused without InvalidArgument: %v", err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted a body encoding/json finds invalid: %q", body)
		}
		var doc struct {
			ID     *string `json:"id"`
			Inputs []struct {
				Data json.RawMessage `json:"data"`
			} `json:"inputs"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			// encoding/json is looser in places (case-insensitive names)
			// but never stricter about the shapes accepted here.
			t.Fatalf("accepted a body encoding/json cannot read as a request: %v", err)
		}
		if (doc.ID != nil) != b.idSet || (doc.ID != nil && *doc.ID != b.id) {
			t.Fatalf("id %q (set %v), encoding/json reads %v", b.id, b.idSet, doc.ID)
		}
		if len(doc.Inputs) != len(b.inputs) {
			t.Fatalf("%d inputs, encoding/json reads %d", len(b.inputs), len(doc.Inputs))
		}
		for i, in := range b.inputs {
			n := in.count()
			if n > fuzzLimits.elementCap(in.name) {
				t.Fatalf("input %q: %d elements past the limit", in.name, n)
			}
			want := flatten(t, doc.Inputs[i].Data)
			if len(want) != n {
				t.Fatalf("input %q: %d elements, encoding/json reads %d", in.name, n, len(want))
			}
			for j, num := range want {
				switch {
				case in.datatype == "UINT64":
					v, err := strconv.ParseUint(num.String(), 10, 64)
					if err != nil || v != in.ints[j] {
						t.Fatalf("input %q element %d: %d, the text says %s", in.name, j, in.ints[j], num)
					}
				case in.isInt:
					v, err := strconv.ParseInt(num.String(), 10, 64)
					if err != nil || uint64(v) != in.ints[j] {
						t.Fatalf("input %q element %d: %d, the text says %s", in.name, j, int64(in.ints[j]), num)
					}
				default:
					v, err := strconv.ParseFloat(num.String(), 32)
					if err != nil || float32(v) != in.floats[j] {
						t.Fatalf("input %q element %d: %v, the text says %s", in.name, j, in.floats[j], num)
					}
				}
			}
		}
	})
}

const oneRowJSON = `{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[5]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]}`

// flatten reads JSON data (numbers nested in arrays, or null) in order.
func flatten(t *testing.T, raw json.RawMessage) []json.Number {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if len(raw) == 0 {
		return nil
	}
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("data %s: %v", raw, err)
	}
	var out []json.Number
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case []any:
			for _, e := range x {
				walk(e)
			}
		case json.Number:
			out = append(out, x)
		case nil:
		default:
			t.Fatalf("data holds %T", v)
		}
	}
	walk(v)
	return out
}

// FuzzBinaryBody: a binary-extension body accepted has exactly the bytes
// its header announces, and each binary input holds the little-endian
// values of its own slice of them.
func FuzzBinaryBody(f *testing.F) {
	hdr := `{"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"parameters":{"binary_data_size":16}},{"name":"row_splits","datatype":"INT32","shape":[2],"parameters":{"binary_data_size":8}},{"name":"values","datatype":"FP32","shape":[2],"data":[1,2]}]}`
	tail := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 7), 1<<63)
	tail = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(tail, 0), 2)
	f.Add([]byte(hdr), tail)
	f.Add([]byte(hdr), tail[:20])
	f.Add([]byte(`{"inputs":[{"name":"values","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}]}`), []byte{0, 0, 0xc0, 0x7f})
	f.Add([]byte(oneRowJSON), []byte{})
	f.Fuzz(func(t *testing.T, header, tail []byte) {
		body := append(append([]byte{}, header...), tail...)
		b, err := decodeBody(bodyOf(body), strconv.Itoa(len(header)), fuzzLimits)
		if err != nil {
			if !errors.Is(err, router.ErrInvalidArgument) {
				t.Fatalf("refused without InvalidArgument: %v", err)
			}
			return
		}
		at := 0
		for _, in := range b.inputs {
			if in.binarySize < 0 {
				continue
			}
			size := datatypeSize(in.datatype)
			raw := tail[at : at+int(in.binarySize)]
			at += int(in.binarySize)
			if in.count()*size != len(raw) {
				t.Fatalf("input %q: %d elements from %d bytes of %s", in.name, in.count(), len(raw), in.datatype)
			}
			for j := 0; j < in.count(); j++ {
				var want uint64
				switch in.datatype {
				case "INT64", "UINT64":
					want = binary.LittleEndian.Uint64(raw[8*j:])
				case "INT32":
					want = uint64(int64(int32(binary.LittleEndian.Uint32(raw[4*j:]))))
				case "FP32":
					if got := math.Float32bits(in.floats[j]); got != binary.LittleEndian.Uint32(raw[4*j:]) {
						t.Fatalf("input %q element %d: bits %x, bytes say %x", in.name, j, got, binary.LittleEndian.Uint32(raw[4*j:]))
					}
					continue
				}
				if in.ints[j] != want {
					t.Fatalf("input %q element %d: %d, bytes say %d", in.name, j, in.ints[j], want)
				}
			}
		}
		if at != len(tail) {
			t.Fatalf("accepted with %d bytes after the header, %d of them used", len(tail), at)
		}
	})
}

// FuzzGRPCInfer: a ModelInferRequest message, as gRPC would hand it over,
// is counted out (requestCodec) holding no more than it counted, and is
// refused with InvalidArgument or becomes a request that is valid within
// the limits and carries the ids the message holds.
func FuzzGRPCInfer(f *testing.F) {
	raw := &kservepb.ModelInferRequest{ModelName: "m", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
		{Name: "ids", Datatype: "UINT64", Shape: []int64{2}}, {Name: "row_splits", Datatype: "INT32", Shape: []int64{2}},
	}, RawInputContents: [][]byte{make([]byte, 16), {0, 0, 0, 0, 2, 0, 0, 0}}}
	typed := &kservepb.ModelInferRequest{ModelName: "m", ModelVersion: "3", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
		{Name: "ids", Datatype: "INT64", Shape: []int64{2}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{-1, 5}}},
		{Name: "row_splits", Datatype: "INT64", Shape: []int64{2}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{0, 2}}},
		{Name: "values", Datatype: "FP32", Shape: []int64{2}, Contents: &kservepb.InferTensorContents{Fp32Contents: []float32{1, 0.5}}},
	}}
	for _, m := range []*kservepb.ModelInferRequest{raw, typed} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	lim := router.Limits{MaxIDs: fuzzLimits.maxIDs, MaxRows: fuzzLimits.maxRows}
	codec := newRequestCodec(fuzzLimits)
	f.Fuzz(func(t *testing.T, msg []byte) {
		m := &receivedMessage{}
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg)}, m); err != nil {
			t.Fatalf("keeping the message's bytes: %v", err)
		}
		r, err := codec.decode(m)
		if err != nil {
			if !errors.Is(err, router.ErrInvalidArgument) {
				t.Fatalf("counted out or refused without InvalidArgument: %v", err)
			}
			return
		}
		if n := decodedElements(r); n > codec.maxElements {
			t.Fatalf("decoded %d elements and fields, past the %d counted", n, codec.maxElements)
		}
		inputs, err := grpcInputs(r)
		var req *router.Request
		if err == nil {
			req, err = buildRequest(r.ModelName, r.ModelVersion, inputs)
		}
		if err == nil {
			err = req.Validate(lim)
		}
		if err != nil {
			if !errors.Is(err, router.ErrInvalidArgument) {
				t.Fatalf("refused without InvalidArgument: %v", err)
			}
			return
		}
		if len(req.IDs)+len(req.SharedIDs) > lim.MaxIDs || req.Rows() > lim.MaxRows {
			t.Fatalf("accepted %d ids, %d rows past the limits", len(req.IDs)+len(req.SharedIDs), req.Rows())
		}
		for i, in := range r.Inputs {
			if in.Name != inIDs {
				continue
			}
			var want []uint64
			if len(r.RawInputContents) > 0 {
				for j := 0; j+8 <= len(r.RawInputContents[i]); j += 8 {
					want = append(want, binary.LittleEndian.Uint64(r.RawInputContents[i][j:]))
				}
			} else if strings.HasPrefix(in.Datatype, "UINT") {
				want = in.Contents.GetUint64Contents()
			} else {
				for _, x := range in.Contents.GetInt64Contents() {
					want = append(want, uint64(x))
				}
			}
			if in.Datatype == "INT64" || in.Datatype == "UINT64" {
				if len(want) != len(req.IDs) {
					t.Fatalf("%d ids from a message holding %d", len(req.IDs), len(want))
				}
				for j := range want {
					if want[j] != req.IDs[j] {
						t.Fatalf("id %d: %d, the message holds %d", j, req.IDs[j], want[j])
					}
				}
			}
		}
	})
}

// decodedElements counts a decoded request's repeated entries and
// elements the way requestCodec counts them on the wire (at least).
func decodedElements(r *kservepb.ModelInferRequest) int {
	n := len(r.Parameters) + len(r.Outputs) + len(r.RawInputContents)
	for _, o := range r.Outputs {
		n += len(o.Parameters)
	}
	for _, in := range r.Inputs {
		n += 1 + len(in.Shape) + len(in.Parameters)
		if c := in.Contents; c != nil {
			n += len(c.BoolContents) + len(c.IntContents) + len(c.Int64Contents) + len(c.UintContents) + len(c.Uint64Contents) +
				len(c.Fp32Contents) + len(c.Fp64Contents) + len(c.BytesContents)
		}
	}
	return n
}
