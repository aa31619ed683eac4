package model

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkScore scores a rank200 request (200 rows × 100 own features,
// 400 shared) of each type; the values are in memory, so this is the
// scorer's own cost.
func BenchmarkScore(b *testing.B) {
	for _, s := range []Shape{{Type: LR}, {Type: FM, Dim: 8}, {Type: FFM, Fields: 20, Dim: 4}, {Type: DNN, Fields: 20, Dim: 16, Pooling: "sum"}} {
		b.Run(s.String(), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			m := newRandModel(rng, s, 20000, 256, 128)
			rq := m.request(rng, 200, 200, 400, 30000, false) // perRow drawn in 0..200: 100 on average
			sc, _ := s.Scorer(m.bias, m.dense)
			out := make([]float32, 200)
			var scratch Scratch
			b.ReportAllocs()
			for b.Loop() {
				sc.Score(out, &rq.b, &scratch)
			}
		})
	}
}
