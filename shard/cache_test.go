package shard

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
)

// filledCache is a cache of about bytes for values of vlen bytes,
// holding keys 1, 2, … as long as their sets have room, each key's value
// its id in every 4-byte word (the last one cut short). It returns the
// cache and the keys it holds.
func filledCache(t testing.TB, bytes int64, vlen int) (*valueCache, []uint64) {
	c := newValueCache(bytes, vlen, 1<<30)
	if c == nil {
		t.Fatal("no cache fits")
	}
	t.Cleanup(c.free)
	var held []uint64
	for k := uint64(1); c.Len() < len(c.hs)*7/8 && k < uint64(4*len(c.hs)); k++ {
		h := codec.KeyHash(k)
		if i := c.admits(h); i >= 0 && c.hs[i].Load() == 0 {
			c.put(i, h, cacheValue(k, vlen))
			held = append(held, k)
		}
	}
	return c, held
}

func cacheValue(k uint64, vlen int) []byte {
	v := make([]byte, (vlen+3)&^3)
	for i := 0; i < len(v); i += 4 {
		binary.LittleEndian.PutUint32(v[i:], uint32(k))
	}
	return v[:vlen]
}

// TestCacheGetAll: the pipelined batch lookup answers exactly as get,
// key by key, for held and absent keys, the key whose h is 0, batches
// shorter than the pipeline and a slot being rewritten.
func TestCacheGetAll(t *testing.T) {
	for _, vlen := range []int{4, 7, 36} {
		t.Run(fmt.Sprint(vlen), func(t *testing.T) {
			c, held := filledCache(t, 1<<16, vlen)
			rng := rand.New(rand.NewPCG(1, uint64(vlen)))
			keys := []uint64{codec.KeyUnhash(0)} // h 0 marks an empty slot: never a hit
			for range 5000 {
				if rng.IntN(4) == 0 {
					keys = append(keys, 1<<40+rng.Uint64N(1<<20)) // absent
				} else {
					keys = append(keys, held[rng.IntN(len(held))])
				}
			}
			// A slot mid-rewrite (odd sequence number) is a miss.
			busy := c.way(codec.KeyHash(held[0]))
			c.words[int(busy)*c.sw].Add(1)
			keys = append(keys, held[0])
			for _, n := range []int{0, 1, 5, 2*cacheAhead + 1, len(keys)} {
				out := make([]int32, n)
				vals := make([]byte, n*vlen)
				c.getAll(keys[:n], out, vals)
				for q, k := range keys[:n] {
					want := make([]byte, vlen)
					hit := c.get(codec.KeyHash(k), want)
					if got := out[q] == int32(q); got != hit || (!hit && out[q] != -1) {
						t.Fatalf("batch of %d, key %d (%d): out %d, get says hit=%v", n, q, k, out[q], hit)
					}
					if hit && !bytes.Equal(vals[q*vlen:(q+1)*vlen], cacheValue(k, vlen)) {
						t.Fatalf("batch of %d, key %d: value % x, want % x", n, k, vals[q*vlen:(q+1)*vlen], cacheValue(k, vlen))
					}
				}
			}
			if c.get(codec.KeyHash(held[0]), make([]byte, vlen)) {
				t.Fatal("a slot being rewritten was read")
			}
		})
	}
}

