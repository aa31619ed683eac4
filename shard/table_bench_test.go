package shard

import (
	"math/rand/v2"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
)

// BenchmarkTable times batched lookups of 20,000 present keys beside a Go
// map on the same keys, in one run. Each iteration takes the next of 64
// distinct batches: repeating one batch would leave its records warm in
// cache and flatter whichever structure touches fewer lines.
func BenchmarkTable(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = codec.KeyHash(uint64(i) + 12345) // distinct, spread
		}
		vals := make([]float32, n)
		tb, err := ResidentTable(1, codec.EncFP32, keys, vals) // as a shard holds it
		if err != nil {
			b.Fatal(err)
		}
		m := make(map[uint64]float32, n)
		for i, k := range keys {
			m[k] = vals[i]
		}
		for _, dist := range []string{"zipf", "uniform"} {
			z := rand.NewZipf(rng, 1.1, 1, uint64(n-1))
			batches := make([][]uint64, 64)
			for i := range batches {
				batches[i] = make([]uint64, 20000)
				for j := range batches[i] {
					if dist == "zipf" {
						batches[i][j] = keys[z.Uint64()]
					} else {
						batches[i][j] = keys[rng.IntN(n)]
					}
				}
			}
			idx := make([]int32, 20000)
			out := make([]float32, 20000)
			b.Run(dist+"/table/"+itoa(n), func(b *testing.B) {
				i := 0
				for b.Loop() {
					tb.FindWeights(batches[i%len(batches)], idx, out)
					i++
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*20000), "ns/key")
			})
			b.Run(dist+"/map/"+itoa(n), func(b *testing.B) {
				i := 0
				for b.Loop() {
					for j, k := range batches[i%len(batches)] {
						out[j] = m[k]
					}
					i++
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*20000), "ns/key")
			})
		}
	}
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
