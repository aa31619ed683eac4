package shard

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

// chainCase is a history of deltas on one base: delta i (version i+1)
// was published on parent[i] (0: the base), so rollbacks followed by new
// deltas branch it.
type chainCase struct {
	width  int
	enc    codec.Encoding
	base   *Table
	deltas []*Table
	parent []int
}

// chain is version v's deltas, newest first.
func (c *chainCase) chain(v int) []*Table {
	var out []*Table
	for ; v != 0; v = c.parent[v-1] {
		out = append(out, c.deltas[v-1])
	}
	return out
}

// newChainCase draws a base and n deltas over a small key space, so that
// keys are upserted in several layers and deleted and written again.
func newChainCase(t testing.TB, rng *rand.Rand, width int, enc codec.Encoding, n int) *chainCase {
	c := &chainCase{width: width, enc: enc}
	keySpace := uint64(3000)
	// The key whose hash is 0 has a slot of its own in the overlay.
	zero := codec.KeyUnhash(0)
	draw := func(count int, deletes bool) *Table {
		seen := map[uint64]bool{}
		var keys []uint64
		var vals []float32
		for len(keys) < count {
			k := rng.Uint64N(keySpace)
			if rng.IntN(50) == 0 {
				k = zero
			}
			if seen[k] {
				continue
			}
			seen[k] = true
			keys = append(keys, k)
			v := make([]float32, width)
			for j := range v {
				v[j] = rng.Float32()*2 - 1
			}
			if deletes && rng.IntN(5) == 0 {
				v[0] = codec.Tombstone
				clear(v[1:])
			}
			vals = append(vals, v...)
		}
		return buildTable(t, keys, width, enc, vals)
	}
	c.base = draw(2000, false)
	for i := range n {
		p := i // on the newest version, mostly
		if i > 0 && rng.IntN(4) == 0 {
			p = rng.IntN(i + 1) // a rollback, then a delta
		}
		c.parent = append(c.parent, p)
		c.deltas = append(c.deltas, draw(1+rng.IntN(300), true))
	}
	return c
}

// answer looks keys up in a stack the way a shard does and returns the
// response's presence bits and values.
func answer(v *view, layers []*Table, keys []uint64, width int) ([]bool, []float32) {
	var sc scratch
	sc.found = make([]uint64, (len(keys)+63)/64)
	if _, err := sc.lookupStack(context.Background(), v, layers, keys, width, 0); err != nil {
		panic(err)
	}
	found := make([]bool, len(keys))
	var vals []float32
	for j := range keys {
		found[j] = sc.found[j>>6]>>(j&63)&1 == 1
	}
	for o := 0; o < len(sc.vals); o += 4 {
		vals = append(vals, math.Float32frombits(binary.LittleEndian.Uint32(sc.vals[o:])))
	}
	return found, vals
}

// reference walks a chain (deltas newest first, then the base) key by key.
func reference(chain []*Table, base *Table, keys []uint64, width int) ([]bool, []float32) {
	found := make([]bool, len(keys))
	var vals []float32
	v := make([]float32, width)
	for j, k := range keys {
		for _, t := range append(slices.Clone(chain), base) {
			if t.Get(k, v) {
				if !codec.IsTombstone(v[0]) {
					found[j] = true
					vals = append(vals, v...)
				}
				break
			}
		}
	}
	return found, vals
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// TestOverlayMatchesChainWalk: random histories with deletions, upserts
// of the same key in several layers and branches after rollbacks; at
// every version, the overlay's view answers exactly what walking the
// chain does, value bits included, for every width and encoding.
func TestOverlayMatchesChainWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		width int
		enc   codec.Encoding
	}{{1, codec.EncFP32}, {5, codec.EncFP32}, {9, codec.EncFP16}, {9, codec.EncInt8}, {33, codec.EncFP32}} {
		c := newChainCase(t, rng, tc.width, tc.enc, 60)
		ov := newOverlay()
		views := make([]*view, len(c.deltas)+1)
		for v := 1; v <= len(c.deltas); v++ {
			// A version's chain merged oldest first, as loadStack does;
			// its ancestors are merged already and stay put.
			ch := c.chain(v)
			ls := make([]int, len(ch))
			for i := len(ch) - 1; i >= 0; i-- {
				ls[i] = ov.merge(ch[i])
			}
			views[v] = newView(ov, ls, len(ch))
		}
		keys := make([]uint64, 0, 3300)
		for k := range uint64(3200) {
			keys = append(keys, k)
		}
		keys = append(keys, codec.KeyUnhash(0), math.MaxUint64)
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for v := 1; v <= len(c.deltas); v++ {
			ch := c.chain(v)
			wantF, wantV := reference(ch, c.base, keys, tc.width)
			gotF, gotV := answer(views[v], []*Table{c.base}, keys, tc.width)
			walkF, walkV := answer(nil, append(slices.Clone(ch), c.base), keys, tc.width)
			if !slices.Equal(gotF, wantF) || !sameBits(gotV, wantV) {
				t.Fatalf("width %d %v, version %d (chain of %d): the overlay's answer differs from the chain's", tc.width, tc.enc, v, len(ch))
			}
			if !slices.Equal(walkF, wantF) || !sameBits(walkV, wantV) {
				t.Fatalf("width %d %v, version %d: walking the stack differs from the reference", tc.width, tc.enc, v)
			}
		}
	}
}

