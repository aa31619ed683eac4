package shard

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

func buildTable(t testing.TB, keys []uint64, width int, e codec.Encoding, values []float32) *Table {
	t.Helper()
	return buildTableWith(t, codec.WritePartition, keys, width, e, values)
}

// buildTableWith is buildTable with the file written by write
// (codec.WriteWholeKeys: whole keys at any size, as earlier builds wrote).
func buildTableWith(t testing.TB, write func(io.Writer, uint32, int, codec.Encoding, []uint64, []float32) (codec.FileSum, error),
	keys []uint64, width int, e codec.Encoding, values []float32) *Table {
	t.Helper()
	var buf bytes.Buffer
	if _, err := write(&buf, 0, width, e, keys, values); err != nil {
		t.Fatal(err)
	}
	p, err := codec.ParsePartition(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return NewTable(p)
}

// An absent feature reads as absent, never as another feature's weight;
// key 0 and the largest key are ordinary keys; a batch may repeat keys.
func TestTableExactMembership(t *testing.T) {
	keys := []uint64{0, 1, 2, 1000, math.MaxUint64, math.MaxUint64 - 1, 1 << 32}
	vals := []float32{10, 11, 12, 13, 14, 15, 16}
	tb := buildTable(t, keys, 1, codec.EncFP32, vals)
	query := []uint64{math.MaxUint64, 3, 0, 0, 999, 1 << 32, 1<<32 + 1, math.MaxUint64 - 2, 2, 2}
	want := []float32{14, -1, 10, 10, -1, 16, -1, -1, 12, 12}
	out := make([]int32, len(query))
	tb.Find(query, out)
	v := make([]float32, 1)
	for j, q := range query {
		ok := tb.Get(q, v)
		if want[j] < 0 {
			if out[j] != -1 || ok {
				t.Errorf("absent key %d: Find %d, Get %v", q, out[j], ok)
			}
			continue
		}
		if out[j] < 0 || !ok || v[0] != want[j] {
			t.Errorf("key %d: Find %d, Get %v %v, want %v", q, out[j], ok, v[0], want[j])
			continue
		}
		tb.Decode(int(out[j]), v)
		if v[0] != want[j] {
			t.Errorf("key %d: decoded %v, want %v", q, v[0], want[j])
		}
	}
	empty := buildTable(t, nil, 1, codec.EncFP32, nil)
	empty.Find(query, out)
	for j := range out {
		if out[j] != -1 || empty.Get(query[j], v) {
			t.Fatal("empty table found a key")
		}
	}
}

// The table agrees with a Go map on many random keys, present and not,
// in every encoding, with records whole (width 5) and keys apart from
// values (width 33: format 3 in fp32 and fp16; int8 stays whole).
func TestTableMatchesMap(t *testing.T) {
	for _, width := range []int{5, 33} {
		tableMatchesMap(t, width)
	}
}

func tableMatchesMap(t *testing.T, width int) {
	rng := rand.New(rand.NewPCG(7, 7))
	const n = 200000
	keys := make([]uint64, n)
	vals := make([]float32, n*width)
	ref := make(map[uint64]int, n)
	for i := range keys {
		for {
			keys[i] = rng.Uint64() >> rng.UintN(40) // clustered and spread ids
			if _, dup := ref[keys[i]]; !dup {
				break
			}
		}
		ref[keys[i]] = i
	}
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	for _, e := range []codec.Encoding{codec.EncFP32, codec.EncFP16, codec.EncInt8} {
		tb := buildTable(t, keys, width, e, vals)
		if tb.split != codec.SplitKeys(width, e) {
			t.Fatalf("width %d %v: keys apart %v", width, e, tb.split)
		}
		query := make([]uint64, 50000)
		for j := range query {
			if j%3 == 0 {
				query[j] = rng.Uint64()
			} else {
				query[j] = keys[rng.IntN(n)]
			}
		}
		out := make([]int32, len(query))
		tb.Find(query, out)
		got := make([]float32, width)
		for j, q := range query {
			i, present := ref[q]
			if present != (out[j] >= 0) {
				t.Fatalf("%v: key %d present=%v, Find=%d", e, q, present, out[j])
			}
			if !present {
				continue
			}
			tb.Decode(int(out[j]), got)
			if got[0] != vals[i*width] {
				t.Fatalf("%v: key %d weight %v, want %v", e, q, got[0], vals[i*width])
			}
			if e == codec.EncFP32 {
				for f := 1; f < width; f++ {
					if got[f] != vals[i*width+f] {
						t.Fatalf("key %d factor %d: %v, want %v", q, f, got[f], vals[i*width+f])
					}
				}
			}
		}
	}
}

func TestTableFindAllocs(t *testing.T) {
	keys := make([]uint64, 10000)
	for i := range keys {
		keys[i] = uint64(i) * 7919
	}
	tb := buildTable(t, keys, 1, codec.EncFP32, make([]float32, len(keys)))
	out := make([]int32, len(keys))
	v := make([]float32, 1)
	if n := testing.AllocsPerRun(50, func() { tb.Find(keys, out); tb.Decode(int(out[9]), v) }); n != 0 {
		t.Errorf("Find allocated %.1f times per batch, want 0", n)
	}
}

func TestFindWeights(t *testing.T) {
	keys := []uint64{5, 6, 7, 0}
	tb := buildTable(t, keys, 1, codec.EncFP32, []float32{0.5, 0.6, 0.7, 0.9})
	q := []uint64{7, 8, 0, 5, 5}
	idx := make([]int32, len(q))
	w := []float32{9, 9, 9, 9, 9}
	tb.FindWeights(q, idx, w)
	want := []float32{0.7, 0, 0.9, 0.5, 0.5}
	for j := range q {
		if w[j] != want[j] || (idx[j] < 0) != (want[j] == 0) {
			t.Errorf("key %d: idx %d weight %v, want %v", q[j], idx[j], w[j], want[j])
		}
	}
}

func TestReadColdMatchesFind(t *testing.T) {
	for _, c := range []struct {
		shape model.Shape
		enc   string
	}{
		{model.Shape{Type: model.LR}, ""},
		{model.Shape{Type: model.FM, Dim: 4}, ""},
		{model.Shape{Type: model.FM, Dim: 32}, ""},
		{model.Shape{Type: model.FM, Dim: 32}, "fp16"},
		{model.Shape{Type: model.FM, Dim: 7}, "int8"},
		{model.Shape{Type: model.FFM, Dim: 4, Fields: 5}, "int8"},
	} {
		readColdMatchesFind(t, c.shape, c.enc)
	}
}

// diskTable publishes a model of shape in encoding enc, 200,000 keys
// k²+k (weight k, factors from k), in one partition, and returns it as a
// table served from disk, with the repository and manifest.
func diskTable(t testing.TB, shape model.Shape, enc string) (*Table, loader.Repo, *codec.Manifest) {
	t.Helper()
	repo := loader.Repo{Dir: t.TempDir()}
	m := &loader.Sparse{Shape: shape}
	for k := uint64(0); k < 200000; k++ {
		m.Keys = append(m.Keys, k*k+k)
		m.Values = append(m.Values, float32(k))
		for d := range shape.Width() - 1 {
			m.Values = append(m.Values, float32(k%97)/97-float32(d)/64)
		}
	}
	man, err := repo.PublishEncoded("m", m, 1, enc, "")
	if err != nil {
		t.Fatal(err)
	}
	p, err := repo.MapPartitionCopy(man, 0, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tb := NewTable(p)
	if !tb.Mapped || tb.file == nil {
		t.Fatal("not a mapped table")
	}
	return tb, repo, man
}

// diskReader is a way to read from disk, named.
type diskReader struct {
	name string
	r    *ColdReads
}

// diskReaders is ColdReads of n turns reading both ways: through
// io_uring, and with preads. A kernel that refuses io_uring (this
// project's CI machine allows it) leaves preads only, and says so.
func diskReaders(t testing.TB, n int) []diskReader {
	rs := []diskReader{{"pread", NewColdReads(n).Pread()}}
	if NewColdReads(n).rings() != nil {
		rs = append(rs, diskReader{"io_uring", NewColdReads(n)})
	} else {
		t.Logf("reads through io_uring not tested: %s", DiskReadsMode())
	}
	return rs
}

// readColdMatchesFind: narrow records (LR, FM of dim 4) kept whole, the
// value read with its bucket; wide ones (FM of dim 32) keys apart from
// values (format 3), so cold reads read the keys, then the value. Read
// from disk, then through the value cache once it learned the keys,
// every answer equals the resident one, value bytes included, in every
// encoding.
func readColdMatchesFind(t *testing.T, shape model.Shape, enc string) {
	tb, repo, man := diskTable(t, shape, enc)
	rng := rand.New(rand.NewPCG(3, 3))
	keys := make([]uint64, 20000)
	for j := range keys {
		k := rng.Uint64N(200000)
		if j%3 == 0 {
			k = rng.Uint64N(300) // a hot set, asked for again and again
		}
		keys[j] = k*k + k + uint64(j%2) // odd j: almost always absent
	}
	warm := make([]int32, len(keys))
	tb.Find(keys, warm)
	check := func(what string, r *ColdReads) {
		t.Helper()
		cold := make([]int32, len(keys))
		vals := make([]byte, len(keys)*tb.vlen)
		if _, err := tb.readCold(context.Background(), keys, cold, vals, nil, r); err != nil {
			t.Fatal(err)
		}
		hits := 0
		for j := range keys {
			if (cold[j] >= 0) != (warm[j] >= 0) {
				t.Fatalf("%s %v, key %d: readCold %d, Find %d", what, shape, keys[j], cold[j], warm[j])
			}
			if cold[j] < 0 {
				continue
			}
			hits++
			if got, want := vals[j*tb.vlen:(j+1)*tb.vlen], tb.valAt(int(warm[j])); !bytes.Equal(got, want) {
				t.Fatalf("%s %v, key %d: value %x, want %x", what, shape, keys[j], got, want)
			}
		}
		if hits < 9000 {
			t.Fatalf("%s: only %d hits: the test is not exercising present keys", what, hits)
		}
	}
	for _, r := range diskReaders(t, 8) {
		check("from disk, "+r.name, r.r)
		// Many keys at once, buckets near each other read together.
		spans := make([]int32, len(keys))
		vals := make([]byte, len(keys)*tb.vlen)
		if err := tb.readSpans(context.Background(), keys, spans, vals, r.r); err != nil {
			t.Fatal(err)
		}
		for j := range keys {
			if (spans[j] >= 0) != (warm[j] >= 0) || spans[j] >= 0 && !bytes.Equal(vals[j*tb.vlen:(j+1)*tb.vlen], tb.valAt(int(warm[j]))) {
				t.Fatalf("readSpans %s %v, key %d: %d, Find %d", r.name, shape, keys[j], spans[j], warm[j])
			}
		}
	}
	stackMatches(t, NewTable(must(repo.ReadPartition(man, 0))), tb, keys, shape, enc)
	// The cache learns from these keys: the hot ones come to it, and it
	// keeps within the bytes it is given.
	budget := 8000 * slotBytes(tb.vlen)
	if !tb.EnableCache(budget) {
		t.Fatal("no cache fits")
	}
	for range 8 {
		tb.Sample(keys)
		tb.Learn()
	}
	if got := tb.CacheBytes(); got > budget || got < budget/4 {
		t.Errorf("%v: a cache of %d bytes for a budget of %d", shape, got, budget)
	}
	cached := 0
	for k := range uint64(300) {
		if tb.cache.Load().has(codec.KeyHash(k*k + k)) {
			cached++
		}
	}
	if cached < 290 {
		t.Errorf("%v: the cache holds %d of the 300 hot keys (and %d keys in all)", shape, cached, tb.CachedKeys())
	}
	check("through the cache", nil)
}

// stackMatches: a stack lookup (the shard's path) answers the same
// bytes from the table on disk as from the same file resident, as
// float32s and as stored.
func stackMatches(t *testing.T, res, disk *Table, keys []uint64, shape model.Shape, enc string) {
	t.Helper()
	for _, stored := range []bool{false, true} {
		var out [2][]byte
		for i, tb := range []*Table{res, disk} {
			var sc scratch
			sc.stored = stored
			sc.found = make([]uint64, (len(keys)+63)/64)
			if _, err := sc.lookupStack(context.Background(), nil, []*Table{tb}, keys, shape.Width(), 0); err != nil {
				t.Fatal(err)
			}
			out[i] = append(binary.LittleEndian.AppendUint64(nil, uint64(len(sc.found))), sc.vals...)
			for _, w := range sc.found {
				out[i] = binary.LittleEndian.AppendUint64(out[i], w)
			}
		}
		if !bytes.Equal(out[0], out[1]) {
			t.Fatalf("%v %s stored=%v: the stack's answer from disk differs from the resident one", shape, enc, stored)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestReadColdAllocs: reading keys from disk allocates per call (its
// readers), not per key read: 2,000 reads take under 500 allocations.
// (Each read allocated twice when a reader's error escaped to the heap.)
func TestReadColdAllocs(t *testing.T) {
	tb, _, _ := diskTable(t, model.Shape{Type: model.LR}, "")
	keys := make([]uint64, 2000)
	for j := range keys {
		k := uint64(97 * j)
		keys[j] = k*k + k
	}
	out := make([]int32, len(keys))
	vals := make([]byte, len(keys)*tb.vlen)
	var miss []int32
	var err error
	allocs := testing.AllocsPerRun(20, func() {
		if miss, err = tb.readCold(context.Background(), keys, out, vals, miss, nil); err != nil {
			t.Fatal(err)
		}
	})
	if len(miss) != len(keys) || allocs >= 500 {
		t.Fatalf("%v allocations to read %d keys from disk", allocs, len(miss))
	}
}

// readerAt is an io.ReaderAt of a function.
type readerAt func(p []byte, off int64) (int, error)

func (f readerAt) ReadAt(p []byte, off int64) (int, error) { return f(p, off) }

// TestReadAllWidth: a batch has as many reads in flight as its ColdReads
// allows (standby warming's, one), and coldReaders with none.
func TestReadAllWidth(t *testing.T) {
	for _, tc := range []struct {
		r    *ColdReads
		most int
	}{{NewColdReads(1), 1}, {NewColdReads(3), 3}, {nil, coldReaders}} {
		var in, most atomic.Int32
		release := make(chan struct{})
		go func() {
			// Let the reads pile up to the bound (or for 10s, if they
			// never reach it), then go.
			deadline := time.Now().Add(10 * time.Second)
			for in.Load() < int32(tc.most) && time.Now().Before(deadline) {
				runtime.Gosched()
			}
			close(release)
		}()
		read := readerAt(func(p []byte, off int64) (int, error) {
			n := in.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			in.Add(-1)
			return len(p), nil
		})
		err := preadAll(context.Background(), tc.r, func(int) (io.ReaderAt, string) { return read, "test" }, 200, func(i int, data []byte) (int64, int, error) {
			if data == nil {
				return int64(i), 1, nil
			}
			return 0, 0, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := int(most.Load()); got != tc.most {
			t.Errorf("a pool of width %d: %d reads at once, want %d", tc.r.width(), got, tc.most)
		}
	}
}
