package codec

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func writeTestPartition(t testing.TB, n, width int, e Encoding) ([]byte, []uint64, []float32) {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(width)))
	keys := make([]uint64, n)
	values := make([]float32, n*width)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	if n > 2 {
		keys[0], keys[1] = 0, math.MaxUint64
	}
	for i := range values {
		values[i] = rng.Float32() - 0.5
	}
	var buf bytes.Buffer
	sum, err := WritePartition(&buf, 3, width, e, keys, values)
	if err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if sum.Size != int64(len(b)) || sum.Size != PartitionFileSize(n, width, e, DefaultBlockSize) {
		t.Fatalf("size %d, file %d, formula %d", sum.Size, len(b), PartitionFileSize(n, width, e, DefaultBlockSize))
	}
	h := sha256.Sum256(b)
	if sum.SHA256 != hex.EncodeToString(h[:]) {
		t.Fatal("reported SHA-256 does not match the bytes")
	}
	return b, keys, values
}

func TestKeyHashBijection(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, k := range []uint64{0, 1, 2, math.MaxUint64, 1 << 63} {
		if KeyUnhash(KeyHash(k)) != k {
			t.Fatalf("KeyUnhash(KeyHash(%d)) = %d", k, KeyUnhash(KeyHash(k)))
		}
	}
	for range 100000 {
		k := rng.Uint64()
		if KeyUnhash(KeyHash(k)) != k {
			t.Fatalf("KeyUnhash(KeyHash(%d)) = %d", k, KeyUnhash(KeyHash(k)))
		}
	}
}

// maxErr is the documented error bound of encoding e for a record.
func maxErr(e Encoding, v []float32, j int) float64 {
	if j == 0 {
		return 0 // the linear weight is always fp32
	}
	switch e {
	case EncFP16:
		return math.Abs(float64(v[j]))*(1.0/2048) + 1.0/(1<<25) // half an ulp; subnormals below 2^-14
	case EncInt8:
		m := 0.0
		for _, x := range v[1:] {
			m = math.Max(m, math.Abs(float64(x)))
		}
		return m/254 + 1e-9
	}
	return 0
}

