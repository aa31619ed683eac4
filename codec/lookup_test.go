package codec

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestLookupRequestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]uint64, 1000)
	for i := range random {
		random[i] = rng.Uint64()
	}
	dense := make([]uint64, 1000)
	for i := range dense {
		dense[i] = uint64(1000 + 3*i)
	}
	cases := []struct {
		name     string
		sections []Section
	}{
		{"empty", nil},
		{"empty section", []Section{{Partition: 3}}},
		{"edges", []Section{{Partition: 0, Keys: []uint64{0, math.MaxUint64, 0, 1, math.MaxUint64 - 1}}}},
		{"random and dense", []Section{{Partition: 1, Keys: random}, {Partition: 65535, Keys: dense}}},
		{"descending", []Section{{Partition: 7, Keys: []uint64{100, 90, 80, 3}}}},
	}
	var r LookupRequest
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := AppendLookupRequest(nil, "ctr-model", 42, c.sections)
			if err := r.Decode(b); err != nil {
				t.Fatal(err)
			}
			if string(r.Model) != "ctr-model" || r.Version != 42 {
				t.Fatalf("header = %q v%d", r.Model, r.Version)
			}
			if len(r.Sections) != len(c.sections) {
				t.Fatalf("%d sections, want %d", len(r.Sections), len(c.sections))
			}
			for i, s := range c.sections {
				got := r.Sections[i]
				if got.Partition != s.Partition || !slices.Equal(got.Keys, s.Keys) {
					t.Errorf("section %d = %d %v, want %d %v", i, got.Partition, got.Keys, s.Partition, s.Keys)
				}
			}
		})
	}
}

