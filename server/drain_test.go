package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
	"github.com/cumulus-serving/cumulus/shard"
)

// Requests under way when the front drains are answered; meanwhile it
// reports not ready on both protocols, and Drain returns once they are
// done.
func TestDrainFinishesRequestsUnderWay(t *testing.T) {
	dir := t.TempDir()
	if _, err := (loader.Repo{Dir: dir}).Generate(loader.GenSpec{Name: "lr", Shape: model.Shape{Type: model.LR}, Params: 1000, Partitions: 2, Seed: 1, Dense: true}); err != nil {
		t.Fatal(err)
	}
	// Shards hold lookups while hold is set, until release.
	var hold atomic.Bool
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	reg := prometheus.NewRegistry()
	c := devclustertest.Start(t, devcluster.Options{Repo: dir, Shards: 2, ScanInterval: time.Hour, Registry: reg,
		Shard: func(_ int, o *shard.Options) {
			o.BeforeLookup = func(ctx context.Context) {
				if hold.Load() {
					select {
					case <-release:
					case <-ctx.Done():
					}
				}
			}
		}})
	s, err := server.Start(server.Options{Predictor: c.Router, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registry: reg, Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health before the drain: %v %v", r, err)
	}

	hold.Store(true)
	answers := make(chan error, 2)
	go func() {
		ids := &kservepb.InferTensorContents{Int64Contents: []int64{1, 2, 3, 500}}
		splits := &kservepb.InferTensorContents{Int64Contents: []int64{0, 2, 4}}
		resp, err := kservepb.NewGRPCInferenceServiceClient(conn).ModelInfer(context.Background(), &kservepb.ModelInferRequest{ModelName: "lr",
			Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
				{Name: "ids", Datatype: "INT64", Shape: []int64{4}, Contents: ids},
				{Name: "row_splits", Datatype: "INT64", Shape: []int64{3}, Contents: splits},
			}})
		if err == nil && len(resp.Outputs[0].Contents.Fp32Contents) != 2 {
			err = fmt.Errorf("gRPC: %v", resp)
		}
		answers <- err
	}()
	go func() {
		body := `{"inputs":[{"name":"ids","datatype":"INT64","shape":[3],"data":[1,2,999]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,3]}]}`
		resp, err := http.Post("http://"+s.HTTPAddr()+"/v2/models/lr/infer", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("HTTP: %s", resp.Status)
			}
		}
		answers <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := s.Inflight(); n != 2 {
			return fmt.Errorf("%d requests under way, want 2", n)
		}
		return nil
	})
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		drained <- s.Drain(ctx)
	}()

	// Not ready at once, on both protocols. (The listeners are closed by
	// now, so the handlers are asked directly.)
	testenv.Eventually(t, 10*time.Second, func() error {
		rec := httptest.NewRecorder()
		s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/v2/health/ready", nil))
		if rec.Code != http.StatusServiceUnavailable || strings.TrimSpace(rec.Body.String()) != `{"ready":false}` {
			return fmt.Errorf("/v2/health/ready: %d %s", rec.Code, rec.Body)
		}
		return nil
	})
	if r, err := s.Health().Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health while draining: %v %v", r, err)
	}
	select {
	case err := <-drained:
		t.Fatalf("the drain ended (%v) with requests under way", err)
	default:
	}
	close(release)
	for range 2 {
		if err := <-answers; err != nil {
			t.Errorf("a request under way when the drain began: %v", err)
		}
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
}
