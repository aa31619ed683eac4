package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// binaryBody builds a binary-extension request: a JSON header naming
// each input's binary_data_size, then the inputs' bytes in order.
func binaryBody(t *testing.T, ids, splits []int64, id string, binaryOut bool) (string, []byte) {
	t.Helper()
	raw := [][]byte{bench.RawUint64(u64(ids)), bench.RawUint64(u64(splits))}
	hdr := map[string]any{"id": id, "inputs": []map[string]any{
		{"name": "ids", "datatype": "INT64", "shape": []int{len(ids)}, "parameters": map[string]any{"binary_data_size": len(raw[0])}},
		{"name": "row_splits", "datatype": "INT64", "shape": []int{len(splits)}, "parameters": map[string]any{"binary_data_size": len(raw[1])}},
	}}
	if binaryOut {
		hdr["outputs"] = []map[string]any{{"name": "scores", "parameters": map[string]any{"binary_data": true}}}
	}
	h, _ := json.Marshal(hdr)
	return strconv.Itoa(len(h)), append(append(h, raw[0]...), raw[1]...)
}

func postBinary(t *testing.T, s *server.Server, hdrLen string, body []byte) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+s.HTTPAddr()+"/v2/models/fm/infer", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/octet-stream")
	if hdrLen != "" {
		req.Header.Set("Inference-Header-Content-Length", hdrLen)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestBinaryTensorExtension: KServe's binary extension in and out answers
// what JSON answers, echoes the id and names the model and version; a
// malformed binary body is a 400 naming the problem.
func TestBinaryTensorExtension(t *testing.T) {
	s, _ := start(t)
	ids, splits := []int64{1, 2, 65, 35, 89, 79, 3}, []int64{0, 2, 2, 7}
	code, body := post(t, s, "/v2/models/fm/infer", inferJSON(ids, splits, nil))
	if code != 200 {
		t.Fatalf("json: %d %s", code, body)
	}
	want := scoresOf(t, body)

	for _, binaryOut := range []bool{false, true} {
		hl, b := binaryBody(t, ids, splits, "req-42", binaryOut)
		resp := postBinary(t, s, hl, b)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("binary in (out %v): %d %s", binaryOut, resp.StatusCode, raw)
		}
		jsonPart := raw
		if binaryOut {
			n, err := strconv.Atoi(resp.Header.Get("Inference-Header-Content-Length"))
			if err != nil || n > len(raw) {
				t.Fatalf("binary out: Inference-Header-Content-Length %q for %d bytes", resp.Header.Get("Inference-Header-Content-Length"), len(raw))
			}
			jsonPart = raw[:n]
			tail := raw[n:]
			if len(tail) != 4*len(want) {
				t.Fatalf("binary out: %d bytes after the header for %d scores", len(tail), len(want))
			}
			for i := range want {
				if got := math.Float32frombits(binary.LittleEndian.Uint32(tail[4*i:])); got != want[i] {
					t.Errorf("binary score %d: %v, JSON %v", i, got, want[i])
				}
			}
		}
		var r struct {
			ModelName    string `json:"model_name"`
			ModelVersion string `json:"model_version"`
			ID           string `json:"id"`
			Outputs      []struct {
				Data       []float32      `json:"data"`
				Parameters map[string]int `json:"parameters"`
			} `json:"outputs"`
		}
		if err := json.Unmarshal(jsonPart, &r); err != nil || len(r.Outputs) != 1 {
			t.Fatalf("response header %s: %v", jsonPart, err)
		}
		if r.ModelName != "fm" || r.ModelVersion != "1" || r.ID != "req-42" {
			t.Errorf("response names model %q version %q id %q, want fm 1 req-42", r.ModelName, r.ModelVersion, r.ID)
		}
		if binaryOut && r.Outputs[0].Parameters["binary_data_size"] != 4*len(want) {
			t.Errorf("binary out: parameters %v", r.Outputs[0].Parameters)
		}
		if !binaryOut && fmt.Sprint(r.Outputs[0].Data) != fmt.Sprint(want) {
			t.Errorf("binary in, JSON out: %v, want %v", r.Outputs[0].Data, want)
		}
	}
	// The request-wide parameter asks for every output in binary.
	h := `{"parameters":{"binary_data_output":true},"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[5]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]}`
	resp := postBinary(t, s, strconv.Itoa(len(h)), []byte(h))
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n, _ := strconv.Atoi(resp.Header.Get("Inference-Header-Content-Length")); resp.StatusCode != 200 || len(raw)-n != 4 {
		t.Errorf("binary_data_output: %d, header %d of %d bytes", resp.StatusCode, n, len(raw))
	}

	hl, good := binaryBody(t, ids, splits, "", false)
	n, _ := strconv.Atoi(hl)
	for _, tc := range []struct {
		name, hdr string
		body      []byte
		want      string
	}{
		{"bytes missing", hl, good[:len(good)-3], "ends before its"},
		{"bytes left over", hl, append(bytes.Clone(good), 0), "bytes after the last binary input"},
		{"no header length", "", good, "after the JSON document"},
		{"header length past the JSON", strconv.Itoa(n + 5), good, "after the JSON document"},
		{"header length inside the JSON", strconv.Itoa(n - 5), good, "ends early"},
		{"header length not a number", "x", good, "Inference-Header-Content-Length"},
		{"size not the shape's", hl, bytes.Replace(good, []byte(`"binary_data_size":56`), []byte(`"binary_data_size":48`), 1), "binary_data_size 48 for shape [7]"},
	} {
		resp := postBinary(t, s, tc.hdr, tc.body)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(msg), tc.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", tc.name, resp.StatusCode, msg, tc.want)
		}
	}
	// JSON data with binary_data_size but no header: refused, not misread.
	h = `{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"parameters":{"binary_data_size":8}},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]}`
	if code, body := post(t, s, "/v2/models/fm/infer", h); code != 400 || !strings.Contains(body, "no Inference-Header-Content-Length header") {
		t.Errorf("binary_data_size without the header: %d %s", code, body)
	}
}

