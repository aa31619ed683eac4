package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

// TestDeltasServedUnderLoad: deltas published while requests flow are
// found by the manager's watch of the repository (the cluster scans only
// hourly), served with exactly the scores they make, and no request
// fails meanwhile. How soon is measured by 'cumulus bench freshness'.
func TestDeltasServedUnderLoad(t *testing.T) {
	f := startFront(t, model.FM)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, _ := bench.NewGenerator(bench.Workloads["small"], *f.m.Generator, f.m.Params, 3)
	loaded := make(chan bench.Result, 1)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		loaded <- bench.Run(lctx, bench.LoadOptions{Client: f.grpc, Model: "b", Generator: g, Concurrency: 2, Duration: time.Minute, Distinct: 4})
	}()
	fs, err := bench.Freshness(ctx, bench.FreshOptions{Repo: loader.Repo{Dir: f.repo}, Model: "b", Routers: []bench.Inferer{f.grpc},
		Deltas: 3, Keys: 5000, KeySpace: uint64(f.m.Params), Timeout: 30 * time.Second}, nil)
	stop()
	res := <-loaded
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range fs {
		if x.Version != uint64(i+2) || len(x.Served) != 1 {
			t.Fatalf("delta %d: %+v", i, x)
		}
	}
	if res.Requests == 0 || res.Errors != 0 {
		t.Fatalf("load beside the deltas: %d requests, %d errors (%v)", res.Requests, res.Errors, res.FirstError)
	}
}
