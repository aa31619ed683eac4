package model

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// st builds a safetensors file from a header and data.
func st(header string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

func TestSafetensorsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	d := randDense(rng, 12, 8, 4)
	for _, prefix := range []string{"", "mlp", "model.mlp"} {
		var b bytes.Buffer
		if err := WriteSafetensors(&b, d, prefix); err != nil {
			t.Fatal(err)
		}
		got, err := ReadSafetensors(&b)
		if err != nil {
			t.Fatalf("prefix %q: %v", prefix, err)
		}
		if !reflect.DeepEqual(got.Layers, d.Layers) {
			t.Fatalf("prefix %q: read back %+v", prefix, got)
		}
	}
}

func TestSafetensorsRefusals(t *testing.T) {
	f32 := func(n int) []byte { return make([]byte, 4*n) }
	for _, c := range []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "header length"},
		{"huge header", st(strings.Repeat(" ", 8), nil)[:8], "reading the"},
		{"not json", st("nope", nil), "not a JSON object"},
		{"no tensors", st(`{"__metadata__":{"a":"b"}}`, nil), "no tensors"},
		{"f16", st(`{"0.weight":{"dtype":"F16","shape":[1,2],"data_offsets":[0,4]}}`, f32(1)), `"0.weight" is F16`},
		{"batchnorm", st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"1.running_mean":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, f32(3)), `"1.running_mean" is not a linear layer`},
		{"two prefixes", st(`{"a.0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},"b.0.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "two prefixes"},
		{"no bias", st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]}}`, f32(1)), "not both"},
		{"gap", st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, f32(3)), "do not tile"},
		{"overlap", st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32(1)), "do not tile"},
		{"short data", st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(1)), "reading 8 bytes"},
		{"trailing", st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(3)), "after the tensor data"},
		{"shape vs bytes", st(`{"0.weight":{"dtype":"F32","shape":[1,2],"data_offsets":[0,4]},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "has 4 bytes for shape [1 2]"},
		{"bias shape", st(`{"0.weight":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, f32(3)), "want [out, in] and [out]"},
		{"unknown field", st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4],"x":1},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), `unknown field "x"`},
		{"leading dot", st(`{".0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},".0.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), `".0.`},
		{"leading zero", st(`{"00.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},"00.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "not a linear layer"},
	} {
		_, err := ReadSafetensors(bytes.NewReader(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// FuzzReadSafetensors: a file is refused with an error, or read into
// layers that hold what their shapes say, and written back reads the
// same; reading costs about what the file weighs.
func FuzzReadSafetensors(f *testing.F) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, prefix := range []string{"", "mlp"} {
		var b bytes.Buffer
		WriteSafetensors(&b, randDense(rng, 3, 2), prefix)
		f.Add(b.Bytes())
	}
	f.Add(st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)))
	f.Add(st(`{"0.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[0,99999999999]}}`, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ReadSafetensors(bytes.NewReader(b))
		if err != nil {
			if d != nil {
				t.Fatal("a refused file gave layers")
			}
			return
		}
		total := 0
		for _, l := range d.Layers {
			if len(l.W) != l.In*l.Out || len(l.B) != l.Out {
				t.Fatalf("layer %d×%d holds %d weights, %d biases", l.Out, l.In, len(l.W), len(l.B))
			}
			total += 4 * (len(l.W) + len(l.B))
		}
		if total > len(b) {
			t.Fatalf("%d bytes of parameters from a %d-byte file", total, len(b))
		}
		var out bytes.Buffer
		if err := WriteSafetensors(&out, d, ""); err != nil {
			t.Fatal(err)
		}
		again, err := ReadSafetensors(&out)
		if err != nil || !reflect.DeepEqual(again.Layers, d.Layers) {
			t.Fatalf("written back: %v", err)
		}
	})
}
