package shard

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
)

// BenchmarkTable times batched lookups of 20,000 present keys (Find plus
// decoding every value) beside a Go map on the same keys, in one run.
// Compare ns/key between the table and map sub-benchmarks.
func BenchmarkTable(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = codec.KeyHash(uint64(i) + 12345) // distinct, spread
		}
		vals := make([]float32, n)
		tb := buildTable(b, keys, 1, codec.EncFP32, vals)
		tb = onHugePages(b, tb)
		m := make(map[uint64]float32, n)
		for i, k := range keys {
			m[k] = vals[i]
		}
		for _, dist := range []string{"zipf", "uniform"} {
			z := rand.NewZipf(rng, 1.1, 1, uint64(n-1))
			batch := make([]uint64, 20000)
			for j := range batch {
				if dist == "zipf" {
					batch[j] = keys[z.Uint64()]
				} else {
					batch[j] = keys[rng.IntN(n)]
				}
			}
			idx := make([]int32, len(batch))
			out := make([]float32, len(batch))
			b.Run(dist+"/table/"+itoa(n), func(b *testing.B) {
				for b.Loop() {
					tb.FindWeights(batch, idx, out)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/key")
			})
			b.Run(dist+"/map/"+itoa(n), func(b *testing.B) {
				for b.Loop() {
					for j, k := range batch {
						out[j] = m[k]
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/key")
			})
		}
	}
}

// onHugePages rebuilds tb on a huge-page buffer, as the loader does.
func onHugePages(b *testing.B, tb *Table) *Table {
	var buf bytes.Buffer
	keys := make([]uint64, 0, tb.Len())
	for i := range tb.Len() {
		keys = append(keys, codec.KeyUnhash(tb.hAt(i)))
	}
	vals := make([]float32, len(keys))
	if _, err := codec.WritePartition(&buf, 0, 1, codec.EncFP32, keys, vals); err != nil {
		b.Fatal(err)
	}
	mem := tablemem.Alloc(buf.Len())
	copy(mem.Bytes, buf.Bytes())
	p, err := codec.ParsePartition(mem.Bytes)
	if err != nil {
		b.Fatal(err)
	}
	p.Owner = mem
	return NewTable(p)
}

func itoa(n int) string {
	switch n {
	case 1_000_000:
		return "1M"
	case 10_000_000:
		return "10M"
	}
	return "n"
}
