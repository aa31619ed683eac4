package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// jsonDepth is the deepest nesting of arrays and objects in doc.
func jsonDepth(t *testing.T, doc []byte) int {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
			deepest = max(deepest, depth)
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}

func TestDeepJSON(t *testing.T) {
	b := bench.DeepJSON(9_990)
	if !json.Valid(b) {
		t.Fatal("not valid JSON")
	}
	// The request object, inputs and the input around the data.
	if d := jsonDepth(t, b); d != 9_990+3 {
		t.Errorf("nested %d deep, want %d", d, 9_990+3)
	}
	if len(b) < 2*9_990 || len(b) > 2*9_990+200 {
		t.Errorf("%d bytes", len(b))
	}
}

// inferBody is the part of a KServe JSON body the checks read.
type inferBody struct {
	Inputs []struct {
		Name, Datatype string
		Shape          []int64
		Data           []json.RawMessage
	}
}

func TestBigJSON(t *testing.T) {
	for _, size := range []int{1_000_000, 999_999, 1_000_017, 300} {
		b, n := bench.BigJSON(size)
		if len(b) != size {
			t.Errorf("size %d: %d bytes", size, len(b))
		}
		if !json.Valid(b) {
			t.Fatalf("size %d: not valid JSON", size)
		}
		var body inferBody
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatal(err)
		}
		if len(body.Inputs) != 2 || body.Inputs[0].Name != "ids" || body.Inputs[1].Name != "row_splits" {
			t.Fatalf("size %d: inputs %+v", size, body.Inputs)
		}
		ids, splits := body.Inputs[0], body.Inputs[1]
		if len(ids.Data) != n || len(ids.Shape) != 1 || ids.Shape[0] != int64(n) || ids.Datatype != "UINT64" {
			t.Fatalf("size %d: %d elements, %d reported, shape %v", size, len(ids.Data), n, ids.Shape)
		}
		if string(splits.Data[0]) != "0" || string(splits.Data[1]) != strconv.Itoa(n) {
			t.Errorf("size %d: row_splits %s", size, splits.Data)
		}
		for i, e := range ids.Data[:n-1] {
			if _, err := strconv.ParseUint(string(e), 10, 64); err != nil || len(e) != 19 {
				t.Fatalf("size %d: element %d is %s", size, i, e)
			}
		}
		if last := string(ids.Data[n-1]); last != "1.5" {
			t.Errorf("size %d: last element %s", size, last)
		}
		if size >= 1_000_000 && n < 49_000 {
			t.Errorf("size %d: only %d elements", size, n)
		}
	}
}

func TestBigGRPC(t *testing.T) {
	for _, size := range []int{1 << 20, 1<<20 + 5, 4096} {
		msg, n := bench.BigGRPC("m", size)
		if len(msg) > size || len(msg) < size-16 {
			t.Errorf("size %d: %d bytes", size, len(msg))
		}
		var req kservepb.ModelInferRequest
		if err := proto.Unmarshal(msg, &req); err != nil {
			t.Fatal(err)
		}
		if req.ModelName != "m" || len(req.Inputs) != 2 || len(req.RawInputContents) != 2 {
			t.Fatalf("size %d: %d inputs, %d raw", size, len(req.Inputs), len(req.RawInputContents))
		}
		if len(req.RawInputContents[0]) != 8*n || req.Inputs[0].Shape[0] != int64(n) {
			t.Errorf("size %d: %d raw bytes of ids, shape %v, %d reported", size, len(req.RawInputContents[0]), req.Inputs[0].Shape, n)
		}
		if !bytes.Equal(req.RawInputContents[1], bench.RawUint64([]uint64{0, uint64(n)})) {
			t.Errorf("size %d: row_splits %x", size, req.RawInputContents[1])
		}
	}
}

// Against a front whose limits make the small inputs hostile too (65,536
// ids, so a 1 MiB message of ids is over them), each is refused with its
// code, measured, and the front still answers good traffic, also beside
// them. No timing is checked.
func TestHostileAgainstDevCluster(t *testing.T) {
	dir := t.TempDir()
	m, err := loader.Repo{Dir: dir}.Generate(loader.GenSpec{Name: "h", Shape: model.Shape{Type: model.LR}, Params: 10000, Partitions: 4, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	lim := router.Limits{MaxIDs: 1 << 16}
	c := devclustertest.Start(t, devcluster.Options{Repo: dir, Shards: 2, ScanInterval: time.Hour, Router: router.Options{Limits: lim}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := server.Start(server.Options{Predictor: c.Router, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Limits: lim, Registry: nopRegistry{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	target := bench.HostileTarget{HTTPAddr: s.HTTPAddr(), Conn: conn, Model: "h"}
	inputs := bench.HostileInputs("h", bench.HostileSizes{JSONBytes: 1_000_000, GRPCBytes: 1 << 20})
	want := map[string][]string{
		"deep-json": {"HTTP 400"},
		"big-json":  {"HTTP 400"},
		"big-grpc":  {"InvalidArgument", "ResourceExhausted"},
	}
	refused := func(name, code string) bool {
		for _, w := range want[name] {
			if code == w {
				return true
			}
		}
		return false
	}
	for _, h := range inputs {
		r := bench.MeasureHostile(ctx, bench.HostileOptions{Target: target, PID: os.Getpid(), Repeat: 2}, h)
		var out bytes.Buffer
		r.Print(&out)
		t.Log(out.String())
		if len(r.Answers) != 2 {
			t.Fatalf("%s: %d answers", h.Name, len(r.Answers))
		}
		for _, a := range r.Answers {
			if !refused(h.Name, a.Code) {
				t.Errorf("%s: answered %s (%s), want one of %v", h.Name, a.Code, a.Message, want[h.Name])
			}
		}
		if r.CPUErr != nil || r.RSS.Err != nil || r.RSS.Before <= 0 || r.RSS.Peak <= 0 {
			t.Errorf("%s: cpu %v, rss %+v", h.Name, r.CPUErr, r.RSS)
		}
	}

	client := kservepb.NewGRPCInferenceServiceClient(conn)
	g, err := bench.NewGenerator(bench.Workloads["rank200"], *m.Generator, m.Params, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.ModelInfer(ctx, g.Request("h")); err != nil {
		t.Fatalf("a good request after the hostile ones: %v", err)
	}
	res, tally := bench.Beside(ctx, bench.LoadOptions{Client: client, Model: "h", Generator: g,
		Concurrency: 2, Duration: time.Minute, MaxRequests: 20, Distinct: 4}, target, inputs)
	if res.Requests != 20 || res.Errors != 0 {
		t.Fatalf("beside: requests %d, errors %d (%v)", res.Requests, res.Errors, res.FirstError)
	}
	if tally.Sent() < 1 {
		t.Errorf("beside: nothing hostile sent")
	}
	for name, codes := range tally {
		for code := range codes {
			if code != "cut short" && !refused(name, code) {
				t.Errorf("beside: %s answered %s", name, code)
			}
		}
	}
}
