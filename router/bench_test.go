package router_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
)

// benchRequest turns a workload's KServe request into a router request.
func benchRequest(w bench.Workload, gen codec.GenInfo, params int64) *router.Request {
	g, _ := bench.NewGenerator(w, gen, params, 1)
	kreq := g.Request("bench")
	req := &router.Request{Model: "bench"}
	for i, in := range kreq.Inputs {
		v := decodeU64(kreq.RawInputContents[i])
		switch in.Name {
		case "ids":
			req.IDs = v
		case "shared_ids":
			req.SharedIDs = v
		case "row_splits":
			for _, x := range v {
				req.RowSplits = append(req.RowSplits, int64(x))
			}
		}
	}
	return req
}

func decodeU64(b []byte) []uint64 {
	out := make([]uint64, len(b)/8)
	for i := range out {
		for j := 7; j >= 0; j-- {
			out[i] = out[i]<<8 | uint64(b[8*i+j])
		}
	}
	return out
}

func benchmarkPredict(b *testing.B, typ, workload string) {
	benchmarkPredictShards(b, typ, workload, 4)
}

func benchmarkPredictShards(b *testing.B, typ, workload string, shards int) {
	dir := b.TempDir()
	const params = 1_000_000
	m, err := loader.Repo{Dir: dir}.Generate(loader.GenSpec{Name: "bench", Shape: model.Shape{Type: typ}, Params: params, Seed: 3})
	if err != nil {
		b.Fatal(err)
	}
	c := devclustertest.Start(b, devcluster.Options{Repo: dir, Shards: shards, ScanInterval: time.Hour})
	req := benchRequest(bench.Workloads[workload], *m.Generator, params)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Router.Predict(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(req.IDs)+len(req.SharedIDs)), "ids/op")
}

// Router.Predict over real shard sockets, one request at a time.
func BenchmarkPredictLRRank200(b *testing.B) { benchmarkPredict(b, model.LR, "rank200") }
func BenchmarkPredictLRSmall(b *testing.B)   { benchmarkPredict(b, model.LR, "small") }
func BenchmarkPredictFMRank200(b *testing.B) { benchmarkPredict(b, model.FM, "rank200") }

// Router.Predict with 1, 2, 4 and 8 shards (8 partitions): what a request
// costs per shard it calls.
func BenchmarkPredictLRRank200Shards(b *testing.B) {
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("shards=%d", n), func(b *testing.B) { benchmarkPredictShards(b, model.LR, "rank200", n) })
	}
}
