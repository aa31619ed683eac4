package shard

import (
	"context"
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

// BenchmarkChain times a request of 20,000 keys (Zipf 1.1 over 10M LR
// features in 8 partitions, 2,500 keys a partition) on one full version
// (fresh), on 200 deltas of 1,000 keys read through an overlay (overlay),
// and on the same deltas walked table by table (walk), in one run: the
// chain-length target of Storage II, at the shard's lookup.
func BenchmarkChain(b *testing.B) {
	const parts, perPart, deltas, deltaKeys = 8, 1_250_000, 200, 1000
	rng := rand.New(rand.NewPCG(7, 8))
	fresh := &version{layers: make([][]*Table, parts), views: make([]*view, parts)}
	walk := &version{layers: make([][]*Table, parts), views: make([]*view, parts)}
	over := &version{layers: make([][]*Table, parts), views: make([]*view, parts)}
	keyOf := func(p, i int) uint64 { return uint64(i*parts + p) }
	for p := range parts {
		keys := make([]uint64, perPart)
		for i := range keys {
			keys[i] = keyOf(p, i)
		}
		base, err := ResidentTable(1, codec.EncFP32, keys, make([]float32, perPart))
		if err != nil {
			b.Fatal(err)
		}
		stack := []*Table{base}
		ov := newOverlay()
		var ls []int
		for range deltas {
			n := deltaKeys / parts
			dk, seen := make([]uint64, 0, n), map[uint64]bool{}
			for len(dk) < n {
				if k := keyOf(p, rng.IntN(perPart)); !seen[k] {
					seen[k] = true
					dk = append(dk, k)
				}
			}
			d, err := ResidentTable(1, codec.EncFP32, dk, make([]float32, n))
			if err != nil {
				b.Fatal(err)
			}
			stack = append([]*Table{d}, stack...)
			ls = append(ls, ov.merge(d))
		}
		fresh.layers[p] = []*Table{base}
		walk.layers[p], over.layers[p] = stack, stack
		over.views[p] = newView(ov, ls, deltas)
	}
	z := rand.NewZipf(rng, 1.1, 1, perPart*parts-1)
	reqs := make([][]codec.Section, 64)
	for r := range reqs {
		for p := range parts {
			sec := codec.Section{Partition: uint32(p)}
			for len(sec.Keys) < 2500 {
				if k := z.Uint64(); int(k%parts) == p {
					sec.Keys = append(sec.Keys, k)
				}
			}
			reqs[r] = append(reqs[r], sec)
		}
	}
	for _, c := range []struct {
		name string
		ver  *version
	}{{"fresh", fresh}, {"overlay", over}, {"walk", walk}} {
		b.Run(c.name, func(b *testing.B) {
			var sc scratch
			sc.found = make([]uint64, 20000/64+1)
			i := 0
			for b.Loop() {
				sc.vals = sc.vals[:0]
				at := 0
				for _, sec := range reqs[i%len(reqs)] {
					at, _ = sc.lookupSection(context.Background(), c.ver, sec, 1, at)
				}
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*20000), "ns/key")
		})
	}
}

// BenchmarkWide times the lookup of a request's wide records (FFM: 20
// fields of dim 4, 81 fp32 values a key; DNN embeddings of dim 16, 17
// values; in int8, DNN's are 32-byte records kept with their keys), Zipf 1.1 over 1M keys in one partition, 10,000 distinct keys
// a request (64 different requests), as float32s and as stored: the search and the
// copy of each found record into the response.
func BenchmarkWide(b *testing.B) {
	const n, batch = 1_000_000, 10_000
	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i)
	}
	z := rand.NewZipf(rng, 1.1, 1, n-1)
	reqs := make([]codec.Section, 64)
	for r := range reqs {
		seen := map[uint64]bool{}
		for len(reqs[r].Keys) < batch {
			if k := z.Uint64(); !seen[k] { // a router asks for each id once
				seen[k] = true
				reqs[r].Keys = append(reqs[r].Keys, k)
			}
		}
	}
	for _, c := range []struct {
		name  string
		width int
		enc   codec.Encoding
	}{{"dnn-fp32", 17, codec.EncFP32}, {"dnn-int8", 17, codec.EncInt8}, {"ffm-fp32", 81, codec.EncFP32}, {"ffm-int8", 81, codec.EncInt8}} {
		vals := make([]float32, n*c.width)
		for i := range vals {
			vals[i] = float32(i%1000) / 1000
		}
		t, err := ResidentTable(c.width, c.enc, keys, vals)
		if err != nil {
			b.Fatal(err)
		}
		ver := &version{layers: [][]*Table{{t}}, views: []*view{nil}}
		for _, stored := range []bool{false, true} {
			if stored && c.enc == codec.EncFP32 {
				continue
			}
			b.Run(c.name+map[bool]string{false: "", true: "/stored"}[stored], func(b *testing.B) {
				var sc scratch
				sc.found = make([]uint64, batch/64+1)
				sc.stored = stored
				i := 0
				for b.Loop() {
					sc.vals = sc.vals[:0]
					sc.lookupSection(context.Background(), ver, reqs[i%len(reqs)], c.width, 0)
					i++
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/key")
			})
		}
	}
}
