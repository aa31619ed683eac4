package codec

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func writeTestPartition(t testing.TB, n, width int) ([]byte, []uint64, []float32) {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(width)))
	keys := make([]uint64, n)
	values := make([]float32, n*width)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	for i := range values {
		values[i] = rng.Float32() - 0.5
	}
	var buf bytes.Buffer
	sum, err := WritePartition(&buf, 3, width, keys, values)
	if err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if sum.Size != int64(len(b)) || sum.Size != PartitionFileSize(n, width, DefaultBlockSize) {
		t.Fatalf("size %d, file %d, formula %d", sum.Size, len(b), PartitionFileSize(n, width, DefaultBlockSize))
	}
	h := sha256.Sum256(b)
	if sum.SHA256 != hex.EncodeToString(h[:]) {
		t.Fatal("reported SHA-256 does not match the bytes")
	}
	return b, keys, values
}

func TestPartitionRoundTrip(t *testing.T) {
	for _, c := range []struct{ n, width int }{{0, 1}, {1, 1}, {1000, 1}, {70000, 9}} {
		b, keys, values := writeTestPartition(t, c.n, c.width)
		p, err := ParsePartition(b)
		if err != nil {
			t.Fatalf("n=%d w=%d: %v", c.n, c.width, err)
		}
		if p.Count != c.n || p.Width != c.width || p.Number != 3 {
			t.Fatalf("header %+v", p)
		}
		for i := range keys {
			if p.Key(i) != keys[i] {
				t.Fatalf("key %d differs", i)
			}
			for j := 0; j < c.width; j++ {
				if p.Value(i, j) != values[i*c.width+j] {
					t.Fatalf("value %d,%d differs", i, j)
				}
			}
		}
	}
}

// Every single-byte change anywhere in the file, and every truncation, is
// detected.
func TestPartitionCorruption(t *testing.T) {
	b, _, _ := writeTestPartition(t, 300, 2) // 64 + 2400 + 2400 + 4 + 16 bytes
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

func TestPartitionBlockError(t *testing.T) {
	b, _, _ := writeTestPartition(t, 200000, 1) // 2.4 MB: three blocks
	bad := bytes.Clone(b)
	bad[DefaultBlockSize+100] ^= 1
	_, err := ParsePartition(bad)
	if err == nil || !strings.Contains(err.Error(), "block 1") {
		t.Fatalf("err = %v, want it to name block 1", err)
	}
}

func FuzzParsePartition(f *testing.F) {
	b, _, _ := writeTestPartition(f, 5, 2)
	f.Add(b)
	b, _, _ = writeTestPartition(f, 0, 1)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePartition(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if p.Count > 0 {
			_ = p.Key(p.Count - 1)
			_ = p.Value(p.Count-1, p.Width-1)
		}
	})
}
