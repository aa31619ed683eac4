package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// The test binary doubles as the cumulus binary: with CUMULUS_AS_MAIN=1
// it runs main instead of the tests, so end-to-end tests start real
// processes without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("CUMULUS_AS_MAIN") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	// The processes the tests start make their temporary directories
	// (a dev cluster's data, its certificates) in one of the run's own,
	// removed when the run ends: a process a test kills cannot remove
	// its own, and those left in the system's (128 MB each: etcd
	// preallocates its WAL) once filled the disk.
	dir, err := os.MkdirTemp("", "cumulus-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	childTmp = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// childTmp is TMPDIR for the processes the tests start.
var childTmp string

// cumulus runs the test binary as cumulus with args. A dev cluster gets
// a push API on a port of its own (its default, 8003, is one for all).
func cumulus(args ...string) *exec.Cmd {
	if len(args) > 0 && args[0] == "dev" && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--push-addr") }) {
		args = append(slices.Clip(args), "--push-addr", "127.0.0.1:0")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "CUMULUS_AS_MAIN=1", "TMPDIR="+childTmp)
	return cmd
}

// mustRun runs cumulus with args to its end and returns its output,
// failing the test if it fails.
func mustRun(t testing.TB, args ...string) string {
	t.Helper()
	out, err := cumulus(args...).CombinedOutput()
	if err != nil {
		t.Fatalf("cumulus %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// devProcess is a running `cumulus dev`.
type devProcess struct {
	http, grpc, etcd string
	pid              int
}

// startDev runs `cumulus dev` on kernel-chosen ports, reads its addresses
// from stdout and waits on the readiness endpoint.
func startDev(t *testing.T, repo string) devProcess {
	t.Helper()
	cmd := cumulus("dev", "--repo", repo, "--shards", "3", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--log-level", "warn")
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("cumulus dev exited badly after interrupt: %v\n%s", err, stderr.String())
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Errorf("cumulus dev did not stop within 20s of an interrupt")
		}
	})
	var p devProcess
	addrs := make(chan devProcess, 1)
	go func() {
		var got devProcess
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "http: http://"); ok {
				got.http = v
			}
			if v, ok := strings.CutPrefix(line, "grpc: "); ok {
				got.grpc = v
			}
			if v, ok := strings.CutPrefix(line, "etcd: "); ok {
				got.etcd = v
			}
			if got.http != "" && got.grpc != "" {
				addrs <- got
				break
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case p = <-addrs:
		p.pid = cmd.Process.Pid
	case <-time.After(60 * time.Second):
		t.Fatalf("cumulus dev printed no addresses in 60s\n%s", stderr.String())
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		resp, err := http.Get("http://" + p.http + "/v2/health/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("ready: %s", resp.Status)
		}
		return nil
	})
	return p
}

