package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

func TestWorkloadShapes(t *testing.T) {
	gen := codec.GenInfo{Seed: 1, IDs: "hashed"}
	for name, want := range map[string][2]int{"rank200": {200 * 100, 400}, "small": {100 * 39, 0}} {
		g, err := bench.NewGenerator(bench.Workloads[name], gen, 1000, 1)
		if err != nil {
			t.Fatal(err)
		}
		req := g.Request("m")
		sizes := map[string]int{}
		for i, in := range req.Inputs {
			sizes[in.Name] = len(req.RawInputContents[i]) / 8
			if int64(sizes[in.Name]) != in.Shape[0] {
				t.Errorf("%s %s: %d elements, shape %v", name, in.Name, sizes[in.Name], in.Shape)
			}
		}
		if sizes["ids"] != want[0] || sizes["shared_ids"] != want[1] || sizes["row_splits"] != bench.Workloads[name].Rows+1 {
			t.Errorf("%s: sizes %v", name, sizes)
		}
	}
}

// Run completes exactly the requests it is asked for, all answered.
func TestRunAgainstDevCluster(t *testing.T) {
	f := startFront(t, model.LR)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, _ := bench.NewGenerator(bench.Workloads["rank200"], *f.m.Generator, f.m.Params, 3)
	res := bench.Run(ctx, bench.LoadOptions{Client: f.grpc, Model: "b", Generator: g,
		Concurrency: 2, Duration: time.Minute, MaxRequests: 20, Distinct: 4})
	if res.Requests != 20 || res.Errors != 0 {
		t.Fatalf("requests %d, errors %d (%v)", res.Requests, res.Errors, res.FirstError)
	}
	if res.IDsPerRequest != 20400 || res.P50 <= 0 || res.P999 < res.P50 {
		t.Fatalf("result %+v", res)
	}
}

// TestTraceOpen: an open-loop trace sends at its rate whether or not
// answers come, times each call from when it was due, and keeps every
// call with the version that answered.
func TestTraceOpen(t *testing.T) {
	f := startFront(t, model.LR)
	g, _ := bench.NewGenerator(bench.Workloads["rank200"], *f.m.Generator, f.m.Params, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	calls := bench.TraceOpen(ctx, bench.LoadOptions{Client: f.grpc, Model: "b", Generator: g, Distinct: 4}, 50)
	// 50 a second for 1s: one due at once, then every 20ms; never more,
	// and fewer only by those a starved sender had not caught up with.
	if len(calls) < 25 || len(calls) > 51 {
		t.Fatalf("%d calls in 1s at 50 a second", len(calls))
	}
	for i, c := range calls {
		if c.Err != "" || c.Version != 1 || !c.End.After(c.Start) {
			t.Fatalf("call %d: %+v", i, c)
		}
		if i > 0 && c.End.Before(calls[i-1].End) {
			t.Fatal("calls not in the order they ended")
		}
	}
	w := bench.Summarize(calls, calls[0].Start, calls[len(calls)-1].End.Add(time.Nanosecond))
	if w.Requests != len(calls) || w.Failed != 0 || w.P99 < w.P50 || w.Versions[1] != len(calls) {
		t.Fatalf("window %+v of %d calls", w, len(calls))
	}
}

// front is a dev cluster serving model "b" behind a front on loopback,
// and a gRPC client of it.
type front struct {
	repo string
	m    *codec.Manifest
	srv  *server.Server
	grpc kservepb.GRPCInferenceServiceClient
}

// startFront generates model "b" of type typ, starts a 2-shard dev
// cluster and a front on :0 ports, and stops them when the test ends.
func startFront(t *testing.T, typ string) front {
	t.Helper()
	dir := t.TempDir()
	m, err := loader.Repo{Dir: dir}.Generate(loader.GenSpec{Name: "b", Shape: model.Shape{Type: typ}, Params: 10000, Partitions: 4, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: dir, Shards: 2, ScanInterval: time.Hour})
	s, err := server.Start(server.Options{Predictor: c.Router, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registry: nopRegistry{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return front{repo: dir, m: m, srv: s, grpc: kservepb.NewGRPCInferenceServiceClient(conn)}
}

// nopRegistry keeps the front's metrics out of the global registry.
type nopRegistry struct{}

func (nopRegistry) Register(prometheus.Collector) error  { return nil }
func (nopRegistry) MustRegister(...prometheus.Collector) {}
func (nopRegistry) Unregister(prometheus.Collector) bool { return true }