// TestOverlayMergeWhileReading: lookups at kept versions go on while
// the loader merges new deltas (and grows the index and its storage
// under them); every answer equals the chain's. Run with -race.
func TestOverlayMergeWhileReading(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	c := newChainCase(t, rng, 3, codec.EncFP32, 80)
	// A straight line: version v's chain is deltas v..1.
	for i := range c.parent {
		c.parent[i] = i
	}
	ov := newOverlay()
	var published atomic.Pointer[[]*view]
	merge := func(v int) *view {
		ch := c.chain(v)
		ls := make([]int, len(ch))
		for i := len(ch) - 1; i >= 0; i-- {
			ls[i] = ov.merge(ch[i])
		}
		return newView(ov, ls, len(ls))
	}
	first := []*view{nil, merge(1)}
	published.Store(&first)
	keys := make([]uint64, 3000)
	for i := range keys {
		keys[i] = uint64(i)
	}
	want := make([][]float32, len(c.deltas)+1)
	for v := 1; v <= len(c.deltas); v++ {
		_, want[v] = reference(c.chain(v), c.base, keys, 3)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var failed atomic.Bool
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				vs := *published.Load()
				v := 1 + (i+r)%(len(vs)-1)
				if _, got := answer(vs[v], []*Table{c.base}, keys, 3); !sameBits(got, want[v]) {
					failed.Store(true)
				}
			}
		}()
	}
	for v := 2; v <= len(c.deltas); v++ {
		next := append(slices.Clone(*published.Load()), merge(v))
		published.Store(&next)
	}
	close(stop)
	wg.Wait()
	if failed.Load() {
		t.Fatal("a lookup during a merge answered other than its version's chain")
	}
}

// TestOverlayGrowsInProportion: merging a delta into a large overlay
// costs that delta's entries, not the overlay's (the index doubles, so
// its rehashes are paid once per doubling).
func TestOverlayGrowsInProportion(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ov := newOverlay()
	keys := func(n int) *Table {
		ks := make([]uint64, n)
		for i := range ks {
			ks[i] = rng.Uint64()
		}
		return buildTable(t, ks, 1, codec.EncFP32, make([]float32, n))
	}
	ov.merge(keys(100_000))
	bytes, slots := ov.bytes, ov.slots.Load().n
	ov.merge(keys(1))
	if ov.slots.Load().n != slots {
		t.Errorf("a one-key merge rehashed an index of %d slots", slots)
	}
	if ov.bytes-bytes > 1<<20 {
		t.Errorf("a one-key merge grew the overlay by %d bytes", ov.bytes-bytes)
	}
	if ov.entries != 100_001 || ov.keys != 100_001 {
		t.Errorf("%d entries of %d keys, want 100,001 of 100,001", ov.entries, ov.keys)
	}
}

// TestViewLookupAllocs: a lookup through a view allocates nothing once
// its scratch has grown.
func TestViewLookupAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, width := range []int{1, 5} {
		c := newChainCase(t, rng, width, codec.EncFP32, 5)
		ov := newOverlay()
		ls := make([]int, 5)
		for i := range 5 {
			ls[4-i] = ov.merge(c.deltas[i])
		}
		v := newView(ov, ls, 5)
		keys := make([]uint64, 1000)
		for i := range keys {
			keys[i] = uint64(i * 3)
		}
		var sc scratch
		sc.found = make([]uint64, len(keys)/64+1)
		run := func() {
			sc.vals = sc.vals[:0]
			if _, err := sc.lookupStack(context.Background(), v, []*Table{c.base}, keys, width, 0); err != nil {
				t.Fatal(err)
			}
		}
		run()
		if n := testing.AllocsPerRun(50, run); n != 0 {
			t.Errorf("width %d: %v allocations a lookup through a view", width, n)
		}
	}
}

