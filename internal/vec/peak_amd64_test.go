package vec

import (
	"testing"

	"golang.org/x/sys/cpu"
)

func fmaLoop256(n int)
func fmaLoop512(n int)

// BenchmarkFMAPeak measures one core's FMA peak: independent FMAs and
// nothing else, 8 and 16 lanes wide. Gemm's GFLOP/s are reported against
// it.
func BenchmarkFMAPeak(b *testing.B) {
	const iters = 1 << 16
	for _, c := range []struct {
		name  string
		lanes int
		run   func(int)
		ok    bool
	}{{"ymm", 8, fmaLoop256, useAVX}, {"zmm", 16, fmaLoop512, cpu.X86.HasAVX512F}} {
		b.Run(c.name, func(b *testing.B) {
			if !c.ok {
				b.Skip("not supported here")
			}
			for b.Loop() {
				c.run(iters)
			}
			b.ReportMetric(float64(iters*12*c.lanes*2)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