func TestPartitionRoundTrip(t *testing.T) {
	for _, c := range []struct {
		n, width int
		e        Encoding
	}{{0, 1, EncFP32}, {1, 1, EncFP32}, {1000, 1, EncFP32}, {70000, 9, EncFP32}, {5000, 9, EncFP16}, {5000, 17, EncInt8}, {300, 1, EncInt8},
		{5000, 17, EncFP32}, {3000, 81, EncFP16}, {3000, 81, EncInt8}, {1, 17, EncFP32}, {0, 81, EncFP32}} {
		b, keys, values := writeTestPartition(t, c.n, c.width, c.e)
		p, err := ParsePartition(b)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if p.Count != c.n || p.Width != c.width || p.Number != 3 || p.Encoding != c.e {
			t.Fatalf("header %+v", p)
		}
		// Records wider than a cache line are written keys apart (format
		// 3), narrow ones of at least 256 buckets with quotiented keys (4).
		if want := 2 + btoi(RecordSize(c.width, c.e) > 64) + 2*btoi(Quotiented(c.n, c.width, c.e)); p.Format != want || int64(len(b)) != PartitionFileSize(c.n, c.width, c.e, DefaultBlockSize) {
			t.Fatalf("%+v: format %d, want %d; %d bytes", c, p.Format, want, len(b))
		}
		want := map[uint64][]float32{}
		for i, k := range keys {
			want[k] = values[i*c.width : (i+1)*c.width]
		}
		got := make([]float32, c.width)
		for i := 0; i < p.Count; i++ {
			if i > 0 && p.Hash(i) <= p.Hash(i-1) {
				t.Fatalf("records not ascending at %d", i)
			}
			w, ok := want[p.Key(i)]
			if !ok {
				t.Fatalf("record %d has key %d, not written", i, p.Key(i))
			}
			delete(want, p.Key(i))
			p.Values(i, got)
			for j := range got {
				if d := math.Abs(float64(got[j] - w[j])); d > maxErr(c.e, w, j) {
					t.Fatalf("%v key %d value %d: %v, wrote %v (error %g > bound %g)", c.e, p.Key(i), j, got[j], w[j], d, maxErr(c.e, w, j))
				}
			}
		}
		if len(want) != 0 {
			t.Fatalf("%d keys missing", len(want))
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestWideFormat2StillRead: a wide record's file in format 2, as earlier
// builds wrote every file, reads as it did.
func TestWideFormat2StillRead(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	const n, width = 2000, 33
	hs, vals := make([]uint64, n), make([]float32, n*width)
	for i := range hs {
		hs[i] = KeyHash(uint64(i) * 7)
	}
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	var buf bytes.Buffer
	if _, err := writeSorted(&buf, 0, width, EncFP32, partFormat, hs, func(rec []byte, i int) { EncodeRecord(rec, hs[i], vals[i*width:(i+1)*width], EncFP32) }); err != nil {
		t.Fatal(err)
	}
	p, err := ParsePartition(buf.Bytes())
	if err != nil || p.Format != 2 {
		t.Fatalf("format %v, %v", p, err)
	}
	got := make([]float32, width)
	for i := range p.Count {
		j := int(p.Key(i) / 7)
		p.Values(i, got)
		if !slices.Equal(got, vals[j*width:(j+1)*width]) {
			t.Fatalf("record %d (key %d) reads %v", i, p.Key(i), got)
		}
	}
	if _, err := VerifyStream(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
		t.Fatal(err)
	}
}

// Every single-byte change anywhere in the file, and every truncation, is
// detected, in both formats.
func TestPartitionCorruption(t *testing.T) {
	narrow, _, _ := writeTestPartition(t, 300, 3, EncFP16)
	wide, _, _ := writeTestPartition(t, 100, 17, EncFP32)
	for _, b := range [][]byte{narrow, wide} {
		testCorruption(t, b)
	}
}

func testCorruption(t *testing.T, b []byte) {
	for i := 0; i < len(b); i++ {
		bad := bytes.Clone(b)
		bad[i] ^= 0x40
		if _, err := ParsePartition(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flip at byte %d not detected: %v", i, err)
		}
	}
	for _, n := range []int{0, 10, 64, len(b) / 2, len(b) - 1} {
		if _, err := ParsePartition(b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncation to %d not detected: %v", n, err)
		}
	}
	_, err := ParsePartition(append(bytes.Clone(b), 0))
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "size") {
		t.Fatalf("padding not detected: %v", err)
	}
}

func TestPartitionParallelVerifyNamesBlock(t *testing.T) {
	b, _, _ := writeTestPartition(t, 300000, 1, EncFP32) // 3.6 MB: four blocks
	bad := bytes.Clone(b)
	bad[2*DefaultBlockSize+100] ^= 1
	p, err := ParsePartitionStructure(bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.VerifyBlocks(4); err == nil || !strings.Contains(err.Error(), "block 2") {
		t.Fatalf("err = %v, want it to name block 2", err)
	}
	p, _ = ParsePartitionStructure(b)
	if err := p.VerifyBlocks(4); err != nil {
		t.Fatal(err)
	}
}

func TestWritePartitionRefuses(t *testing.T) {
	var buf bytes.Buffer
	if _, err := WritePartition(&buf, 0, 1, EncFP32, []uint64{4, 8, 4}, []float32{1, 2, 3}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate keys: %v", err)
	}
	if _, err := WritePartition(&buf, 0, 2, EncFP32, []uint64{4}, []float32{1}); err == nil {
		t.Error("wrong value count accepted")
	}
	if _, err := WritePartition(&buf, 0, 1, Encoding(7), nil, nil); err == nil {
		t.Error("unknown encoding accepted")
	}
}

// TestCrowdedBucket: keys chosen to share one bucket (hashes below its
// bound) are written in order, and a duplicate among them is refused, as
// in a bucket of usual size.
func TestCrowdedBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var keys []uint64
	for i := range 2000 {
		h := rng.Uint64()
		if i < 300 {
			h >>= 12 // bucket 0 of Buckets(2000)
		}
		keys = append(keys, KeyUnhash(h))
	}
	values := make([]float32, len(keys))
	var buf bytes.Buffer
	if _, err := WritePartition(&buf, 0, 1, EncFP32, keys, values); err != nil {
		t.Fatal(err)
	}
	p, err := ParsePartition(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < p.Count; i++ {
		if p.Hash(i) <= p.Hash(i-1) {
			t.Fatalf("records not ascending at %d of %d", i, p.Count)
		}
	}
	if p.Count != len(keys) {
		t.Fatalf("%d records of %d keys", p.Count, len(keys))
	}
	keys[299] = keys[7]
	if _, err := WritePartition(&buf, 0, 1, EncFP32, keys, values); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a duplicate in the crowded bucket: %v", err)
	}
}

func FuzzParsePartition(f *testing.F) {
	for _, e := range []Encoding{EncFP32, EncFP16, EncInt8} {
		b, _, _ := writeTestPartition(f, 5, 3, e)
		f.Add(b)
	}
	b, _, _ := writeTestPartition(f, 0, 1, EncFP32)
	f.Add(b)
	b, _, _ = writeTestPartition(f, 4, 17, EncFP32) // format 3
	f.Add(b)
	b, _, _ = writeTestPartition(f, 4081, 1, EncFP32) // format 4, 7-byte keys
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePartition(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		v := make([]float32, p.Width)
		for i := range p.Count {
			p.Values(i, v) // must stay in bounds
			_ = p.AppendRecord(nil, i)
		}
	})
}

func TestVerifyStream(t *testing.T) {
	b, _, _ := writeTestPartition(t, 300, 3, EncInt8)
	want := sha256.Sum256(b)
	sum, err := VerifyStream(bytes.NewReader(b), int64(len(b)))
	if err != nil || sum != hex.EncodeToString(want[:]) {
		t.Fatalf("good file: %q, %v", sum, err)
	}
	for i := 0; i < len(b); i++ {
		bad := bytes.Clone(b)
		bad[i] ^= 0x10
		sum, err := VerifyStream(bytes.NewReader(bad), int64(len(bad)))
		if err == nil && sum == hex.EncodeToString(want[:]) {
			t.Fatalf("flip at byte %d passed with the original SHA-256", i)
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flip at byte %d: error %v does not wrap ErrCorrupt", i, err)
		}
	}
	for _, n := range []int{0, 70, len(b) - 1} {
		if _, err := VerifyStream(bytes.NewReader(b[:n]), int64(n)); err == nil {
			t.Fatalf("truncation to %d accepted", n)
		}
	}
}

func FuzzVerifyStream(f *testing.F) {
	b, _, _ := writeTestPartition(f, 20, 2, EncFP16)
	f.Add(b)
	b, _, _ = writeTestPartition(f, 3, 17, EncFP32) // format 3
	f.Add(b)
	b, _, _ = writeTestPartition(f, 4081, 2, EncInt8) // format 4
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		sum, err := VerifyStream(bytes.NewReader(b), int64(len(b))) // must not panic or over-allocate
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotFinite) {
				t.Fatalf("refused without ErrCorrupt or ErrNotFinite: %v", err)
			}
			return
		}
		// Accepted: the hash is the whole file's, and the in-memory check
		// of the same bytes agrees that every block is intact.
		if want := sha256.Sum256(b); sum != hex.EncodeToString(want[:]) {
			t.Fatalf("hash %s is not the file's", sum)
		}
		if p, err := ParsePartitionStructure(b); err == nil {
			if err := p.VerifyBlocks(1); err != nil {
				t.Fatalf("streamed check accepts what the in-memory check refuses: %v", err)
			}
		}
	})
}

