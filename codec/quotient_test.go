package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// quotientKeys is n distinct keys, random but for the awkward ones: 0 and
// the largest h, and pairs of keys whose h are neighbours across a
// bucket's boundary (h and h+1 in different buckets), where the stored
// place is smallest and largest.
func quotientKeys(n int, seed uint64) []uint64 {
	nb := uint64(quotBuckets(n))
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	seen := map[uint64]bool{}
	var keys []uint64
	add := func(h uint64) {
		if k := KeyUnhash(h); !seen[k] && len(keys) < n {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	add(0)
	add(math.MaxUint64)
	for range 64 {
		// The first h of a random bucket b: ⌈b·2^64/nb⌉.
		b := rng.Uint64N(nb-1) + 1
		first, r := bits.Div64(b, 0, nb)
		if r != 0 {
			first++
		}
		add(first - 1)
		add(first)
	}
	for len(keys) < n {
		add(rng.Uint64())
	}
	return keys
}

// TestQuotientedKeys: narrow records of at least 256 buckets are written
// in format 4, 7 key bytes a record from 256 buckets and 6 from 65,536,
// and every record reads back with its exact h, in order, and its values.
func TestQuotientedKeys(t *testing.T) {
	for _, c := range []struct {
		n, width, keyBytes int
		e                  Encoding
	}{
		{4080, 1, 0, EncFP32}, // 255 buckets: whole keys
		{4081, 1, 7, EncFP32},
		{70000, 3, 7, EncFP16},
		{20000, 9, 7, EncInt8},
		{1<<19 - 1, 1, 7, EncFP32}, // 32,768 buckets
		{1 << 19, 1, 6, EncFP32},   // 65,536 buckets, not 32,768: 6-byte keys
		{1<<20 + 1, 1, 6, EncFP32},
	} {
		keys := quotientKeys(c.n, 1)
		vals := make([]float32, c.n*c.width)
		rng := rand.New(rand.NewPCG(2, uint64(c.n)))
		for i := range vals {
			vals[i] = rng.Float32() - 0.5
		}
		var buf bytes.Buffer
		sum, err := WritePartition(&buf, 0, c.width, c.e, keys, vals)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ParsePartition(buf.Bytes())
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		wantFormat, wantSize := 4, RecordSize(c.width, c.e)-8+c.keyBytes
		if c.keyBytes == 0 {
			wantFormat, wantSize = 2, RecordSize(c.width, c.e)
		}
		if p.Format != wantFormat || p.StoredSize != wantSize || QuotientBytes(p.Buckets) != c.keyBytes || p.Buckets != bucketsOf(c.n, p.Format) ||
			sum.Size != PartitionFileSize(c.n, c.width, c.e, DefaultBlockSize) || !PartitionSizeValid(sum.Size, c.n, c.width, c.e, DefaultBlockSize) {
			t.Fatalf("%+v: format %d, record %d bytes, %d buckets; file %d bytes", c, p.Format, p.StoredSize, p.Buckets, sum.Size)
		}
		hs := make([]uint64, c.n)
		byH := map[uint64]int{}
		for i, k := range keys {
			hs[i] = KeyHash(k)
			byH[hs[i]] = i
		}
		slices.Sort(hs)
		got := make([]float32, c.width)
		for i := range p.Count {
			if h := p.Hash(i); h != hs[i] {
				t.Fatalf("%+v: record %d reads h %#x, wrote %#x", c, i, h, hs[i])
			}
			j := byH[hs[i]]
			p.Values(i, got)
			for v := range got {
				if d := math.Abs(float64(got[v] - vals[j*c.width+v])); d > maxErr(c.e, vals[j*c.width:(j+1)*c.width], v) {
					t.Fatalf("%+v: record %d value %d: %v, wrote %v", c, i, v, got[v], vals[j*c.width+v])
				}
			}
		}
	}
}

// TestQuotientedFormatChecks: a format 4 file is refused whole where its
// header disagrees with the layout (a record size for whole keys, or
// format 4 below 256 buckets), and every single-byte corruption of one
// is refused.
func TestQuotientedFormatChecks(t *testing.T) {
	b, _, _ := writeTestPartition(t, 4100, 1, EncFP32)
	if p, err := ParsePartition(b); err != nil || p.Format != 4 {
		t.Fatalf("format 4 file: %v", err)
	}
	testCorruption(t, b)

	// Whole keys, but labelled format 4: the record size disagrees.
	hs := make([]uint64, 4100)
	for i := range hs {
		hs[i] = KeyHash(uint64(i))
	}
	slices.Sort(hs)
	rec := func(r []byte, i int) { EncodeRecord(r, hs[i], []float32{1}, EncFP32) }
	var buf bytes.Buffer
	if _, err := writeSorted(&buf, 0, 1, EncFP32, partFormat, hs, rec); err != nil {
		t.Fatal(err)
	}
	relabel := func(b []byte, f uint32) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint32(b[8:], f)
		binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
		return b
	}
	if _, err := ParsePartition(relabel(buf.Bytes(), 4)); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "record size") {
		t.Fatalf("whole keys labelled format 4: %v", err)
	}
	// Format 4 with too few buckets for a quotient.
	small, _, _ := writeTestPartition(t, 300, 1, EncFP32)
	if _, err := ParsePartition(relabel(small, 4)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("format 4 with 19 buckets: %v", err)
	}
	// A record size of 0, in a format that cannot hold the record (found
	// by review: the finite check then looped forever on a file whose
	// checksums are right, and a table found every key at record 0).
	for _, f := range []uint32{1, 4, 5} {
		b := bytes.Clone(small)
		binary.LittleEndian.PutUint32(b[36:], 0)
		b = relabel(b, f)
		if _, err := ParsePartition(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("format %d, record size 0: ParsePartition: %v", f, err)
		}
		if _, err := VerifyStream(bytes.NewReader(b), int64(len(b))); !errors.Is(err, ErrCorrupt) {
			t.Errorf("format %d, record size 0: VerifyStream: %v", f, err)
		}
	}
	// A header whose bucket count is not the records' (a crafted file
	// whose checksums are right would have its finite check read the
	// wrong bytes): VerifyStream refuses it before reading a block, as
	// ParsePartition does.
	for _, nb := range []uint64{uint64(Buckets(4100)) - 1, 1 << 16} {
		b := bytes.Clone(buf.Bytes())
		binary.LittleEndian.PutUint64(b[40:], nb)
		b = relabel(b, 2)
		if _, err := VerifyStream(bytes.NewReader(b), int64(len(b))); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "buckets disagree") {
			t.Errorf("%d buckets for 4,100 records: VerifyStream: %v", nb, err)
		}
		if _, err := ParsePartition(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%d buckets for 4,100 records: ParsePartition: %v", nb, err)
		}
	}
	// A format 2 file of as many records (what earlier builds wrote) is
	// still read, and its size is valid for a manifest.
	p, err := ParsePartition(buf.Bytes())
	if err != nil || p.Format != 2 || !PartitionSizeValid(int64(buf.Len()), 4100, 1, EncFP32, DefaultBlockSize) {
		t.Fatalf("format 2 of 4,100 records: %v", err)
	}
	for i := range p.Count {
		if p.Hash(i) != hs[i] {
			t.Fatalf("format 2 record %d", i)
		}
	}
}