// BenchmarkCacheGet compares getAll with get key by key, on a cache of
// LR values (4 bytes) and of 32-byte ones, four in five keys held.
//
//	go test ./shard -run '^$' -bench CacheGet
func BenchmarkCacheGet(b *testing.B) {
	for _, size := range []int64{4 << 20, 64 << 20} {
		for _, vlen := range []int{4, 32} {
			c, held := filledCache(b, size, vlen)
			rng := rand.New(rand.NewPCG(2, 3))
			keys := make([]uint64, 4096)
			for q := range keys {
				if rng.IntN(5) == 0 {
					keys[q] = 1<<40 + rng.Uint64N(1<<30)
				} else {
					keys[q] = held[rng.IntN(len(held))]
				}
			}
			out := make([]int32, len(keys))
			vals := make([]byte, len(keys)*vlen)
			name := fmt.Sprintf("%dMiB/vlen=%d", size>>20, vlen)
			b.Run(name+"/get", func(b *testing.B) {
				for b.Loop() {
					for q, k := range keys {
						if c.get(codec.KeyHash(k), vals[q*vlen:]) {
							out[q] = int32(q)
						} else {
							out[q] = -1
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/key")
			})
			b.Run(name+"/getAll", func(b *testing.B) {
				for b.Loop() {
					c.getAll(keys, out, vals)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/key")
			})
		}
	}
}

// TestCacheOffer: lookups put what they read into empty slots only,
// never twice the same key, never a key's h with another's value, while
// the loader admits and evicts beside them and readers read.
func TestCacheOffer(t *testing.T) {
	const vlen = 12
	c := newValueCache(1<<14, vlen, 1<<30)
	if c == nil {
		t.Fatal("no cache fits")
	}
	t.Cleanup(c.free)
	// One set: filled first empty first, then full; offers never evict.
	var same []uint64 // keys of one set
	for k := uint64(1); len(same) < cacheWays+2; k++ {
		if h := codec.KeyHash(k); c.set(h) == c.set(codec.KeyHash(1)) {
			same = append(same, k)
		}
	}
	val := make([]byte, vlen)
	for n, k := range same {
		c.offer(codec.KeyHash(k), cacheValue(k, vlen))
		c.offer(codec.KeyHash(k), cacheValue(k+1, vlen)) // again: kept as first put
		want := min(n+1, cacheWays)
		if c.Len() != want {
			t.Fatalf("after offering %d keys of one set the cache holds %d, want %d", n+1, c.Len(), want)
		}
		if in := c.get(codec.KeyHash(k), val); in != (n < cacheWays) || in && !bytes.Equal(val, cacheValue(k, vlen)) {
			t.Fatalf("offered key %d of a set of %d ways: held %v, value %v", n, cacheWays, in, val)
		}
	}

	// At once: lookups offering keys while readers read; then the loader
	// admitting (and evicting) beside them as well.
	c2 := newValueCache(1<<16, vlen, 1<<30)
	t.Cleanup(c2.free)
	for _, loader := range []bool{false, true} {
		if err := offerAtOnce(c2, vlen, loader); err != nil {
			t.Fatal(err)
		}
		// Every set: empty slots last, values right, Len right; no key
		// twice from offers alone. (The loader's put may repeat a key a
		// lookup offered between its has and its put: harmless, both
		// copies hold the key's value.)
		held := 0
		for s := 0; s < len(c2.hs); s += cacheWays {
			seen := map[uint64]bool{}
			empty := false
			for i := s; i < s+cacheWays; i++ {
				h := c2.hs[i].Load()
				switch {
				case h == 0:
					empty = true
				case empty:
					t.Fatalf("loader %v: set %d: a key after an empty slot", loader, s/cacheWays)
				case seen[h] && !loader:
					t.Fatalf("set %d: key %d held twice", s/cacheWays, codec.KeyUnhash(h))
				default:
					seen[h] = true
					held++
					if !c2.read(i, h, val) || !bytes.Equal(val, cacheValue(codec.KeyUnhash(h), vlen)) {
						t.Fatalf("loader %v: key %d holds %v", loader, codec.KeyUnhash(h), val)
					}
				}
			}
		}
		if held != c2.Len() || held == 0 {
			t.Fatalf("loader %v: %d keys held, Len %d", loader, held, c2.Len())
		}
	}
}

// offerAtOnce has four goroutines offer c random keys of 1..2^14 (each
// key's value cacheValue), the loader put others if loader, and two
// readers check every hit's value meanwhile.
func offerAtOnce(c *valueCache, vlen int, loader bool) error {
	done := make(chan struct{})
	errs := make(chan error, 2)
	var wg, readers sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for range 20000 {
				k := 1 + rng.Uint64N(1<<14)
				c.offer(codec.KeyHash(k), cacheValue(k, vlen))
			}
		})
	}
	if loader {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(9, 9))
			for range 20000 {
				k := 1 + rng.Uint64N(1<<14)
				h := codec.KeyHash(k)
				c.freq.add(h)
				c.freq.add(h)
				if i := c.admits(h); i >= 0 && !c.has(h) {
					c.put(i, h, cacheValue(k, vlen))
				}
			}
		})
	}
	for g := range 2 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			keys := make([]uint64, 256)
			out := make([]int32, len(keys))
			vals := make([]byte, len(keys)*vlen)
			for {
				select {
				case <-done:
					return
				default:
				}
				for q := range keys {
					keys[q] = 1 + rng.Uint64N(1<<14)
				}
				c.getAll(keys, out, vals)
				for q, o := range out {
					if o >= 0 && !bytes.Equal(vals[q*vlen:(q+1)*vlen], cacheValue(keys[q], vlen)) {
						errs <- fmt.Errorf("loader %v: key %d read with value %v", loader, keys[q], vals[q*vlen:(q+1)*vlen])
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(done)
	readers.Wait()
	close(errs)
	return <-errs
}

// addTimes counts as that many adds do, saturating at 15; past
// resetAt it halves the sketch as they would.
func TestSketchAddTimes(t *testing.T) {
	a, b := newValueCache(1<<14, 4, 1<<30), newValueCache(1<<14, 4, 1<<30)
	t.Cleanup(a.free)
	t.Cleanup(b.free)
	rng := rand.New(rand.NewPCG(3, 4))
	add := func(h uint64, n int) {
		a.freq.addTimes(h, n)
		for range n {
			b.freq.add(h)
		}
	}
	for a.freq.adds < a.freq.resetAt-16 {
		add(rng.Uint64(), 1+rng.IntN(15))
	}
	if !slices.Equal(a.freq.words, b.freq.words) || a.freq.adds != b.freq.adds {
		t.Fatal("addTimes counted otherwise than as many adds")
	}
	for range a.freq.resetAt { // halving a few times
		h, n := rng.Uint64(), 1+rng.IntN(15)
		if add(h, n); a.freq.estimate(h) < n/2 {
			t.Fatalf("counted %d times, estimated %d", n, a.freq.estimate(h))
		}
	}
	if a.freq.adds >= a.freq.resetAt {
		t.Fatalf("%d adds since the last halving, at most %d", a.freq.adds, a.freq.resetAt)
	}
}

// TestGrowOverTicks: grow copies a cache into one twice its size over
// calls, as many slots a call as it is given, the old cache serving
// until the copy is whole; the new one then holds every key with its
// value and count, and the old one waits to be freed. Lookups offering
// keys to the old one meanwhile do not tear what is copied. A cache
// replaced meanwhile (a rollback's warming) abandons the copy, and one
// dropped frees it; with no slots left in a call, none is begun.
func TestGrowOverTicks(t *testing.T) {
	const vlen = 8
	c, held := filledCache(t, 1<<20, vlen)
	for i, k := range held {
		c.freq.addTimes(codec.KeyHash(k), 1+i%15)
	}
	tb := &Table{vlen: vlen, n: 1 << 30}
	tb.cache.Store(c)
	s := &Shard{}
	const chunk = 4096 // slots a call
	calls := 0
	for tb.cache.Load() == c {
		if calls++; calls > len(c.hs)/chunk {
			t.Fatalf("not grown after %d calls", calls)
		}
		slots := chunk
		if b := s.grow(tb, c, 4*c.Bytes(), &slots); b <= c.Bytes() || slots != 0 {
			t.Fatalf("call %d: grow returned %d bytes (want more than the cache's %d), %d of %d slots left", calls, b, c.Bytes(), slots, chunk)
		}
	}
	if calls != len(c.hs)/chunk {
		t.Fatalf("grown in %d calls of %d slots, want %d", calls, chunk, len(c.hs)/chunk)
	}
	g := tb.cache.Load()
	t.Cleanup(g.free)
	if g.mask+1 < 2*(c.mask+1) || tb.growth != nil || len(s.deadCaches) != 1 || s.deadCaches[0] != c {
		t.Fatalf("after growing: sets %d (from %d), growth %v, dead caches %d", g.mask+1, c.mask+1, tb.growth, len(s.deadCaches))
	}
	val := make([]byte, vlen)
	for _, k := range held {
		h := codec.KeyHash(k)
		if !g.get(h, val) || !bytes.Equal(val, cacheValue(k, vlen)) {
			t.Fatalf("key %d: not held or wrong (%v) in the grown cache", k, val)
		}
		if a, b := c.freq.estimate(h), g.freq.estimate(h); a != b {
			t.Fatalf("key %d: counted %d, %d once grown", k, a, b)
		}
	}
	if g.Len() != len(held) {
		t.Fatalf("the grown cache holds %d keys, want %d", g.Len(), len(held))
	}

	// Lookups offering keys to the cache while it is copied: what the
	// copy takes is whole.
	c4 := newValueCache(1<<18, vlen, 1<<30)
	t.Cleanup(c4.free)
	tb.cache.Store(c4)
	for k := uint64(1); c4.Len() < len(c4.hs)/4; k++ {
		c4.offer(codec.KeyHash(k), cacheValue(k, vlen))
	}
	var wg sync.WaitGroup
	var offered atomic.Int64
	stop := make(chan struct{})
	for w := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := 1 + rng.Uint64N(1<<16)
				c4.offer(codec.KeyHash(k), cacheValue(k, vlen))
				offered.Add(1)
			}
		})
	}
	for offered.Load() < 1000 { // the offers have begun
		runtime.Gosched()
	}
	for tb.cache.Load() == c4 {
		slots := 256
		s.grow(tb, c4, 4*c4.Bytes(), &slots)
	}
	close(stop)
	wg.Wait()
	g4 := tb.cache.Load()
	t.Cleanup(g4.free)
	n := 0
	for i := range g4.hs {
		if h := g4.hs[i].Load(); h != 0 {
			n++
			if !g4.read(i, h, val) || !bytes.Equal(val, cacheValue(codec.KeyUnhash(h), vlen)) {
				t.Fatalf("copied under offers: key %d holds %v", codec.KeyUnhash(h), val)
			}
		}
	}
	if n != g4.Len() || n == 0 {
		t.Fatalf("copied under offers: %d slots filled, Len %d", n, g4.Len())
	}

	// Replaced mid-copy: the copy of the old cache is abandoned and one
	// of the new begun.
	c2, _ := filledCache(t, 1<<20, vlen)
	tb.cache.Store(c2)
	slots := chunk
	s.grow(tb, c2, 4*c2.Bytes(), &slots)
	first := tb.growth
	c3, _ := filledCache(t, 1<<20, vlen)
	tb.cache.Store(c3)
	slots = chunk
	s.grow(tb, c3, 4*c3.Bytes(), &slots)
	if first == nil || tb.growth == nil || tb.growth == first || tb.growth.from != c3 {
		t.Fatalf("growth of a replaced cache: first %v, now %v", first, tb.growth)
	}
	// Dropped mid-copy: nothing is left growing.
	s.dropCache(tb)
	if tb.growth != nil {
		t.Fatal("a dropped cache's growth is kept")
	}
	c5, _ := filledCache(t, 1<<20, vlen)
	tb.cache.Store(c5)
	slots = 0
	if b := s.grow(tb, c5, 4*c5.Bytes(), &slots); b != 0 || tb.growth != nil {
		t.Fatalf("no slots left: grow returned %d bytes, growth %v", b, tb.growth)
	}
}

