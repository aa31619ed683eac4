package model

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The safetensors format (https://huggingface.co/docs/safetensors): an
// 8-byte little-endian header length N, N bytes of JSON naming each
// tensor's dtype, shape and [begin, end) byte offsets into the data that
// follows, then the data. A dense part holds F32 tensors named
// [PREFIX.]N.weight ([out, in]) and [PREFIX.]N.bias ([out]), one prefix
// shared by all, the linear layers in increasing N: what state_dict() of
// an nn.Sequential(Linear, ReLU, Linear, …) holds ("0.weight", "2.weight",
// …, or "mlp.0.weight", … when the Sequential is a module's mlp).

// safeTensor is one tensor of a header.
type safeTensor struct {
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// ReadSafetensors reads a dense part. Anything but F32 linear layers —
// another dtype, a tensor by another name (BatchNorm statistics, say),
// layers that do not chain to one output — is refused, naming it. At
// most MaxDenseBytes are read.
func ReadSafetensors(r io.Reader) (*Dense, error) {
	var lenBuf [8]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("safetensors: reading the header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n < 2 || n > 1<<20 {
		return nil, fmt.Errorf("safetensors: header length %d outside 2..1 MiB", n)
	}
	header := make([]byte, n)
	if _, err := io.ReadFull(r, header); err != nil {
		return nil, fmt.Errorf("safetensors: reading the %d-byte header: %w", n, err)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(header))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("safetensors: header is not a JSON object: %w", err)
	}
	if rest := strings.TrimRight(string(header[dec.InputOffset():]), " "); rest != "" {
		return nil, fmt.Errorf("safetensors: header has %d bytes after its JSON object", len(rest))
	}
	tensors := map[string]safeTensor{}
	for name, v := range raw {
		if name == "__metadata__" {
			continue
		}
		var t safeTensor
		d := json.NewDecoder(bytes.NewReader(v))
		d.DisallowUnknownFields()
		if err := d.Decode(&t); err != nil {
			return nil, fmt.Errorf("safetensors: tensor %q: %w", name, err)
		}
		if t.DType != "F32" {
			return nil, fmt.Errorf("safetensors: tensor %q is %s; dense layers must be F32", name, t.DType)
		}
		tensors[name] = t
	}
	layers, err := layerNames(tensors)
	if err != nil {
		return nil, err
	}
	// The data: every byte belongs to exactly one tensor.
	spans := make([][2]int64, 0, len(tensors))
	for _, t := range tensors {
		spans = append(spans, t.Offsets)
	}
	slices.SortFunc(spans, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var end int64
	for _, s := range spans {
		if s[0] != end || s[1] < s[0] {
			return nil, fmt.Errorf("safetensors: tensor data offsets do not tile the data (a gap, an overlap, or an end before a beginning at byte %d)", s[0])
		}
		end = s[1]
	}
	if 8+int64(n)+end > MaxDenseBytes {
		return nil, fmt.Errorf("safetensors: a file of %d bytes; at most %d", 8+int64(n)+end, MaxDenseBytes)
	}
	// Read as it arrives, not allocated from the header's word: a short
	// file claiming 256 MiB costs what it holds.
	data, err := io.ReadAll(io.LimitReader(r, end+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("safetensors: reading %d bytes of tensor data: %w", end, err)
	case int64(len(data)) < end:
		return nil, fmt.Errorf("safetensors: reading %d bytes of tensor data: the file ends after %d", end, len(data))
	case int64(len(data)) > end:
		return nil, fmt.Errorf("safetensors: bytes after the tensor data")
	}
	d := &Dense{}
	for _, l := range layers {
		w, b := tensors[l.weight], tensors[l.bias]
		if len(w.Shape) != 2 || len(b.Shape) != 1 {
			return nil, fmt.Errorf("safetensors: %s has shape %v and %s %v; want [out, in] and [out]", l.weight, w.Shape, l.bias, b.Shape)
		}
		out, in := w.Shape[0], w.Shape[1]
		if out < 1 || in < 1 || out > MaxLayerWidth || in > MaxLayerWidth || b.Shape[0] != out {
			return nil, fmt.Errorf("safetensors: %s has shape %v and %s %v; want [out, in] and [out], each 1..%d", l.weight, w.Shape, l.bias, b.Shape, MaxLayerWidth)
		}
		wv, err := floats(l.weight, data, w, out*in)
		if err != nil {
			return nil, err
		}
		bv, err := floats(l.bias, data, b, out)
		if err != nil {
			return nil, err
		}
		d.Layers = append(d.Layers, Layer{In: int(in), Out: int(out), W: wv, B: bv})
	}
	return d, nil
}

type layerName struct{ weight, bias string }

// layerNames orders the tensors as linear layers, refusing any name that
// is not [PREFIX.]N.weight or [PREFIX.]N.bias, two prefixes, or a layer
// without both.
func layerNames(tensors map[string]safeTensor) ([]layerName, error) {
	if len(tensors) == 0 {
		return nil, fmt.Errorf("safetensors: no tensors")
	}
	type layer struct {
		n            int
		weight, bias bool
	}
	prefix, seen := "", false
	byN := map[int]*layer{}
	for name := range tensors {
		base, kind, ok := cutLast(name)
		p, num, _ := cutLastOptional(base)
		n, err := strconv.Atoi(num)
		rebuilt := num + "." + kind
		if p != "" {
			rebuilt = p + "." + rebuilt
		}
		if !ok || (kind != "weight" && kind != "bias") || err != nil || n < 0 || strconv.Itoa(n) != num || rebuilt != name {
			return nil, fmt.Errorf("safetensors: tensor %q is not a linear layer's weight or bias ([PREFIX.]N.weight, [PREFIX.]N.bias); a dense part holds nothing else", name)
		}
		if seen && p != prefix {
			return nil, fmt.Errorf("safetensors: tensors under two prefixes, %q and %q", prefix, p)
		}
		prefix, seen = p, true
		l := byN[n]
		if l == nil {
			l = &layer{n: n}
			byN[n] = l
		}
		if kind == "weight" {
			l.weight = true
		} else {
			l.bias = true
		}
	}
	ns := make([]int, 0, len(byN))
	for n, l := range byN {
		if !l.weight || !l.bias {
			return nil, fmt.Errorf("safetensors: layer %d has a weight or a bias but not both", n)
		}
		ns = append(ns, n)
	}
	slices.Sort(ns)
	if len(ns) > MaxLayers {
		return nil, fmt.Errorf("safetensors: %d layers; at most %d", len(ns), MaxLayers)
	}
	out := make([]layerName, len(ns))
	for i, n := range ns {
		name := strconv.Itoa(n)
		if prefix != "" {
			name = prefix + "." + name
		}
		out[i] = layerName{name + ".weight", name + ".bias"}
	}
	return out, nil
}

// cutLast splits "a.b.c" into "a.b" and "c".
func cutLast(s string) (string, string, bool) {
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// cutLastOptional splits "a.b" into "a" and "b", and "b" into "" and "b".
func cutLastOptional(s string) (string, string, bool) {
	if p, n, ok := cutLast(s); ok {
		return p, n, true
	}
	return "", s, true
}

// floats decodes t's n float32s from data.
func floats(name string, data []byte, t safeTensor, n int64) ([]float32, error) {
	if t.Offsets[1]-t.Offsets[0] != 4*n {
		return nil, fmt.Errorf("safetensors: tensor %q has %d bytes for shape %v of F32", name, t.Offsets[1]-t.Offsets[0], t.Shape)
	}
	out := make([]float32, n)
	b := data[t.Offsets[0]:t.Offsets[1]]
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		if math.IsNaN(float64(out[i])) || math.IsInf(float64(out[i]), 0) {
			return nil, fmt.Errorf("safetensors: tensor %q element %d is %v; parameters must be finite", name, i, out[i])
		}
	}
	return out, nil
}

// WriteSafetensors writes d in the format ReadSafetensors reads, its
// layers named PREFIX.N (PREFIX.0, PREFIX.2, …: the indices of the
// Linear modules in an nn.Sequential with a ReLU between each), or N
// alone when prefix is "".
func WriteSafetensors(w io.Writer, d *Dense, prefix string) error {
	header := map[string]safeTensor{}
	var data []byte
	for i, l := range d.Layers {
		name := strconv.Itoa(2 * i)
		if prefix != "" {
			name = prefix + "." + name
		}
		for _, t := range []struct {
			suffix string
			shape  []int64
			v      []float32
		}{{".weight", []int64{int64(l.Out), int64(l.In)}, l.W}, {".bias", []int64{int64(l.Out)}, l.B}} {
			begin := int64(len(data))
			for _, x := range t.v {
				data = binary.LittleEndian.AppendUint32(data, math.Float32bits(x))
			}
			header[name+t.suffix] = safeTensor{DType: "F32", Shape: t.shape, Offsets: [2]int64{begin, int64(len(data))}}
		}
	}
	h, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(h)%8 != 0 {
		h = append(h, ' ') // as the reference writer pads: data starts 8-byte aligned
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(h)))
	for _, b := range [][]byte{lenBuf[:], h, data} {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}
