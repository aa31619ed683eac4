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
	dir := t.TempDir()
	m, err := loader.Repo{Dir: dir}.Generate(loader.GenSpec{Name: "b", Type: codec.TypeLR, Params: 10000, Partitions: 4, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: dir, Shards: 2, ScanInterval: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := server.Start(server.Options{Predictor: c.Router, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registry: nopRegistry{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	g, _ := bench.NewGenerator(bench.Workloads["rank200"], *m.Generator, m.Params, 3)
	res := bench.Run(ctx, bench.LoadOptions{Client: kservepb.NewGRPCInferenceServiceClient(conn), Model: "b", Generator: g,
		Concurrency: 2, Duration: time.Minute, MaxRequests: 20, Distinct: 4})
	if res.Requests != 20 || res.Errors != 0 {
		t.Fatalf("requests %d, errors %d (%v)", res.Requests, res.Errors, res.FirstError)
	}
	if res.IDsPerRequest != 20400 || res.P50 <= 0 || res.P999 < res.P50 {
		t.Fatalf("result %+v", res)
	}
}

// nopRegistry keeps the front's metrics out of the global registry.
type nopRegistry struct{}

func (nopRegistry) Register(prometheus.Collector) error  { return nil }
func (nopRegistry) MustRegister(...prometheus.Collector) {}
func (nopRegistry) Unregister(prometheus.Collector) bool { return true }