// gate is a Predictor whose answers wait until released, or until the
// request's context ends: a request can be held in flight on purpose.
type gate struct {
	arrived chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{arrived: make(chan struct{}, 100), release: make(chan struct{})} }

func (g *gate) Predict(ctx context.Context, req *router.Request) (*router.Response, error) {
	g.arrived <- struct{}{}
	select {
	case <-g.release:
		return &router.Response{Model: req.Model, Version: 3, Scores: make([]float32, req.Rows())}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("gate: %w", router.ErrDeadlineExceeded)
	}
}
func (g *gate) Ready() bool     { return true }
func (g *gate) Revision() int64 { return 1 }
func (g *gate) Model(name string) (router.ModelStatus, bool) {
	return router.ModelStatus{Name: name, Ready: true, Live: 3, Versions: []uint64{3}, Shape: model.Shape{Type: model.LR}}, name == "m"
}

func startGated(t *testing.T, o server.Options) (*server.Server, *gate, kservepb.GRPCInferenceServiceClient) {
	t.Helper()
	g := newGate()
	s, client := startFront(t, o, g)
	t.Cleanup(func() { close(g.release) }) // before Close: let held requests end
	return s, g, client
}

// startFront starts a front on loopback ports over p, with a registry of
// its own and a gRPC client, all stopped when the test ends.
func startFront(t *testing.T, o server.Options, p server.Predictor) (*server.Server, kservepb.GRPCInferenceServiceClient) {
	t.Helper()
	o.Predictor, o.GRPCAddr, o.HTTPAddr = p, "127.0.0.1:0", "127.0.0.1:0"
	reg := prometheus.NewRegistry()
	o.Registry, o.Gatherer = reg, reg
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

const oneRow = `{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[5]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]}`

func grpcOneRow() *kservepb.ModelInferRequest {
	return &kservepb.ModelInferRequest{ModelName: "m", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
		{Name: "ids", Datatype: "INT64", Shape: []int64{1}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{5}}},
		{Name: "row_splits", Datatype: "INT64", Shape: []int64{2}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{0, 1}}},
	}}
}