// svmSet writes n rows of a binary problem over features 1..200.
func svmSet(t *testing.T, path string, n int, seed uint64) {
	var b strings.Builder
	x := seed
	next := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
	for range n {
		label := "1"
		if next()%2 == 0 {
			label = "-1"
		}
		b.WriteString(label)
		idx := uint64(0)
		for range 12 {
			idx += 1 + next()%16
			v := float64(next()%2000)/1000 - 1
			if label == "1" && idx%5 == 0 {
				v += 1
			}
			fmt.Fprintf(&b, " %d:%.3f", idx, v)
		}
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

type svmRow struct {
	ids  []int64
	vals []float32
}

func readSVM(t *testing.T, path string) []svmRow {
	b, _ := os.ReadFile(path)
	var rows []svmRow
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r svmRow
		for _, kv := range strings.Fields(line)[1:] {
			k, v, _ := strings.Cut(kv, ":")
			id, _ := strconv.ParseInt(k, 10, 64)
			x, _ := strconv.ParseFloat(v, 32)
			r.ids, r.vals = append(r.ids, id), append(r.vals, float32(x))
		}
		rows = append(rows, r)
	}
	return rows
}

// TestLIBLINEAREndToEnd: a model trained by liblinear-train, imported by
// `cumulus model import` and served by `cumulus dev`, gives liblinear-
// predict's probabilities through gRPC, HTTP, `cumulus predict` and grpcurl.
func TestLIBLINEAREndToEnd(t *testing.T) {
	train := testenv.Tool(t, "liblinear-train")
	predict := testenv.Tool(t, "liblinear-predict")
	grpcurl := testenv.Tool(t, "grpcurl")
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	trainSet, testSet := filepath.Join(dir, "train.svm"), filepath.Join(dir, "test.svm")
	model, out := filepath.Join(dir, "lr.model"), filepath.Join(dir, "out.txt")
	svmSet(t, trainSet, 2000, 1)
	svmSet(t, testSet, 1000, 2)
	for _, c := range [][]string{
		{train, "-q", "-s", "0", "-B", "1", trainSet, model},
		{predict, "-b", "1", testSet, model, out},
	} {
		if b, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c[0], err, b)
		}
	}
	if b, err := cumulus("model", "import", "--format", "liblinear", "--name", "ctr", "--repo", repo, "--partitions", "5", model).CombinedOutput(); err != nil {
		t.Fatalf("model import: %v\n%s", err, b)
	}
	// liblinear's probability of label 1, row by row.
	outText, _ := os.ReadFile(out)
	lines := strings.Split(strings.TrimSpace(string(outText)), "\n")
	col := slicesIndex(strings.Fields(lines[0]), "1")
	var want []float64
	for _, l := range lines[1:] {
		p, _ := strconv.ParseFloat(strings.Fields(l)[col], 64)
		want = append(want, p)
	}
	rows := readSVM(t, testSet)
	if len(rows) != 1000 || len(want) != 1000 {
		t.Fatalf("%d rows, %d predictions", len(rows), len(want))
	}
	var ids []int64
	var vals []float32
	splits := []int64{0}
	for _, r := range rows {
		ids, vals = append(ids, r.ids...), append(vals, r.vals...)
		splits = append(splits, int64(len(ids)))
	}
	compare := func(api string, got []float32) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d scores, want %d", api, len(got), len(want))
		}
		worst := 0.0
		for i := range got {
			d := math.Abs(float64(got[i]) - want[i])
			if math.IsNaN(d) {
				t.Fatalf("%s: row %d scored NaN", api, i)
			}
			worst = math.Max(worst, d)
		}
		if worst > 1e-5 {
			t.Fatalf("%s: largest difference from liblinear-predict is %g, want ≤ 1e-5", api, worst)
		}
		t.Logf("%s: 1000 rows, largest difference from liblinear-predict %.2g", api, worst)
	}

	p := startDev(t, repo)

	// gRPC, typed contents.
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := kservepb.NewGRPCInferenceServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	greq := &kservepb.ModelInferRequest{ModelName: "ctr", Id: "e2e", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
		{Name: "ids", Datatype: "INT64", Shape: []int64{int64(len(ids))}, Contents: &kservepb.InferTensorContents{Int64Contents: ids}},
		{Name: "values", Datatype: "FP32", Shape: []int64{int64(len(vals))}, Contents: &kservepb.InferTensorContents{Fp32Contents: vals}},
		{Name: "row_splits", Datatype: "INT64", Shape: []int64{int64(len(splits))}, Contents: &kservepb.InferTensorContents{Int64Contents: splits}},
	}}
	gresp, err := client.ModelInfer(ctx, greq)
	if err != nil {
		t.Fatal(err)
	}
	if gresp.ModelVersion != "1" || gresp.Id != "e2e" {
		t.Errorf("gRPC response version %q id %q", gresp.ModelVersion, gresp.Id)
	}
	compare("gRPC", gresp.Outputs[0].Contents.Fp32Contents)

	// HTTP/JSON.
	body, _ := json.Marshal(map[string]any{"inputs": []map[string]any{
		{"name": "ids", "datatype": "INT64", "shape": []int{len(ids)}, "data": ids},
		{"name": "values", "datatype": "FP32", "shape": []int{len(vals)}, "data": vals},
		{"name": "row_splits", "datatype": "INT64", "shape": []int{len(splits)}, "data": splits},
	}})
	hresp, err := http.Post("http://"+p.http+"/v2/models/ctr/infer", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var hout struct {
		ModelVersion string `json:"model_version"`
		Outputs      []struct {
			Data []float32 `json:"data"`
		} `json:"outputs"`
	}
	json.NewDecoder(hresp.Body).Decode(&hout)
	hresp.Body.Close()
	if hresp.StatusCode != 200 || hout.ModelVersion != "1" || len(hout.Outputs) != 1 {
		t.Fatalf("HTTP: %s, %+v", hresp.Status, hout)
	}
	compare("HTTP", hout.Outputs[0].Data)

	// `cumulus predict` on the libsvm file itself.
	pout, err := cumulus("predict", "--addr", p.grpc, "--model", "ctr", "--batch", "300", testSet).Output()
	if err != nil {
		t.Fatalf("cumulus predict: %v", err)
	}
	var pscores []float32
	for _, l := range strings.Fields(string(pout)) {
		f, _ := strconv.ParseFloat(l, 32)
		pscores = append(pscores, float32(f))
	}
	compare("cumulus predict", pscores)
	// Scores that cannot be written are a failure, not exit status 0.
	if full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0); err == nil {
		cmd := cumulus("predict", "--addr", p.grpc, "--model", "ctr", testSet)
		cmd.Stdout = full
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "writing scores") {
			t.Errorf("cumulus predict to a full disk: %v, %q; want a failure saying so", err, stderr.String())
		}
		full.Close()
	}

	// grpcurl, through server reflection, on the first three rows.
	req3 := fmt.Sprintf(`{"model_name":"ctr","inputs":[`+
		`{"name":"ids","datatype":"INT64","shape":[%d],"contents":{"int64_contents":%s}},`+
		`{"name":"values","datatype":"FP32","shape":[%d],"contents":{"fp32_contents":%s}},`+
		`{"name":"row_splits","datatype":"INT64","shape":[4],"contents":{"int64_contents":%s}}]}`,
		splits[3], jsonOf(ids[:splits[3]]), splits[3], jsonOf(vals[:splits[3]]), jsonOf(splits[:4]))
	gout, err := exec.Command(grpcurl, "-plaintext", "-d", req3, p.grpc, "inference.GRPCInferenceService/ModelInfer").CombinedOutput()
	if err != nil {
		t.Fatalf("grpcurl: %v\n%s", err, gout)
	}
	var gc struct {
		Outputs []struct {
			Contents struct {
				Fp32Contents []float32 `json:"fp32Contents"`
			} `json:"contents"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(gout, &gc); err != nil || len(gc.Outputs) != 1 || len(gc.Outputs[0].Contents.Fp32Contents) != 3 {
		t.Fatalf("grpcurl output: %v\n%s", err, gout)
	}
	for i, s := range gc.Outputs[0].Contents.Fp32Contents {
		if !(math.Abs(float64(s)-want[i]) <= 1e-5) {
			t.Errorf("grpcurl row %d: %v, liblinear-predict %v", i, s, want[i])
		}
	}

	// Bad input: clear errors, and the server keeps serving.
	badHTTP := map[string]struct {
		path, body string
		code       int
		mention    string
	}{
		"unknown model": {"/v2/models/nope/infer", `{"inputs":[]}`, 404, "nope"},
		"not json":      {"/v2/models/ctr/infer", `{"inputs":[`, 400, "JSON"},
		"bad splits":    {"/v2/models/ctr/infer", `{"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"data":[1,2]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,3]}]}`, 400, "row_splits"},
		"empty batch":   {"/v2/models/ctr/infer", `{"inputs":[{"name":"ids","datatype":"INT64","shape":[0],"data":[]},{"name":"row_splits","datatype":"INT64","shape":[1],"data":[0]}]}`, 400, "empty batch"},
		"shape":         {"/v2/models/ctr/infer", `{"inputs":[{"name":"ids","datatype":"INT64","shape":[3],"data":[1,2]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,2]}]}`, 400, "shape"},
		"unknown input": {"/v2/models/ctr/infer", `{"inputs":[{"name":"weights","datatype":"FP32","shape":[1],"data":[1]}]}`, 400, "weights"},
		"datatype":      {"/v2/models/ctr/infer", `{"inputs":[{"name":"ids","datatype":"BYTES","shape":[1],"data":["a"]}]}`, 400, "BYTES"},
		"float32 range": {"/v2/models/ctr/infer", `{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[1]},{"name":"values","datatype":"FP32","shape":[1],"data":[1e39]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]}`, 400, "values"},
		"bad version":   {"/v2/models/ctr/versions/x/infer", `{"inputs":[]}`, 400, "version"},
		"no version":    {"/v2/models/ctr/versions/7/infer", `{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[1]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]}`, 404, "version 7"},
	}
	for name, c := range badHTTP {
		resp, err := http.Post("http://"+p.http+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(b), c.mention) {
			t.Errorf("HTTP %s: %d %s, want %d mentioning %q", name, resp.StatusCode, b, c.code, c.mention)
		}
	}
	nan := float32(math.NaN())
	badGRPC := map[string]struct {
		req  *kservepb.ModelInferRequest
		code codes.Code
	}{
		"nan": {&kservepb.ModelInferRequest{ModelName: "ctr", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
			{Name: "ids", Datatype: "INT64", Shape: []int64{1}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{1}}},
			{Name: "values", Datatype: "FP32", Shape: []int64{1}, Contents: &kservepb.InferTensorContents{Fp32Contents: []float32{nan}}},
			{Name: "row_splits", Datatype: "INT64", Shape: []int64{2}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{0, 1}}},
		}}, codes.InvalidArgument},
		"raw length": {&kservepb.ModelInferRequest{ModelName: "ctr", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
			{Name: "ids", Datatype: "INT64", Shape: []int64{2}}, {Name: "row_splits", Datatype: "INT64", Shape: []int64{2}},
		}, RawInputContents: [][]byte{make([]byte, 15), make([]byte, 16)}}, codes.InvalidArgument},
		"unknown model": {&kservepb.ModelInferRequest{ModelName: "nope", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
			{Name: "ids", Datatype: "INT64", Shape: []int64{0}}, {Name: "row_splits", Datatype: "INT64", Shape: []int64{2}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{0, 0}}},
		}}, codes.NotFound},
		"missing ids": {&kservepb.ModelInferRequest{ModelName: "ctr", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
			{Name: "row_splits", Datatype: "INT64", Shape: []int64{2}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{0, 0}}},
		}}, codes.InvalidArgument},
	}
	for name, c := range badGRPC {
		_, err := client.ModelInfer(ctx, c.req)
		if status.Code(err) != c.code {
			t.Errorf("gRPC %s: %v, want %s", name, err, c.code)
		}
	}
	gresp, err = client.ModelInfer(ctx, greq)
	if err != nil {
		t.Fatalf("after bad requests: %v", err)
	}
	compare("gRPC after bad input", gresp.Outputs[0].Contents.Fp32Contents)
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
