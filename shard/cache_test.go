package shard

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
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
