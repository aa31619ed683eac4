package bench

import (
	"strconv"
	"testing"
)

// decodeResponse takes any bytes a server may send without panicking,
// and what it accepts is whole: every output binary or none, and the
// binary outputs exactly the bytes after the header.
func FuzzDecodeRESTResponse(f *testing.F) {
	header := `{"model_name":"b","model_version":"1","outputs":[{"name":"scores","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":8}}]}`
	f.Add(strconv.Itoa(len(header)), []byte(header+"\x00\x00\x80\x3f\x00\x00\x00\x3f"), true)
	f.Add("", []byte(`{"model_name":"b","model_version":"1","outputs":[{"name":"scores","datatype":"FP32","shape":[2],"data":[1,0.5]}]}`), false)
	f.Add("3", []byte(`{}x`), true)
	f.Fuzz(func(t *testing.T, hdr string, body []byte, bin bool) {
		resp, err := decodeResponse(hdr, body, bin)
		if err != nil {
			return
		}
		raw := 0
		for _, b := range resp.RawOutputContents {
			raw += len(b)
		}
		if n := len(resp.RawOutputContents); n != 0 && n != len(resp.Outputs) {
			t.Fatalf("%d binary outputs of %d", n, len(resp.Outputs))
		}
		if h, _ := strconv.Atoi(hdr); raw > 0 && (!bin || h+raw != len(body)) {
			t.Fatalf("%d binary bytes after a header of %s in a body of %d", raw, hdr, len(body))
		}
	})
}
