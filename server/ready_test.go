package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// A router that has not read the serving map yet (just started, or its
// etcd unreachable) answers Unavailable, never NotFound: a client of a
// restarted router must not be told a served model does not exist.
func TestUnavailableUntilTheMapIsRead(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()}) // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r, err := router.Start(context.Background(), router.Options{Etcd: cli})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	reg := prometheus.NewRegistry()
	s, err := server.Start(server.Options{Predictor: r, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registry: reg, Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct{ method, path string }{
		{"POST", "/v2/models/fm/infer"}, {"GET", "/v2/models/fm"}, {"GET", "/v2/models/fm/ready"}, {"GET", "/v2/health/ready"},
	} {
		var code int
		if c.method == "POST" {
			code, _ = post(t, s, c.path, inferJSON([]int64{1}, []int64{0, 1}, nil))
		} else {
			code, _ = get(t, s, c.path)
		}
		if code != http.StatusServiceUnavailable {
			t.Errorf("%s %s: %d, want 503", c.method, c.path, code)
		}
	}
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = kservepb.NewGRPCInferenceServiceClient(conn).ModelInfer(context.Background(), &kservepb.ModelInferRequest{ModelName: "fm"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ModelInfer: %v, want Unavailable", err)
	}
}