// The encoder must pick deltas for dense keys and fixed width for hashed
// ones, and never be worse than fixed width.
func TestLookupRequestEncodingChoice(t *testing.T) {
	dense := make([]uint64, 1000)
	for i := range dense {
		dense[i] = uint64(5000 + 7*i)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	hashed := make([]uint64, 1000)
	for i := range hashed {
		hashed[i] = rng.Uint64()
	}
	d := AppendLookupRequest(nil, "m", 1, []Section{{Keys: dense}})
	h := AppendLookupRequest(nil, "m", 1, []Section{{Keys: hashed}})
	if len(d) > 1100 {
		t.Errorf("dense keys took %d bytes, want ≤ 1100 (delta encoding)", len(d))
	}
	if len(h) > 8000+20 {
		t.Errorf("hashed keys took %d bytes, want ≤ 8020 (fixed encoding)", len(h))
	}
}

func TestLookupRequestRejects(t *testing.T) {
	good := AppendLookupRequest(nil, "m", 1, []Section{{Partition: 2, Keys: []uint64{1, 2, 3}}})
	cases := map[string][]byte{
		"empty":         {},
		"bad magic":     append([]byte{0x00}, good[1:]...),
		"bad version":   append([]byte{magicRequest, 9}, good[2:]...),
		"truncated":     good[:len(good)-1],
		"trailing":      append(slices.Clone(good), 0),
		"huge sections": {magicRequest, 1, 1, 'm', 1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"huge keys":     {magicRequest, 1, 1, 'm', 1, 1, 0, 0xff, 0xff, 0x7f, KeysFixed},
		"bad encoding":  {magicRequest, 1, 1, 'm', 1, 1, 0, 1, 9, 1},
	}
	var r LookupRequest
	for name, b := range cases {
		if err := r.Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestLookupResponseRoundTrip(t *testing.T) {
	const n, w = 20, 3
	found := []uint64{0b1010_0110_0000_1111_0001}
	var values []float32
	for i := 0; i < n; i++ {
		if found[0]>>i&1 == 1 {
			values = append(values, float32(i), float32(-i), float32(i)/2)
		}
	}
	b := AppendLookupResponse(nil, n, w, found, values)
	var r LookupResponse
	if err := r.Decode(b, n, w, EncFP32); err != nil {
		t.Fatal(err)
	}
	k := 0
	for i := 0; i < n; i++ {
		if r.Found(i) != (found[0]>>i&1 == 1) {
			t.Fatalf("Found(%d) wrong", i)
		}
		if r.Found(i) {
			if r.Value(k, 0) != float32(i) || r.Value(k, 1) != float32(-i) || r.Value(k, 2) != float32(i)/2 {
				t.Fatalf("values of key %d wrong", i)
			}
			k++
		}
	}
	if err := r.Decode(b, n+1, w, EncFP32); !errors.Is(err, ErrCorrupt) {
		t.Errorf("count mismatch accepted: %v", err)
	}
	if err := r.Decode(b[:len(b)-1], n, w, EncFP32); !errors.Is(err, ErrCorrupt) {
		t.Errorf("truncated accepted: %v", err)
	}
	// A bit past the key count would make the values misalign.
	bad := AppendLookupResponse(nil, 3, 1, []uint64{0b1001}, []float32{1, 2})
	if err := r.Decode(bad, 3, 1, EncFP32); !errors.Is(err, ErrCorrupt) {
		t.Errorf("stray bitmap bit accepted: %v", err)
	}
}

func TestLookupDecodeAllocs(t *testing.T) {
	keys := make([]uint64, 5000)
	for i := range keys {
		keys[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	req := AppendLookupRequest(nil, "model", 7, []Section{{0, keys[:2500]}, {1, keys[2500:]}})
	var r LookupRequest
	if err := r.Decode(req); err != nil {
		t.Fatal(err)
	}
	found := make([]uint64, (len(keys)+63)/64)
	for i := range found {
		found[i] = ^uint64(0)
	}
	resp := AppendLookupResponse(nil, len(keys), 1, found, make([]float32, len(keys)))
	var lr LookupResponse
	buf := make([]byte, 0, len(req))
	allocs := testing.AllocsPerRun(100, func() {
		if err := r.Decode(req); err != nil {
			t.Fatal(err)
		}
		if err := lr.Decode(resp, len(keys), 1, EncFP32); err != nil {
			t.Fatal(err)
		}
		buf = AppendLookupRequest(buf[:0], "model", 7, r.Sections)
	})
	if allocs != 0 {
		t.Errorf("decode+encode allocated %.1f times per run, want 0", allocs)
	}
	if !bytes.Equal(buf, req) {
		t.Error("re-encoding differs")
	}
}

func FuzzLookupRequest(f *testing.F) {
	f.Add(AppendLookupRequest(nil, "m", 1, []Section{{2, []uint64{1, 2, 3}}}))
	f.Add(AppendLookupRequest(nil, "model", 9, []Section{{0, []uint64{math.MaxUint64, 7}}, {5, nil}}))
	f.Add(AppendStoredLookupRequest(nil, "model", 9, []Section{{0, []uint64{math.MaxUint64, 7}}, {5, nil}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r LookupRequest
		if err := r.Decode(b); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		// Whatever decodes must re-encode to something that decodes the same.
		again := AppendLookupRequest(nil, string(r.Model), r.Version, r.Sections)
		if r.Stored {
			again = AppendStoredLookupRequest(nil, string(r.Model), r.Version, r.Sections)
		}
		var r2 LookupRequest
		if err := r2.Decode(again); err != nil {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
		if len(r2.Sections) != len(r.Sections) || r2.NumKeys() != r.NumKeys() || r2.Stored != r.Stored {
			t.Fatal("re-encoded request differs")
		}
		for i := range r.Sections {
			if !slices.Equal(r.Sections[i].Keys, r2.Sections[i].Keys) {
				t.Fatal("re-encoded keys differ")
			}
		}
	})
}

func FuzzLookupResponse(f *testing.F) {
	f.Add(AppendLookupResponse(nil, 3, 2, []uint64{0b101}, []float32{1, 2, 3, 4}), 3, 2, uint8(0))
	f.Add(AppendLookupResponse(nil, 0, 1, nil, nil), 0, 1, uint8(0))
	for _, e := range []Encoding{EncFP16, EncInt8} {
		b, at := StartStoredResponse(nil, 3, 3, e)
		b = append(b, make([]byte, 2*(RecordSize(3, e)-8))...)
		FinishLookupResponse(b, at, 3, []uint64{0b101})
		f.Add(b, 3, 3, uint8(e))
	}
	f.Fuzz(func(t *testing.T, b []byte, n, w int, e uint8) {
		if n < 0 || n > 1<<20 || w < 1 || w > 1024 || Encoding(e) > EncInt8 {
			return
		}
		var r LookupResponse
		if err := r.Decode(b, n, w, Encoding(e)); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		k := 0
		for i := 0; i < n; i++ {
			if r.Found(i) {
				_ = r.Value(k, w-1) // must be in bounds
				k++
			}
		}
	})
}

// BenchmarkLookupRequest reports encoded bytes per key for dense ids
// (sorted, gaps of ~40: what a partition of a 0..N id space looks like)
// and for hashed 64-bit ids.
func BenchmarkLookupRequest(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	dense := make([]uint64, 5000)
	for i := range dense {
		dense[i] = uint64(i*40) + rng.Uint64N(40)
	}
	hashed := make([]uint64, 5000)
	for i := range hashed {
		hashed[i] = rng.Uint64()
	}
	for _, c := range []struct {
		name string
		keys []uint64
	}{{"dense", dense}, {"hashed", hashed}} {
		b.Run(c.name, func(b *testing.B) {
			var buf []byte
			var r LookupRequest
			for b.Loop() {
				buf = AppendLookupRequest(buf[:0], "model", 1, []Section{{Partition: 0, Keys: c.keys}})
				if err := r.Decode(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(buf))/float64(len(c.keys)), "bytes/key")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(c.keys)), "ns/key")
		})
	}
}

// FuzzParseExtraRequest: a request is refused, or decodes to what
// encodes back to the same bytes.
func FuzzParseExtraRequest(f *testing.F) {
	f.Add(AppendExtraRequest(nil, "ctr", 7, RoleDense))
	f.Add(AppendExtraRequest(nil, "", 0, ""))
	f.Add([]byte{magicExtra, wireVersion, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		model, version, role, err := ParseExtraRequest(b)
		if err != nil {
			return
		}
		if len(model) > 128 || len(role) > 32 {
			t.Fatalf("accepted a name of %d bytes, a role of %d", len(model), len(role))
		}
		if again := AppendExtraRequest(nil, model, version, role); string(again) != string(b) {
			t.Fatalf("%q decodes to (%q, %d, %q), which encodes to %q", b, model, version, role, again)
		}
	})
}