// TestStoredRecordsOnTheWire: a shard asked for records as stored sends
// each found key's record less its 8-byte key, bytes as the file holds
// them, from a full version's table and through a delta's view alike;
// read back, they are the values codec.DecodeRecord gives. A request of
// format 1 still gets float32s.
func TestStoredRecordsOnTheWire(t *testing.T) {
	const parts, dim = 2, 16
	shape := model.Shape{Type: model.FM, Dim: dim}
	for _, enc := range []codec.Encoding{codec.EncFP32, codec.EncFP16, codec.EncInt8} {
		cli := testenv.Etcd(t)
		repo := loader.Repo{Dir: t.TempDir()}
		rng := rand.New(rand.NewPCG(uint64(enc), 3))
		full := &loader.Sparse{Shape: shape}
		for k := range uint64(2000) {
			full.Keys = append(full.Keys, k)
			for range dim + 1 {
				full.Values = append(full.Values, float32(rng.NormFloat64()))
			}
		}
		if _, err := repo.PublishEncoded("m", full, parts, enc.String(), "test"); err != nil {
			t.Fatal(err)
		}
		up := &loader.Sparse{Shape: shape, Keys: []uint64{3, 5, 4000}}
		for range 3 * (dim + 1) {
			up.Values = append(up.Values, float32(rng.NormFloat64()))
		}
		if _, err := repo.PublishDelta("m", loader.Delta{Upserts: up, Deletes: []uint64{7}}); err != nil {
			t.Fatal(err)
		}
		s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		putMap(t, cli, repo, parts, 2, 0, 1)
		testenv.Eventually(t, 10*time.Second, func() error {
			for _, v := range []uint64{1, 2} {
				if ver := s.snap.Load().get("m", v); ver == nil || ver.layers[0] == nil || ver.layers[1] == nil {
					return fmt.Errorf("version %d not loaded", v)
				}
			}
			return nil
		})
		keys := []uint64{0, 3, 5, 7, 8, 1999, 4000, 1 << 40}
		sections := sectionsOf(keys, parts)
		var ordered []uint64
		for _, sec := range sections {
			ordered = append(ordered, sec.Keys...)
		}
		for _, v := range []uint64{1, 2} {
			chain, err := repo.Chain("m", v)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := s.Lookup(context.Background(), codec.AppendStoredLookupRequest(nil, "m", v, sections))
			if err != nil {
				t.Fatal(err)
			}
			var r codec.LookupResponse
			if err := r.Decode(raw, len(keys), dim+1, enc); err != nil {
				t.Fatalf("%v version %d: %v", enc, v, err)
			}
			found := 0
			for i := range ordered {
				if r.Found(i) {
					found++
				}
			}
			if len(r.Values) != found*(codec.RecordSize(dim+1, enc)-8) {
				t.Errorf("%v version %d: %d value bytes for %d records of %d bytes", enc, v, len(r.Values), found, codec.RecordSize(dim+1, enc))
			}
			stored, err := repo.Lookup(chain, ordered) // codec.DecodeRecord of the files
			if err != nil {
				t.Fatal(err)
			}
			k := 0
			got := make([]float32, dim+1)
			for i, key := range ordered {
				want, ok := stored[key]
				if r.Found(i) != ok {
					t.Fatalf("%v version %d key %d: found %v, want %v", enc, v, key, r.Found(i), ok)
				}
				if ok {
					r.Record(k, got)
					k++
					if !sameBits(got, want) {
						t.Fatalf("%v version %d key %d: %v sent, %v stored", enc, v, key, got, want)
					}
				}
			}
			// Format 1: float32 values, the same numbers.
			raw, err = s.Lookup(context.Background(), codec.AppendLookupRequest(nil, "m", v, sections))
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Decode(raw, len(keys), dim+1, codec.EncFP32); err != nil || len(r.Values) != found*4*(dim+1) {
				t.Errorf("%v version %d, format 1: %v, %d value bytes", enc, v, err, len(r.Values))
			}
		}
		s.Close()
	}
}

// TestOverlayInOrder: a chain (newest first) can be merged into an
// overlay only if the deltas it holds already are the chain's oldest, in
// order; otherwise the shard starts a new overlay for it.
func TestOverlayInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	c := newChainCase(t, rng, 1, codec.EncFP32, 3)
	d1, d2, d3 := c.deltas[0], c.deltas[1], c.deltas[2]
	ov := newOverlay()
	ov.merge(d1)
	ov.merge(d2)
	for _, tc := range []struct {
		chain []*Table
		want  bool
	}{
		{[]*Table{d3, d2, d1}, true},
		{[]*Table{d2, d1}, true},
		{[]*Table{d3, d1}, true},
		{[]*Table{d1, d2}, false}, // d2 merged after d1, but older in this chain
		{[]*Table{d1, d3}, false}, // d3 would be merged after d1, its child
	} {
		if got := ov.inOrder(tc.chain); got != tc.want {
			t.Errorf("chain %v: in order %v, want %v", tc.chain, got, tc.want)
		}
	}
}