// TestQuotientedFinite: the finite gate reads format 4's records and
// names the feature of a bad value, also in a record that straddles two
// checksum blocks.
func TestQuotientedFinite(t *testing.T) {
	const n, width = 300000, 2 // FM dim 1 in fp16: 6 value bytes and a 7-byte key (18,750 buckets)
	keys := quotientKeys(n, 3)
	hs := make([]uint64, n)
	for i, k := range keys {
		hs[i] = KeyHash(k)
	}
	slices.Sort(hs)
	stored := StoredRecordSize(n, width, EncFP16)
	start := int64(partHeaderSize) + dirBytes(Buckets(n))
	straddling := int((DefaultBlockSize - start) / int64(stored))
	for _, at := range []int{0, 17, straddling, n - 1} {
		target := KeyUnhash(hs[at])
		vals := make([]float32, n*width)
		for i, k := range keys {
			if k == target {
				vals[i*width+1] = float32(math.Inf(1))
			}
		}
		var buf bytes.Buffer
		if _, err := WritePartition(&buf, 0, width, EncFP16, keys, vals); err != nil {
			t.Fatal(err)
		}
		_, err := VerifyStream(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if !errors.Is(err, ErrNotFinite) || !strings.Contains(err.Error(), fmt.Sprintf("feature id %d", target)) {
			t.Errorf("record %d: %v does not name feature %d", at, err, target)
		}
	}
}