// TestRecordValuesOnTheWire: what a shard sends for a record
// (AppendRecordValues) and what a router reads back (Record) are the
// values DecodeRecord gives, for every encoding.
func TestRecordValuesOnTheWire(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, e := range []Encoding{EncFP32, EncFP16, EncInt8} {
		for _, width := range []int{1, 2, 9, 81} {
			rec := make([]byte, RecordSize(width, e))
			vals := make([]float32, width)
			for j := range vals {
				vals[j] = float32(rng.NormFloat64())
			}
			EncodeRecord(rec, 42, vals, e)
			want := make([]float32, width)
			DecodeRecord(want, rec, e)
			wire := AppendRecordValues([]byte{0xee}, rec, width, e)[1:]
			resp := AppendLookupResponseRaw(nil, 2, width, []uint64{0b10}, wire)
			var r LookupResponse
			if err := r.Decode(resp, 2, width, EncFP32); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, width)
			r.Record(0, got)
			for j := range want {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) || r.Value(0, j) != want[j] {
					t.Fatalf("%s width %d value %d: %v on the wire, %v decoded", e, width, j, got[j], want[j])
				}
			}
			// As stored (format 2): the record's bytes less its key, and
			// the same values read back, bit for bit.
			stored, at := StartStoredResponse(nil, 2, width, e)
			stored = append(stored, rec[8:]...)
			FinishLookupResponse(stored, at, 2, []uint64{0b10})
			if err := r.Decode(stored, 2, width, e); err != nil {
				t.Fatal(err)
			}
			if len(r.Values) != RecordSize(width, e)-8 {
				t.Errorf("%s width %d: %d bytes on the wire for a record of %d", e, width, len(r.Values), RecordSize(width, e))
			}
			clear(got)
			r.Record(0, got)
			for j := range want {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) || r.Value(0, j) != want[j] {
					t.Fatalf("%s width %d value %d: %v as stored on the wire, %v decoded", e, width, j, got[j], want[j])
				}
			}
			// A frame in another encoding than the version's is refused.
			for _, other := range []Encoding{EncFP32, EncFP16, EncInt8} {
				if other != e && (width > 1 || other != EncFP32) {
					if err := r.Decode(stored, 2, width, other); !errors.Is(err, ErrCorrupt) {
						t.Errorf("%s record decoded as %s: %v", e, other, err)
					}
				}
			}
		}
	}
}

