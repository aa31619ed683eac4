// Decoding a pushed batch sent over HTTP: the KServe v2 request layout,
// in JSON or with the binary tensor extension.

package manager

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// headerLength is the binary tensor extension's header: the length of
// the JSON that starts the body, before the tensors' bytes.
const headerLength = "Inference-Header-Content-Length"

// A batch over HTTP is a KServe v2 inference request (the layout
// predict calls use), its producer and sequence as request parameters:
//
//	{"parameters": {"producer": "trainer-0", "sequence": 7},
//	 "inputs": [
//	   {"name": "ids",     "datatype": "INT64", "shape": [2],    "data": [3, 17]},
//	   {"name": "values",  "datatype": "FP32",  "shape": [2, 1], "data": [0.5, -1]},
//	   {"name": "deletes", "datatype": "INT64", "shape": [1],    "data": [99]}]}
//
// ids and deletes are INT64 (their bits read as uint64) or UINT64;
// values FP32, len(ids) × the model's width. Each input is optional. With
// the binary extension (an Inference-Header-Content-Length header), an
// input may give "parameters": {"binary_data_size": N} instead of data,
// its N bytes (little-endian) following the JSON in input order.

type pushTensor struct {
	Name       string  `json:"name"`
	Datatype   string  `json:"datatype"`
	Shape      []int64 `json:"shape"`
	Parameters struct {
		BinaryDataSize *int64 `json:"binary_data_size"`
	} `json:"parameters"`
	Data jsontext.Value `json:"data"`
}

type pushRequest struct {
	Parameters struct {
		Producer string `json:"producer"`
		Sequence uint64 `json:"sequence"`
	} `json:"parameters"`
	Inputs []pushTensor `json:"inputs"`
}

// DecodePushHTTP decodes a batch's body; hdr is its
// Inference-Header-Content-Length ("" for all JSON). The model is the
// caller's (the URL's).
func DecodePushHTTP(body []byte, hdr string) (*PushBatch, error) {
	head, raw := body, []byte(nil)
	if hdr != "" {
		n, err := strconv.Atoi(hdr)
		if err != nil || n < 0 || n > len(body) {
			return nil, fmt.Errorf("%w: %s %q is not a length from 0 to the body's %d bytes", ErrInvalid, headerLength, hdr, len(body))
		}
		head, raw = body[:n], body[n:]
	}
	var req pushRequest
	if err := json.Unmarshal(head, &req, json.RejectUnknownMembers(false)); err != nil {
		return nil, fmt.Errorf("%w: batch is not a KServe v2 request: %v", ErrInvalid, err)
	}
	b := &PushBatch{Producer: req.Parameters.Producer, Sequence: req.Parameters.Sequence}
	seen := map[string]bool{}
	for i := range req.Inputs {
		t := &req.Inputs[i]
		if seen[t.Name] {
			return nil, fmt.Errorf("%w: input %q given twice", ErrInvalid, t.Name)
		}
		seen[t.Name] = true
		n, err := pushElements(t)
		if err != nil {
			return nil, err
		}
		var src []byte
		switch {
		case t.Parameters.BinaryDataSize != nil && len(t.Data) > 0:
			return nil, fmt.Errorf("%w: input %q has both data and parameters.binary_data_size: give one", ErrInvalid, t.Name)
		case t.Parameters.BinaryDataSize != nil && hdr == "":
			return nil, fmt.Errorf("%w: input %q has parameters.binary_data_size, but the request has no %s header", ErrInvalid, t.Name, headerLength)
		case t.Parameters.BinaryDataSize != nil:
			size := *t.Parameters.BinaryDataSize
			if size != int64(n)*int64(pushElementSize(t.Datatype)) || size > int64(len(raw)) {
				return nil, fmt.Errorf("%w: input %q: binary_data_size %d for shape %v of %s (%d bytes left in the body)", ErrInvalid, t.Name, size, t.Shape, t.Datatype, len(raw))
			}
			src, raw = raw[:size], raw[size:]
		case len(t.Data) == 0:
			return nil, fmt.Errorf("%w: input %q has no data", ErrInvalid, t.Name)
		}
		if err := b.set(t, n, src); err != nil {
			return nil, err
		}
	}
	if len(raw) > 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last binary input", ErrInvalid, len(raw))
	}
	return b, nil
}

// pushElements checks a tensor's name, datatype and shape, and returns
// its element count.
func pushElements(t *pushTensor) (int, error) {
	switch {
	case t.Name != "ids" && t.Name != "values" && t.Name != "deletes":
		return 0, fmt.Errorf("%w: unknown input %q (a batch takes ids, values and deletes)", ErrInvalid, t.Name)
	case t.Name == "values" && t.Datatype != "FP32":
		return 0, fmt.Errorf("%w: input values is %s, not FP32", ErrInvalid, t.Datatype)
	case t.Name != "values" && t.Datatype != "INT64" && t.Datatype != "UINT64":
		return 0, fmt.Errorf("%w: input %s is %s, not INT64 or UINT64", ErrInvalid, t.Name, t.Datatype)
	case len(t.Shape) == 0 || len(t.Shape) > 2:
		return 0, fmt.Errorf("%w: input %s has shape %v: give [n] (or [n, width] for values)", ErrInvalid, t.Name, t.Shape)
	}
	n := int64(1)
	for _, d := range t.Shape {
		if d < 0 || d > math.MaxInt32 || n*d > math.MaxInt32 {
			return 0, fmt.Errorf("%w: input %s has shape %v", ErrInvalid, t.Name, t.Shape)
		}
		n *= d
	}
	return int(n), nil
}

func pushElementSize(datatype string) int {
	if datatype == "FP32" {
		return 4
	}
	return 8
}

// set decodes t's n elements into b, from src (binary) or t.Data.
// Slices are sized by what the body holds, never by the shape alone.
func (b *PushBatch) set(t *pushTensor, n int, src []byte) error {
	if src == nil && n > len(t.Data) {
		return fmt.Errorf("%w: input %s has shape %v, more elements than its %d bytes of data can hold", ErrInvalid, t.Name, t.Shape, len(t.Data))
	}
	if t.Name == "values" {
		var vals []float32
		if src != nil {
			vals = make([]float32, n)
			for i := range vals {
				vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
			}
		} else if err := pushData(t, &vals, n); err != nil {
			return err
		}
		b.Values = vals
		return nil
	}
	var ids []uint64
	switch {
	case src != nil:
		ids = make([]uint64, n)
		for i := range ids {
			ids[i] = binary.LittleEndian.Uint64(src[8*i:])
		}
	case t.Datatype == "INT64":
		var signed []int64
		if err := pushData(t, &signed, n); err != nil {
			return err
		}
		ids = make([]uint64, n)
		for i, v := range signed {
			ids[i] = uint64(v)
		}
	default:
		if err := pushData(t, &ids, n); err != nil {
			return err
		}
	}
	if t.Name == "ids" {
		b.IDs = ids
	} else {
		b.Deletes = ids
	}
	return nil
}

// pushData decodes t.Data, a flat JSON array of n elements, into dst.
func pushData[T any](t *pushTensor, dst *[]T, n int) error {
	if err := json.Unmarshal(t.Data, dst); err != nil {
		return fmt.Errorf("%w: input %s: %v", ErrInvalid, t.Name, err)
	}
	if len(*dst) != n {
		return fmt.Errorf("%w: input %s has %d elements for shape %v", ErrInvalid, t.Name, len(*dst), t.Shape)
	}
	return nil
}
