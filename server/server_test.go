package server_test

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

func start(t *testing.T) (*server.Server, kservepb.GRPCInferenceServiceClient) {
	t.Helper()
	dir := t.TempDir()
	if _, err := (loader.Repo{Dir: dir}).Generate(loader.GenSpec{Name: "fm", Shape: model.Shape{Type: model.FM, Dim: 4}, Params: 20000, Partitions: 4, Seed: 5, Dense: true}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c := devclustertest.Start(t, devcluster.Options{Repo: dir, Shards: 2, ScanInterval: time.Hour, Registry: reg,
		Router: router.Options{Limits: router.Limits{MaxRows: 50, MaxIDs: 5000}}})
	return serve(t, server.Options{Predictor: c.Router, MaxRequestBytes: 64 << 10, Registry: reg, Gatherer: reg})
}

// serve starts a front of o on loopback, closed when the test ends, and
// a gRPC client of it.
func serve(t *testing.T, o server.Options) (*server.Server, kservepb.GRPCInferenceServiceClient) {
	t.Helper()
	o.GRPCAddr, o.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	s, err := server.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, kservepb.NewGRPCInferenceServiceClient(conn)
}

func post(t *testing.T, s *server.Server, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+s.HTTPAddr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func get(t *testing.T, s *server.Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.HTTPAddr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func inferJSON(ids []int64, splits []int64, shared []int64) string {
	in := []map[string]any{
		{"name": "ids", "datatype": "INT64", "shape": []int{len(ids)}, "data": ids},
		{"name": "row_splits", "datatype": "INT64", "shape": []int{len(splits)}, "data": splits},
	}
	if shared != nil {
		in = append(in, map[string]any{"name": "shared_ids", "datatype": "INT64", "shape": []int{len(shared)}, "data": shared})
	}
	b, _ := json.Marshal(map[string]any{"inputs": in})
	return string(b)
}

func scoresOf(t *testing.T, body string) []float32 {
	t.Helper()
	var r struct {
		Outputs []struct {
			Data []float32 `json:"data"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Outputs) != 1 {
		t.Fatalf("response %s: %v", body, err)
	}
	return r.Outputs[0].Data
}

func TestFront(t *testing.T) {
	s, client := start(t)
	ctx := context.Background()

	// Shared features are the same as repeating them in every row.
	shared := []int64{3, 14, 15, 92}
	rows := [][]int64{{1, 2}, {}, {65, 35, 89, 79}}
	var ids, expanded []int64
	splits, expSplits := []int64{0}, []int64{0}
	for _, r := range rows {
		ids = append(ids, r...)
		splits = append(splits, int64(len(ids)))
		expanded = append(append(expanded, shared...), r...)
		expSplits = append(expSplits, int64(len(expanded)))
	}
	code, body := post(t, s, "/v2/models/fm/infer", inferJSON(ids, splits, shared))
	if code != 200 {
		t.Fatalf("shared: %d %s", code, body)
	}
	code, body2 := post(t, s, "/v2/models/fm/infer", inferJSON(expanded, expSplits, nil))
	if code != 200 {
		t.Fatalf("expanded: %d %s", code, body2)
	}
	a, b := scoresOf(t, body), scoresOf(t, body2)
	for i := range a {
		if !(math.Abs(float64(a[i]-b[i])) <= 1e-6) {
			t.Errorf("row %d: %v with shared features, %v with them repeated", i, a[i], b[i])
		}
	}

	// Raw contents in, raw scores out, equal to the typed answer.
	raw := &kservepb.ModelInferRequest{ModelName: "fm", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
		{Name: "ids", Datatype: "UINT64", Shape: []int64{int64(len(expanded))}},
		{Name: "row_splits", Datatype: "INT64", Shape: []int64{int64(len(expSplits))}},
	}, RawInputContents: [][]byte{bench.RawUint64(u64(expanded)), bench.RawUint64(u64(expSplits))}}
	resp, err := client.ModelInfer(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	got, err := bench.Scores(resp)
	if err != nil || len(resp.RawOutputContents) != 1 || len(got) != 3 {
		t.Fatalf("raw response %v: %v", resp, err)
	}
	for i := range got {
		if got[i] != b[i] {
			t.Errorf("raw row %d: %v, typed %v", i, got[i], b[i])
		}
	}

	// Limits: a clear InvalidArgument / 400, never a crash.
	many := make([]int64, 52)
	code, body = post(t, s, "/v2/models/fm/infer", inferJSON(nil, many, nil))
	if code != 400 || !strings.Contains(body, "limit of 50") {
		t.Errorf("51 rows: %d %s", code, body)
	}
	big := make([]int64, 6000)
	code, body = post(t, s, "/v2/models/fm/infer", inferJSON(big, []int64{0, 6000}, nil))
	if code != 400 || !strings.Contains(body, "limit") {
		t.Errorf("over the body or id limit: %d %s", code, body)
	}
	huge := &kservepb.ModelInferRequest{ModelName: "fm", RawInputContents: [][]byte{make([]byte, 100<<10)}}
	if _, err := client.ModelInfer(ctx, huge); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("oversized gRPC message: %v", err)
	}

	// Health and metadata, both protocols.
	for path, want := range map[string]int{
		"/v2/health/live": 200, "/v2/health/ready": 200, "/v2/models/fm/ready": 200,
		"/v2/models/fm/versions/1/ready": 200, "/v2/models/fm/versions/2/ready": 503, "/v2/models/nope/ready": 404,
		"/v2/models/fm/versions/1": 200, "/v2/models/fm/versions/2": 404, "/v2/models/fm/versions/x": 400,
	} {
		if code, body := get(t, s, path); code != want {
			t.Errorf("GET %s: %d %s, want %d", path, code, body, want)
		}
	}
	for path, want := range map[string]string{"/v2/health/live": `{"live":true}`, "/v2/health/ready": `{"ready":true}`} {
		if _, body := get(t, s, path); strings.TrimSpace(body) != want {
			t.Errorf("GET %s: body %q, want %s (what KServe's REST client reads)", path, body, want)
		}
	}
	if code, body := get(t, s, "/v2"); code != 200 || !strings.Contains(body, `"extensions":["binary_tensor_data"]`) {
		t.Errorf("server metadata: %d %s, want the binary tensor extension listed", code, body)
	}
	if code, body := get(t, s, "/v2/models/fm"); code != 200 || !strings.Contains(body, `"versions":["1"]`) || !strings.Contains(body, "row_splits") {
		t.Errorf("metadata: %d %s", code, body)
	}
	if r, err := client.ServerReady(ctx, &kservepb.ServerReadyRequest{}); err != nil || !r.Ready {
		t.Errorf("ServerReady: %v %v", r, err)
	}
	if r, err := client.ModelReady(ctx, &kservepb.ModelReadyRequest{Name: "fm"}); err != nil || !r.Ready {
		t.Errorf("ModelReady: %v %v", r, err)
	}
	if _, err := client.ModelReady(ctx, &kservepb.ModelReadyRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("ModelReady unknown: %v", err)
	}
	md, err := client.ModelMetadata(ctx, &kservepb.ModelMetadataRequest{Name: "fm"})
	if err != nil || md.Platform != "cumulus_fm" || len(md.Inputs) != 5 || md.Outputs[0].Name != "scores" {
		t.Errorf("ModelMetadata: %v %v", md, err)
	}
	if code, body := get(t, s, "/metrics"); code != 200 || !strings.Contains(body, `cumulus_infer_requests_total{api="http",code="invalid_argument"}`) {
		t.Errorf("metrics: %d\n%s", code, body)
	}
}

func u64(v []int64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = uint64(x)
	}
	return out
}
