package bench_test

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// clients are the three protocols' clients of f.
func (f front) clients(t *testing.T) map[string]bench.Inferer {
	t.Helper()
	cs := map[string]bench.Inferer{"grpc": f.grpc}
	for name, bin := range map[string]bool{"rest": false, "rest-binary": true} {
		c, err := bench.NewRESTClient(bench.RESTOptions{Addr: f.srv.HTTPAddr(), Binary: bin})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		cs[name] = c
	}
	return cs
}

// The same requests get the same scores, to the bit, and the same
// version over gRPC, REST JSON and REST binary; prepared or not, with a
// deadline (sent as the timeout parameter) or without.
func TestProtocolsAgree(t *testing.T) {
	f := startFront(t, model.FM)
	clients := f.clients(t)
	for _, w := range []string{"rank200", "small"} {
		g, _ := bench.NewGenerator(bench.Workloads[w], *f.m.Generator, f.m.Params, 5)
		for i := range 2 {
			req := g.Request("b")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if i == 1 {
				ctx = context.Background()
			}
			want, err := f.grpc.ModelInfer(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			wantScores, _ := bench.Scores(want)
			if len(wantScores) != bench.Workloads[w].Rows {
				t.Fatalf("%s: %d scores over gRPC, want %d", w, len(wantScores), bench.Workloads[w].Rows)
			}
			for _, p := range []string{"rest", "rest-binary"} {
				c := clients[p].(*bench.RESTClient)
				if i == 0 {
					if n, err := c.Prepare(req); err != nil || n <= 0 {
						t.Fatalf("%s %s: Prepare = %d, %v", w, p, n, err)
					}
				}
				got, err := c.ModelInfer(ctx, req)
				if err != nil {
					t.Fatalf("%s %s request %d: %v", w, p, i, err)
				}
				scores, err := bench.Scores(got)
				if err != nil {
					t.Fatalf("%s %s: %v", w, p, err)
				}
				if got.ModelName != want.ModelName || got.ModelVersion != want.ModelVersion || len(scores) != len(wantScores) {
					t.Fatalf("%s %s: model %s v%s, %d scores; gRPC: %s v%s, %d", w, p, got.ModelName, got.ModelVersion, len(scores),
						want.ModelName, want.ModelVersion, len(wantScores))
				}
				for j := range scores {
					if math.Float32bits(scores[j]) != math.Float32bits(wantScores[j]) {
						t.Fatalf("%s %s: score %d is %v, over gRPC %v", w, p, j, scores[j], wantScores[j])
					}
				}
			}
			cancel()
		}
	}
}

// An error keeps its code whichever protocol carries it.
func TestProtocolErrorCodes(t *testing.T) {
	f := startFront(t, model.LR)
	clients := f.clients(t)
	g, _ := bench.NewGenerator(bench.Workloads["small"], *f.m.Generator, f.m.Params, 6)
	base := g.Request("b")
	for _, tc := range []struct {
		name   string
		change func(r *kservepb.ModelInferRequest)
		want   codes.Code
	}{
		{"unknown model", func(r *kservepb.ModelInferRequest) { r.ModelName = "nope" }, codes.NotFound},
		{"unknown input", func(r *kservepb.ModelInferRequest) {
			r.Inputs = append(r.Inputs, &kservepb.ModelInferRequest_InferInputTensor{Name: "bogus", Datatype: "UINT64", Shape: []int64{1}})
			r.RawInputContents = append(r.RawInputContents, bench.RawUint64([]uint64{7}))
		}, codes.InvalidArgument},
		{"shape and data disagree", func(r *kservepb.ModelInferRequest) { r.Inputs[0].Shape[0]++ }, codes.InvalidArgument},
		{"unknown version", func(r *kservepb.ModelInferRequest) { r.ModelVersion = "x" }, codes.InvalidArgument},
	} {
		req := proto.Clone(base).(*kservepb.ModelInferRequest)
		tc.change(req)
		for p, c := range clients {
			_, err := c.ModelInfer(context.Background(), req)
			if status.Code(err) != tc.want {
				t.Errorf("%s over %s: %v, want %s", tc.name, p, err, tc.want)
			}
		}
	}
}

// A closed-loop run over REST completes its requests, and reports the
// size of the bodies it sends.
func TestRunOverREST(t *testing.T) {
	f := startFront(t, model.LR)
	clients := f.clients(t)
	bytes := map[string]int{}
	for _, p := range []string{"grpc", "rest", "rest-binary"} {
		g, _ := bench.NewGenerator(bench.Workloads["small"], *f.m.Generator, f.m.Params, 3)
		res := bench.Run(context.Background(), bench.LoadOptions{Client: clients[p], Model: "b", Generator: g,
			Concurrency: 2, Duration: time.Minute, MaxRequests: 10, Distinct: 2, Timeout: 30 * time.Second})
		if res.Requests != 10 || res.Errors != 0 {
			t.Fatalf("%s: requests %d, errors %d (%v)", p, res.Requests, res.Errors, res.FirstError)
		}
		bytes[p] = res.RequestBytes
	}
	// Binary carries the raw bytes of gRPC's message plus a JSON header;
	// JSON writes each 8-byte id as up to 20 digits.
	if !(bytes["grpc"] < bytes["rest-binary"] && bytes["rest-binary"] < bytes["rest"]) {
		t.Fatalf("request bytes %v", bytes)
	}
}

// The REST client writes the binary extension's body as the server
// reads it, sends the deadline as the timeout parameter, and maps HTTP
// statuses to gRPC codes, a 429's Retry-After to pushback.
func TestRESTWireAndStatuses(t *testing.T) {
	type seen struct {
		header  map[string]any
		rest    []byte
		timeout float64
	}
	got := make(chan seen, 1)
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n, err := strconv.Atoi(r.Header.Get("Inference-Header-Content-Length"))
		if err != nil || n > len(body) || r.Header.Get("Content-Type") != "application/octet-stream" {
			http.Error(w, `{"error":"no binary header"}`, http.StatusTeapot)
			return
		}
		var s seen
		json.Unmarshal(body[:n], &s.header)
		s.rest = body[n:]
		if p, ok := s.header["parameters"].(map[string]any); ok {
			s.timeout, _ = p["timeout"].(float64)
		}
		got <- s
		code, _ := strconv.Atoi(strings.Split(strings.TrimPrefix(r.URL.Path, "/v2/models/"), "/")[0])
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "2")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		w.Write([]byte(`{"error":"told to"}`))
	}))
	defer fake.Close()
	c, err := bench.NewRESTClient(bench.RESTOptions{Addr: strings.TrimPrefix(fake.URL, "http://"), Binary: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ids, splits := []uint64{1, 2, 3}, []uint64{0, 3}
	for _, tc := range []struct {
		http     int
		want     codes.Code
		pushback string
	}{
		{400, codes.InvalidArgument, ""}, {404, codes.NotFound, ""}, {429, codes.ResourceExhausted, "2000"},
		{500, codes.Internal, ""}, {503, codes.Unavailable, ""}, {504, codes.DeadlineExceeded, ""}, {418, codes.Unknown, ""},
	} {
		req := &kservepb.ModelInferRequest{ModelName: strconv.Itoa(tc.http),
			Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
				{Name: "ids", Datatype: "UINT64", Shape: []int64{3}},
				{Name: "row_splits", Datatype: "INT64", Shape: []int64{2}},
			},
			RawInputContents: [][]byte{bench.RawUint64(ids), bench.RawUint64(splits)}}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var trailer metadata.MD
		_, err := c.ModelInfer(ctx, req, grpc.Trailer(&trailer))
		cancel()
		if status.Code(err) != tc.want || !strings.Contains(err.Error(), "told to") {
			t.Errorf("HTTP %d: %v, want %s", tc.http, err, tc.want)
		}
		if p := strings.Join(trailer.Get("grpc-retry-pushback-ms"), ","); p != tc.pushback {
			t.Errorf("HTTP %d: pushback %q, want %q", tc.http, p, tc.pushback)
		}
		s := <-got
		if !(s.timeout > 0 && s.timeout <= 60e6) {
			t.Errorf("HTTP %d: timeout parameter %v µs for a deadline of a minute", tc.http, s.timeout)
		}
		wantRest := append(bench.RawUint64(ids), bench.RawUint64(splits)...)
		if string(s.rest) != string(wantRest) {
			t.Errorf("HTTP %d: %d bytes after the header, want %d", tc.http, len(s.rest), len(wantRest))
		}
		inputs, _ := s.header["inputs"].([]any)
		outputs, _ := json.Marshal(s.header["outputs"])
		if len(inputs) != 2 || string(outputs) != `[{"name":"scores","parameters":{"binary_data":true}}]` {
			t.Errorf("HTTP %d: header %v", tc.http, s.header)
		}
		for i, in := range inputs {
			m, _ := in.(map[string]any)
			params, _ := m["parameters"].(map[string]any)
			size, _ := params["binary_data_size"].(float64)
			if _, hasData := m["data"]; hasData || int(size) != len(req.RawInputContents[i]) {
				t.Errorf("HTTP %d: input %d is %v", tc.http, i, m)
			}
		}
	}
}