// TestSketchSpread: a sketch spread over one with 2^k times the counters
// estimates every key as the original does.
func TestSketchSpread(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, k := range []int{0, 1, 3} {
		small := newValueCache(1<<16, 4, 1<<30)
		big := newValueCache(1<<(16+k), 4, 1<<30)
		var keys []uint64
		for range 5000 {
			h := codec.KeyHash(rng.Uint64N(1 << 20))
			small.freq.addTimes(h, 1+rng.IntN(15))
			keys = append(keys, h)
		}
		big.freq.spreadFrom(&small.freq)
		if len(big.freq.words) != len(small.freq.words)<<k {
			t.Fatalf("k %d: %d words from %d", k, len(big.freq.words), len(small.freq.words))
		}
		for range 5000 { // and keys never counted
			keys = append(keys, codec.KeyHash(rng.Uint64()))
		}
		for _, h := range keys {
			if a, b := small.freq.estimate(h), big.freq.estimate(h); a != b {
				t.Fatalf("k %d: key %x estimated %d, %d once spread", k, h, a, b)
			}
		}
		small.free()
		big.free()
	}
}

// BenchmarkGrow copies a full cache of a million slots into one of twice
// the sets, as grow does at a switch: the way it takes (copyGrown) and
// the general one (copyAdmitting).
func BenchmarkGrow(b *testing.B) {
	const vlen = 4
	c, held := filledCache(b, 16<<20, vlen)
	for i, k := range held {
		c.freq.addTimes(codec.KeyHash(k), 1+i%15)
	}
	for _, bc := range []struct {
		name string
		copy func(g, c *valueCache, from, n int) int
	}{{"grown", copyGrown}, {"admitting", copyAdmitting}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportMetric(float64(len(c.hs)), "slots")
			for b.Loop() {
				b.StopTimer()
				g := newValueCache(2*c.Bytes(), vlen, 1<<30)
				for i := range g.words { // its pages faulted in: the copy alone is timed
					g.words[i].Store(0)
				}
				b.StartTimer()
				bc.copy(g, c, 0, len(c.hs))
				b.StopTimer()
				g.free()
				b.StartTimer()
			}
		})
	}
}
