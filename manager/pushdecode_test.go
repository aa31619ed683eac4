package manager

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestDecodePushHTTP(t *testing.T) {
	b, err := DecodePushHTTP([]byte(`{"parameters":{"producer":"p","sequence":4},"inputs":[
		{"name":"ids","datatype":"INT64","shape":[2],"data":[-1,3]},
		{"name":"values","datatype":"FP32","shape":[2,1],"data":[0.5,2]},
		{"name":"deletes","datatype":"UINT64","shape":[1],"data":[18446744073709551615]}]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if b.Producer != "p" || b.Sequence != 4 || !slices.Equal(b.IDs, []uint64{math.MaxUint64, 3}) || !slices.Equal(b.Values, []float32{0.5, 2}) || !slices.Equal(b.Deletes, []uint64{math.MaxUint64}) {
		t.Fatalf("decoded %+v", b)
	}
	head := `{"parameters":{"producer":"p","sequence":1},"inputs":[{"name":"ids","datatype":"UINT64","shape":[1],"parameters":{"binary_data_size":8}},{"name":"values","datatype":"FP32","shape":[1],"data":[7]}]}`
	body := binary.LittleEndian.AppendUint64([]byte(head), 42)
	if b, err = DecodePushHTTP(body, strconv.Itoa(len(head))); err != nil || !slices.Equal(b.IDs, []uint64{42}) || !slices.Equal(b.Values, []float32{7}) {
		t.Fatalf("binary: %+v %v", b, err)
	}
	for _, c := range []struct{ body, hdr, want string }{
		{`{`, "", "not a KServe v2 request"},
		{`{"inputs":[{"name":"rows","datatype":"INT64","shape":[1],"data":[1]}]}`, "", "unknown input"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[1]},{"name":"ids","datatype":"INT64","shape":[1],"data":[1]}]}`, "", "twice"},
		{`{"inputs":[{"name":"ids","datatype":"FP32","shape":[1],"data":[1]}]}`, "", "not INT64"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"data":[1]}]}`, "", "1 elements for shape [2]"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[2000000000],"data":[1]}]}`, "", "more elements than"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[-1],"data":[1]}]}`, "", "shape [-1]"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1]}]}`, "", "no data"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"parameters":{"binary_data_size":8}}]}`, "", "no Inference-Header-Content-Length"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"parameters":{"binary_data_size":8}}]}`, "600", "is not a length"},
		{`{"inputs":[]}xx`, "13", "2 bytes after"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[1],"parameters":{"binary_data_size":8}}]}12345678`, "-8", "both data and"},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"parameters":{"binary_data_size":8}}]}1234`, "-4", "binary_data_size 8"},
	} {
		if n, err := strconv.Atoi(c.hdr); err == nil && n < 0 { // the JSON is all but the last -n bytes
			c.hdr = strconv.Itoa(len(c.body) + n)
		}
		_, err := DecodePushHTTP([]byte(c.body), c.hdr)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s (header %q): got %v, want ErrInvalid naming %q", c.body, c.hdr, err, c.want)
		}
	}
}

// FuzzDecodePushHTTP: any body and header decode to a batch or an
// ErrInvalid, never a panic, and a batch's slices are no larger than the
// body could hold.
func FuzzDecodePushHTTP(f *testing.F) {
	f.Add([]byte(`{"parameters":{"producer":"p","sequence":4},"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"data":[-1,3]},{"name":"values","datatype":"FP32","shape":[2,1],"data":[0.5,2]}]}`), "")
	head := `{"inputs":[{"name":"ids","datatype":"UINT64","shape":[1],"parameters":{"binary_data_size":8}},{"name":"deletes","datatype":"INT64","shape":[1],"parameters":{"binary_data_size":8}}]}`
	f.Add(append([]byte(head), make([]byte, 16)...), strconv.Itoa(len(head)))
	f.Add([]byte(`{"inputs":[{"name":"values","datatype":"FP32","shape":[1,1],"data":[1e39]}]}`), "")
	f.Fuzz(func(t *testing.T, body []byte, hdr string) {
		b, err := DecodePushHTTP(body, hdr)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error without ErrInvalid: %v", err)
			}
			return
		}
		if n := len(b.IDs) + len(b.Values) + len(b.Deletes); n > len(body) {
			t.Fatalf("%d elements from a body of %d bytes", n, len(body))
		}
		_ = b.Check(1)
	})
}