// TestOverloadIsRefusedFast: with its one slot held, the front refuses
// the next request, REST with 429 and Retry-After, gRPC with
// ResourceExhausted and a retry pushback; once the slot is free it serves
// again.
func TestOverloadIsRefusedFast(t *testing.T) {
	s, g, client := startGated(t, server.Options{MaxInflight: 1, MaxQueueTime: time.Millisecond, RequestTimeout: time.Minute})
	held := make(chan error, 1)
	go func() {
		_, err := client.ModelInfer(context.Background(), grpcOneRow())
		held <- err
	}()
	<-g.arrived

	resp, err := http.Post("http://"+s.HTTPAddr()+"/v2/models/m/infer", "application/json", strings.NewReader(oneRow))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("REST over the bound: %d Retry-After %q, want 429 and 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	var trailer metadata.MD
	_, err = client.ModelInfer(context.Background(), grpcOneRow(), grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || len(trailer.Get("grpc-retry-pushback-ms")) != 1 {
		t.Errorf("gRPC over the bound: %v, trailer %v; want ResourceExhausted with grpc-retry-pushback-ms", err, trailer)
	}
	g.release <- struct{}{}
	if err := <-held; err != nil {
		t.Fatalf("the held request: %v", err)
	}
	go func() { g.release <- struct{}{} }()
	if code, body := postTo(t, s, "/v2/models/m/infer", oneRow); code != 200 {
		t.Errorf("after the overload: %d %s", code, body)
	}
	if code, body := get(t, s, "/metrics"); !strings.Contains(body, `cumulus_admission_refused_total{api="grpc",bound="requests"} 1`) ||
		!strings.Contains(body, `cumulus_admission_refused_total{api="http",bound="requests"} 1`) {
		t.Errorf("metrics: %d\n%s", code, body)
	}
}

// TestAdmissionWeighsBytes: requests are weighed by their decoded ids
// and values, over REST as over gRPC: one that would take the in-flight
// bytes past the bound is refused, even with slots free, and a small one
// is admitted beside the held one.
func TestAdmissionWeighsBytes(t *testing.T) {
	s, g, client := startGated(t, server.Options{MaxInflightBytes: 1000, MaxQueueTime: time.Millisecond, RequestTimeout: time.Minute})
	// 100 ids and their row splits are 816 bytes decoded.
	heavyJSON := inferJSON(make([]int64, 100), []int64{0, 100}, nil)
	first := make(chan int, 1)
	go func() {
		code, _ := postTo(t, s, "/v2/models/m/infer", heavyJSON)
		first <- code
	}()
	<-g.arrived
	if code, msg := postTo(t, s, "/v2/models/m/infer", heavyJSON); code != 429 || !strings.Contains(msg, "bytes") {
		t.Errorf("816 bytes beside 816 of 1000: %d %s, want 429 naming bytes", code, msg)
	}
	heavy := grpcOneRow()
	heavy.Inputs[0].Contents.Int64Contents = make([]int64, 100)
	heavy.Inputs[0].Shape = []int64{100}
	heavy.Inputs[1].Contents.Int64Contents = []int64{0, 100}
	var trailer metadata.MD
	if _, err := client.ModelInfer(context.Background(), heavy, grpc.Trailer(&trailer)); status.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(err.Error(), "bytes") || len(trailer.Get("grpc-retry-pushback-ms")) != 1 {
		t.Errorf("816 bytes of ids beside 816 of 1000: %v, trailer %v; want ResourceExhausted naming bytes, one pushback", err, trailer)
	}
	// A small one is admitted beside it: it reaches the predictor.
	second := make(chan int, 1)
	go func() {
		code, _ := postTo(t, s, "/v2/models/m/infer", oneRow)
		second <- code
	}()
	<-g.arrived
	g.release <- struct{}{}
	g.release <- struct{}{}
	if a, b := <-first, <-second; a != 200 || b != 200 {
		t.Errorf("the 816-byte request: %d, the small one beside it: %d; want 200 and 200", a, b)
	}
}

// TestDeadlines: the request's own deadline reaches the predictor, the
// shortest of gRPC's, the timeout parameter and the server's bound; a
// missed one is 504 / DeadlineExceeded. A body trickled in past the
// request's time is cut off and the server goes on serving.
func TestDeadlines(t *testing.T) {
	s, g, client := startGated(t, server.Options{RequestTimeout: time.Minute})
	withTimeout := strings.Replace(oneRow, `{"inputs"`, `{"parameters":{"timeout":20000},"inputs"`, 1)
	if code, body := postTo(t, s, "/v2/models/m/infer", withTimeout); code != 504 || !strings.Contains(body, "deadline") {
		t.Errorf("timeout parameter of 20 ms, predictor holding: %d %s, want 504", code, body)
	}
	<-g.arrived
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := client.ModelInfer(ctx, grpcOneRow()); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("gRPC deadline of 20 ms: %v, want DeadlineExceeded", err)
	}
	<-g.arrived
	req := grpcOneRow()
	req.Parameters = map[string]*kservepb.InferParameter{"timeout": {ParameterChoice: &kservepb.InferParameter_Int64Param{Int64Param: 20000}}}
	if _, err := client.ModelInfer(context.Background(), req); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("gRPC timeout parameter of 20 ms: %v, want DeadlineExceeded", err)
	}
	<-g.arrived
	req.Parameters["timeout"] = &kservepb.InferParameter{ParameterChoice: &kservepb.InferParameter_StringParam{StringParam: "20ms"}}
	if _, err := client.ModelInfer(context.Background(), req); status.Code(err) != codes.InvalidArgument {
		t.Errorf("gRPC timeout parameter as a string: %v, want InvalidArgument", err)
	}

	// The server's own bound, and a body that arrives too slowly for it.
	s2, g2, client2 := startGated(t, server.Options{RequestTimeout: 100 * time.Millisecond, MaxInflight: 1})
	if code, _ := postTo(t, s2, "/v2/models/m/infer", oneRow); code != 504 {
		t.Errorf("server bound of 100 ms, predictor holding: %d, want 504", code)
	}
	<-g2.arrived
	// Nothing more is sent; the server must give up on the body.
	resp, msg := rawPost(t, s2.HTTPAddr(), "", len(oneRow), oneRow[:10])
	if resp.StatusCode != 504 || !strings.Contains(msg, "did not arrive within the request's time") {
		t.Errorf("trickled body: %d %s, want 504 saying the body did not arrive", resp.StatusCode, msg)
	}
	// A gRPC stream whose message never comes holds no slot, and only
	// for the request's time, then is DeadlineExceeded.
	if err := neverSent(t, s2.GRPCAddr()); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("gRPC message never sent: %v, want DeadlineExceeded", err)
	}
	// Released as soon as they reach the predictor: the server's bound is
	// short.
	grpcDone := make(chan error, 1)
	go func() {
		_, err := client2.ModelInfer(context.Background(), grpcOneRow())
		grpcDone <- err
	}()
	select {
	case <-g2.arrived:
		g2.release <- struct{}{}
		if err := <-grpcDone; err != nil {
			t.Errorf("after the message that never came: %v", err)
		}
	case err := <-grpcDone:
		t.Errorf("after the message that never came: %v, before reaching the predictor", err)
	}
	httpDone := make(chan string, 1)
	go func() {
		code, body := postTo(t, s2, "/v2/models/m/infer", oneRow)
		httpDone <- fmt.Sprint(code, " ", body)
	}()
	select {
	case <-g2.arrived:
		select {
		case g2.release <- struct{}{}:
		case got := <-httpDone:
			t.Fatalf("after the trickled body: %s, before it was released", got)
		}
		if got := <-httpDone; !strings.HasPrefix(got, "200 ") {
			t.Errorf("after the trickled body: %s", got)
		}
	case got := <-httpDone:
		t.Errorf("after the trickled body: %s, before reaching the predictor", got)
	}
}