// TestVerifyFinite: verification (the manager's, streaming) refuses a
// partition holding a NaN or infinite parameter — the finite gate —
// naming the feature, in every encoding and in a record that straddles
// two checksum blocks; a delta's deletion marker passes.
func TestVerifyFinite(t *testing.T) {
	const n, width = 4000, 81 // fp32 records of 332 bytes: some straddle the 1 MiB blocks
	start := int64(partHeaderSize) + dirBytes(Buckets(n))
	straddling := int((DefaultBlockSize - start) / int64(RecordSize(width, EncFP32))) // crosses the first block's end
	verify := func(e Encoding, at int, v float32, j int) error {
		keys := make([]uint64, n)
		vals := make([]float32, n*width)
		for i := range keys {
			keys[i] = uint64(i) * 7919
			for k := range width {
				vals[i*width+k] = 0.01 * float32(k)
			}
		}
		var order []uint64 // records are written sorted by KeyHash: find the one at record index at
		for _, k := range keys {
			order = append(order, KeyHash(k))
		}
		slices.Sort(order)
		target := KeyUnhash(order[at])
		for i, k := range keys {
			if k == target {
				vals[i*width+j] = v
			}
		}
		var buf bytes.Buffer
		if _, err := WritePartition(&buf, 0, width, e, keys, vals); err != nil {
			t.Fatal(err)
		}
		_, err := VerifyStream(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("feature id %d", target)) {
			t.Errorf("%v does not name feature %d", err, target)
		}
		return err
	}
	for _, c := range []struct {
		enc  Encoding
		at   int
		v    float32
		j    int
		fail bool
	}{
		{EncFP32, 5, float32(math.NaN()), 3, true},
		{EncFP32, straddling, float32(math.Inf(1)), 40, true},
		{EncFP32, straddling, float32(math.NaN()), 0, true},
		{EncFP32, 7, Tombstone, 0, false},
		{EncFP32, 7, 1.5, 2, false},
		{EncFP16, 9, float32(math.Inf(-1)), 5, true},
		{EncFP16, 9, 1e6, 5, true}, // beyond fp16's range: infinite once stored
		{EncInt8, 11, float32(math.NaN()), 5, true},
		{EncInt8, 11, Tombstone, 0, false},
	} {
		err := verify(c.enc, c.at, c.v, c.j)
		if c.fail != errors.Is(err, ErrNotFinite) {
			t.Errorf("%s record %d value %d = %v: %v", c.enc, c.at, c.j, c.v, err)
		}
	}
}