// postTo is post for any goroutine: a failure to post is a status of 0.
func postTo(t *testing.T, s *server.Server, path, body string) (int, string) {
	resp, err := http.Post("http://"+s.HTTPAddr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestOversizedBodyRefusedUnread: a body announced over the limit is a
// 400 answered from its Content-Length, before any of it is sent.
func TestOversizedBodyRefusedUnread(t *testing.T) {
	s, _, _ := startGated(t, server.Options{MaxRequestBytes: 1000})
	conn, err := net.Dial("tcp", s.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 66000000\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer before the body: %v", err)
	}
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(msg), "over the limit of 1000 bytes") {
		t.Errorf("66 MB announced, 1000 allowed: %d %s", resp.StatusCode, msg)
	}
}

// TestRefusedBeforeTheMessage: with the one slot held and the queue as
// long as it may be, a gRPC request is refused before its message is
// read (grpc-go reads a unary message only when the handler asks, and
// admission comes first): ResourceExhausted carrying RetryInfo. The
// queued request is served once the slot is free.
func TestRefusedBeforeTheMessage(t *testing.T) {
	s, g, client := startGated(t, server.Options{MaxInflight: 1, MaxQueueTime: time.Hour})
	results := make(chan error, 2)
	go func() {
		_, err := client.ModelInfer(context.Background(), grpcOneRow())
		results <- err
	}()
	<-g.arrived
	go func() {
		_, err := client.ModelInfer(context.Background(), grpcOneRow())
		results <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() error {
		if _, body := get(t, s, "/metrics"); !strings.Contains(body, "cumulus_admission_waiting 1") {
			return errors.New("the second request is not queued yet")
		}
		return nil
	})
	// A stream whose message never comes: only a refusal made before the
	// message is read answers it.
	err := neverSent(t, s.GRPCAddr())
	st := status.Convert(err)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if st.Code() != codes.ResourceExhausted || retry == nil || retry.RetryDelay.AsDuration() <= 0 {
		t.Errorf("third request, queue full: %v (details %v), want ResourceExhausted with RetryInfo", err, st.Details())
	}
	g.release <- struct{}{}
	<-g.arrived // the queued request reaches the predictor
	g.release <- struct{}{}
	for range 2 {
		if err := <-results; err != nil {
			t.Errorf("the held or the queued request: %v", err)
		}
	}
}

// TestTinyVarintsAreCountedBeforeDecoding: a message within the receive
// limit that packs far more ids than the limits allow, as 1-byte varints
// (each an 8-byte int64 decoded), is refused before it is decoded, naming
// the problem.
func TestTinyVarintsAreCountedBeforeDecoding(t *testing.T) {
	_, _, client := startGated(t, server.Options{Limits: router.Limits{MaxIDs: 1000, MaxRows: 10}})
	req := grpcOneRow()
	req.Inputs[0].Contents.Int64Contents = make([]int64, 60_000) // 60 KB on the wire, under the receive limit
	req.Inputs[0].Shape = []int64{60_000}
	_, err := client.ModelInfer(context.Background(), req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "carries more than") {
		t.Errorf("60,000 one-byte ids, limit 1,000: %v, want InvalidArgument counted before decoding", err)
	}
}

// TestRankAndNegativeLimits: every input of the contract is 1-D: a 2-D
// ids tensor (its data nested or flat) is refused by name over REST and
// gRPC, not flattened; negative limits are refused at start.
func TestRankAndNegativeLimits(t *testing.T) {
	s, _, client := startGated(t, server.Options{})
	req := grpcOneRow()
	req.Inputs[0].Shape = []int64{1, 1, 1, 1, 1}
	if _, err := client.ModelInfer(context.Background(), req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `input "ids" has shape [1 1 1 1 1]`) {
		t.Errorf("rank 5 over gRPC: %v", err)
	}
	req.Inputs[0].Contents.Int64Contents = []int64{5, 6}
	req.Inputs[0].Shape = []int64{1, 2}
	if _, err := client.ModelInfer(context.Background(), req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `input "ids" has shape [1 2]`) {
		t.Errorf("ids [1 2] over gRPC: %v", err)
	}
	for _, data := range []string{`[[5, 6]]`, `[5, 6]`} {
		body := `{"inputs":[{"name":"ids","datatype":"INT64","shape":[1,2],"data":` + data + `},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,2]}]}`
		if code, msg := postTo(t, s, "/v2/models/m/infer", body); code != 400 || !strings.Contains(msg, `input \"ids\" has shape [1 2]: every input but dense is 1-D`) {
			t.Errorf("ids [1 2] over REST, data %s: %d %s", data, code, msg)
		}
	}
	_, err := server.Start(server.Options{Predictor: newGate(), Limits: router.Limits{MaxIDs: -5}, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registry: prometheus.NewRegistry()})
	if err == nil || !strings.Contains(err.Error(), "must not be negative") {
		t.Errorf("--max-ids -5: %v, want refused at start", err)
	}
}
