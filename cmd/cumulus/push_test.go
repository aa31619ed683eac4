package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
)

// pushBody is a batch in the HTTP push API's JSON layout.
func pushBody(producer string, seq uint64, ids []int64, values []float32, deletes []int64) []byte {
	var in []string
	if ids != nil {
		in = append(in, fmt.Sprintf(`{"name":"ids","datatype":"INT64","shape":[%d],"data":%s}`, len(ids), jsonOf(ids)))
		in = append(in, fmt.Sprintf(`{"name":"values","datatype":"FP32","shape":[%d,%d],"data":%s}`, len(ids), len(values)/max(len(ids), 1), jsonOf(values)))
	}
	if deletes != nil {
		in = append(in, fmt.Sprintf(`{"name":"deletes","datatype":"INT64","shape":[%d],"data":%s}`, len(deletes), jsonOf(deletes)))
	}
	return fmt.Appendf(nil, `{"parameters":{"producer":%q,"sequence":%d},"inputs":[%s]}`, producer, seq, strings.Join(in, ","))
}

// pushBinary is a batch with the binary tensor extension: ids and
// values as raw little-endian bytes after the JSON header.
func pushBinary(producer string, seq uint64, ids []uint64, values []float32) (body []byte, headerLen int) {
	head := fmt.Appendf(nil, `{"parameters":{"producer":%q,"sequence":%d},"inputs":[`+
		`{"name":"ids","datatype":"UINT64","shape":[%d],"parameters":{"binary_data_size":%d}},`+
		`{"name":"values","datatype":"FP32","shape":[%d],"parameters":{"binary_data_size":%d}}]}`,
		producer, seq, len(ids), 8*len(ids), len(values), 4*len(values))
	body = head
	for _, id := range ids {
		body = binary.LittleEndian.AppendUint64(body, id)
	}
	for _, v := range values {
		body = binary.LittleEndian.AppendUint32(body, math.Float32bits(v))
	}
	return body, len(head)
}

// oneFeatureScores are a front's scores of one-feature rows, one per id
// (an LR's or FM's score of a lone feature is sigmoid(bias + its
// weight)), and the version that answered.
func oneFeatureScores(t *testing.T, front, model string, ids []int64) (version string, s []float32) {
	t.Helper()
	splits := make([]int64, len(ids)+1)
	for i := range splits {
		splits[i] = int64(i)
	}
	body := fmt.Sprintf(`{"inputs":[{"name":"ids","datatype":"INT64","shape":[%d],"data":%s},{"name":"row_splits","datatype":"INT64","shape":[%d],"data":%s}]}`,
		len(ids), jsonOf(ids), len(splits), jsonOf(splits))
	resp, err := http.Post("http://"+front+"/v2/models/"+model+"/infer", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Version string `json:"model_version"`
		Outputs []struct {
			Data []float32 `json:"data"`
		} `json:"outputs"`
	}
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || len(out.Outputs) != 1 {
		t.Fatalf("predict: %s: %s", resp.Status, b)
	}
	return out.Version, out.Outputs[0].Data
}

// TestPushEndToEnd: `cumulus dev` with its push API. Batches over HTTP
// (JSON and the binary extension) and over gRPC (`cumulus push`) are
// answered with the delta holding them, and every router then serves the
// exact values pushed, deletions included; a duplicate is not applied
// again; bad input is refused with its reason and the model keeps
// serving.
func TestPushEndToEnd(t *testing.T) {
	repo := t.TempDir()
	gen, err := loader.Repo{Dir: repo}.Generate(loader.GenSpec{Name: "fm", Shape: model.Shape{Type: model.FM, Dim: 2}, Params: 10_000, Partitions: 16, Seed: 3, Dense: true})
	if err != nil {
		t.Fatal(err)
	}
	dev := startProcess(t, []string{"http: http://", "admin: http://", "push: http://", "ready"}, "dev", "--repo", repo, "--shards", "2",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--push-addr", "127.0.0.1:0",
		"--admin-token", "admin-t", "--push-token", "push-t", "--max-push-bytes", "64KiB", "--max-pending-push-bytes", "64KiB", "--log-level", "warn")
	front := dev.out["http: http://"]
	pushAddr, _, _ := strings.Cut(dev.out["push: http://"], " ")
	adminAddr, _, _ := strings.Cut(dev.out["admin: http://"], " ")
	waitRouterReady(t, front)

	post := func(token string, path string, body []byte, hdr int) (int, manager.PushAnswer, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+pushAddr+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if hdr > 0 {
			req.Header.Set("Inference-Header-Content-Length", fmt.Sprint(hdr))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var a manager.PushAnswer
		json.Unmarshal(b, &a)
		return resp.StatusCode, a, string(b)
	}
	scores := func(ids ...int64) (string, []float32) { return oneFeatureScores(t, front, "fm", ids) }
	sigmoid := func(w float64) float32 { return float32(1 / (1 + math.Exp(-(gen.Bias + w)))) }
	// served waits until the front serves version v or later with want
	// (id → weight; NaN: deleted, scored as absent).
	served := func(v uint64, want map[int64]float64) {
		t.Helper()
		var ids []int64
		for id := range want {
			ids = append(ids, id)
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			got, s := scores(ids...)
			var n uint64
			fmt.Sscan(got, &n)
			if n < v {
				return fmt.Errorf("serving version %s, want %d or later", got, v)
			}
			for i, id := range ids {
				w := want[id]
				if math.IsNaN(w) {
					w = 0
				}
				if math.Abs(float64(s[i]-sigmoid(w))) > 1e-6 {
					return fmt.Errorf("id %d scores %v, want %v (weight %v)", id, s[i], sigmoid(w), w)
				}
			}
			return nil
		})
	}

	// JSON: two rows; then a duplicate, not applied again.
	code, a, raw := post("push-t", "/push/v1/models/fm", pushBody("t0", 1, []int64{5, 6}, []float32{1.5, 0.1, 0.2, -2, 0, 0}, nil), 0)
	if code != 200 || a.Version == 0 || a.Duplicate {
		t.Fatalf("first batch: %d %s", code, raw)
	}
	served(a.Version, map[int64]float64{5: 1.5, 6: -2})
	// The sealed window is one file, its partitions sections of it.
	if m, err := (loader.Repo{Dir: repo}).Manifest("fm", a.Version); err != nil || m.Format != codec.PackedFormat || len(m.Files) != 2 || m.Files[0].Path != m.Files[1].Path {
		t.Fatalf("the sealed delta: %+v, %v; want format 3, two partitions in one file", m, err)
	}
	// ... which the manager did not read back: it sealed it.
	var d manager.ModelDetail
	if err := json.Unmarshal([]byte(mustRun(t, "admin", "show", "fm", "--json", "--addr", adminAddr, "--admin-token", "admin-t")), &d); err != nil {
		t.Fatal(err)
	}
	for _, v := range d.Versions {
		if v.Version == a.Version && (len(v.Gates) == 0 || !strings.Contains(v.Gates[0].Reason, "sealed by this manager")) {
			t.Fatalf("the sealed delta's gates: %+v; want the finite gate passed as sealed by this manager", v.Gates)
		}
	}
	code, dup, raw := post("push-t", "/push/v1/models/fm", pushBody("t0", 1, []int64{5}, []float32{9, 9, 9}, nil), 0)
	if code != 200 || !dup.Duplicate {
		t.Fatalf("a duplicate: %d %s", code, raw)
	}
	// Binary: the next batch, beside a deletion in JSON from another
	// producer, sealed together or not.
	body, hdr := pushBinary("t0", 2, []uint64{5, 7}, []float32{0.25, 1, 1, 3, 0, 0})
	code, a2, raw := post("push-t", "/push/v1/models/fm", body, hdr)
	if code != 200 {
		t.Fatalf("binary batch: %d %s", code, raw)
	}
	code, a3, raw := post("push-t", "/push/v1/models/fm", pushBody("t1", 1, nil, nil, []int64{6}), 0)
	if code != 200 {
		t.Fatalf("deletion: %d %s", code, raw)
	}
	served(max(a2.Version, a3.Version), map[int64]float64{5: 0.25, 6: math.NaN(), 7: 3})

	// gRPC, through `cumulus push`: a TSV of rows in batches of 2.
	tsv := filepath.Join(t.TempDir(), "up.tsv")
	os.WriteFile(tsv, []byte("type fm\ndim 2\n8\t0.5 0 0\n9\t-0.5 0 0\n10\t4 0 0\n"), 0o644)
	out, err := cumulus("push", "--addr", pushAddr, "--push-token", "push-t", "--model", "fm", "--producer", "cli", "--batch-rows", "2", tsv).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "pushed 3 rows and 0 deletions in 2 batches") {
		t.Fatalf("cumulus push: %v\n%s", err, out)
	}
	var cliVersion uint64
	fmt.Sscanf(string(out[strings.Index(string(out), "version "):]), "version %d", &cliVersion)
	served(cliVersion, map[int64]float64{8: 0.5, 9: -0.5, 10: 4, 5: 0.25})
	// Deletions only, from a file of ids; the same run again is all
	// duplicates.
	ids := filepath.Join(t.TempDir(), "gone.txt")
	os.WriteFile(ids, []byte("# gone\n9\n"), 0o644)
	del := func() string {
		out, err := cumulus("push", "--addr", pushAddr, "--push-token", "push-t", "--model", "fm", "--producer", "cli-del", "--deletes", ids).CombinedOutput()
		if err != nil {
			t.Fatalf("cumulus push --deletes: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := del(); strings.Contains(out, "duplicates") {
		t.Fatalf("a first push of deletions: %s", out)
	}
	if out := del(); !strings.Contains(out, "1 of them were sealed before (duplicates") {
		t.Fatalf("the same deletions again: %s", out)
	}
	served(cliVersion, map[int64]float64{8: 0.5, 9: math.NaN(), 10: 4})

	// Bad input: refused with its reason; nothing changes.
	nan, nanHdr := pushBinary("t0", 3, []uint64{5}, []float32{float32(math.NaN()), 0, 0})
	big := pushBody("t0", 3, make([]int64, 10000), make([]float32, 30000), nil)
	for _, c := range []struct {
		name, token, path string
		body              []byte
		hdr, code         int
		want              string
	}{
		{"wrong width", "push-t", "/push/v1/models/fm", pushBody("t0", 3, []int64{5}, []float32{1}, nil), 0, 400, "takes 3 values per id"},
		{"wrong type", "push-t", "/push/v1/models/fm", []byte(`{"parameters":{"producer":"t0","sequence":3},"inputs":[{"name":"values","datatype":"FP64","shape":[1],"data":[1]}]}`), 0, 400, "not FP32"},
		{"NaN", "push-t", "/push/v1/models/fm", nan, nanHdr, 400, "finite"},
		{"unknown model", "push-t", "/push/v1/models/nope", pushBody("t0", 3, []int64{5}, []float32{1, 0, 0}, nil), 0, 404, "nope"},
		{"over-size batch", "push-t", "/push/v1/models/fm", big, 0, 413, "--max-push-bytes"},
		{"out of order", "push-t", "/push/v1/models/fm", pushBody("t0", 5, []int64{5}, []float32{1, 0, 0}, nil), 0, 409, "expected 3"},
		{"admin token", "admin-t", "/push/v1/models/fm", pushBody("t0", 3, []int64{5}, []float32{1, 0, 0}, nil), 0, 401, "push token"},
		{"not JSON", "push-t", "/push/v1/models/fm", []byte(`{"inputs": [`), 0, 400, "KServe"},
	} {
		code, _, raw := post(c.token, c.path, c.body, c.hdr)
		if code != c.code || !strings.Contains(raw, c.want) {
			t.Errorf("%s: %d %s; want %d naming %q", c.name, code, raw, c.code, c.want)
		}
	}
	// The push token opens no admin call.
	req, _ := http.NewRequest("POST", "http://"+adminAddr+"/admin/v1/models/fm/rollback", nil)
	req.Header.Set("Authorization", "Bearer push-t")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a rollback with the push token: %v %v", resp.Status, err)
	}
	served(cliVersion, map[int64]float64{8: 0.5, 5: 0.25, 6: math.NaN()})
	// t0 resumes at 3.
	code, a4, raw := post("push-t", "/push/v1/models/fm", pushBody("t0", 3, []int64{5}, []float32{-1, 0, 0}, nil), 0)
	if code != 200 {
		t.Fatalf("t0's next batch after refusals: %d %s", code, raw)
	}
	served(a4.Version, map[int64]float64{5: -1})

	// Pinned: pushes are held in one pending delta, replaced at each
	// window, not served; past --max-pending-push-bytes they are
	// refused; unpinned, the pending delta is served.
	adminCall := func(method, path, body string) manager.ModelDetail {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+adminAddr+"/admin/v1/models/fm"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer admin-t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var d manager.ModelDetail
		if resp.StatusCode != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("%s %s: %s %s", method, path, resp.Status, b)
		}
		return d
	}
	live := adminCall("GET", "", "").Live
	adminCall("PUT", "/pin", fmt.Sprintf(`{"version": %d, "from": %d}`, live, live))
	rows := func(seq uint64, w float32) []byte {
		ids, vals := make([]int64, 600), make([]float32, 1800) // 600 rows weigh 48.6 KB: one fits --max-pending-push-bytes 64KiB, two do not
		for i := range ids {
			ids[i], vals[3*i] = int64(1000+i), w
		}
		return pushBody("t0", seq, ids, vals, nil)
	}
	code, h1, raw := post("push-t", "/push/v1/models/fm", rows(4, 0.5), 0)
	if code != 200 {
		t.Fatalf("a push while pinned: %d %s", code, raw)
	}
	code, h2, raw := post("push-t", "/push/v1/models/fm", pushBody("t0", 5, []int64{5}, []float32{2, 0, 0}, nil), 0)
	if code != 200 || h2.Version <= h1.Version {
		t.Fatalf("a second push while pinned: %d %s (the first: %d)", code, raw, h1.Version)
	}
	if _, err := os.Stat(filepath.Join(repo, "fm", fmt.Sprint(h1.Version))); !os.IsNotExist(err) {
		t.Fatalf("held delta %d, replaced by %d, is still in the repository: %v", h1.Version, h2.Version, err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if h := adminCall("GET", "", "").HeldPushes; h == nil || h.Version != h2.Version {
			return fmt.Errorf("show says held pushes %+v, want delta %d", h, h2.Version)
		}
		return nil
	})
	if v, s := scores(5, 1000); v != fmt.Sprint(live) || math.Abs(float64(s[0]-sigmoid(-1))) > 1e-6 {
		t.Fatalf("while pinned, version %s serves %v for id 5 (want version %d's)", v, s, live)
	}
	if code, _, raw := post("push-t", "/push/v1/models/fm", rows(6, 0.75), 0); code != http.StatusTooManyRequests || !strings.Contains(raw, "--max-pending-push-bytes") {
		t.Fatalf("past the pending bound: %d %s", code, raw)
	}
	adminCall("DELETE", fmt.Sprintf("/pin?from=%d", live), "")
	served(h2.Version, map[int64]float64{5: 2, 1000: 0.5, 1599: 0.5, 8: 0.5})
	// Pinned again at once, on the held delta now live: the next push is
	// held on it, and it stays (it is served).
	testenv.Eventually(t, 10*time.Second, func() error {
		if d := adminCall("GET", "", ""); d.Live != h2.Version {
			return fmt.Errorf("live %d, want %d", d.Live, h2.Version)
		}
		return nil
	})
	adminCall("PUT", "/pin", fmt.Sprintf(`{"version": %d, "from": %d}`, h2.Version, h2.Version))
	code, h3, raw := post("push-t", "/push/v1/models/fm", pushBody("t0", 6, []int64{5}, []float32{3, 0, 0}, nil), 0)
	if code != 200 {
		t.Fatalf("a push pinned again: %d %s", code, raw)
	}
	if _, err := os.Stat(filepath.Join(repo, "fm", fmt.Sprint(h2.Version))); err != nil {
		t.Fatalf("the live version %d, once a held delta, was removed: %v", h2.Version, err)
	}
	if v, s := scores(5); v != fmt.Sprint(h2.Version) || math.Abs(float64(s[0]-sigmoid(2))) > 1e-6 {
		t.Fatalf("pinned to %d, version %s serves %v for id 5", h2.Version, v, s)
	}
	adminCall("DELETE", fmt.Sprintf("/pin?from=%d", h2.Version), "")
	served(h3.Version, map[int64]float64{5: 3, 1000: 0.5})

	// The metrics: batches by outcome, rows, seal latency, sealed to live,
	// and the served pushes' age.
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`cumulus_push_batches_total{model="fm",outcome="applied"} 10`, `cumulus_push_batches_total{model="fm",outcome="duplicate"} 2`,
		`cumulus_push_batches_total{model="fm",outcome="sequence"} 1`, `cumulus_push_batches_total{model="fm",outcome="busy"} 1`,
		`cumulus_push_rows_total{model="fm"} 612`, "cumulus_push_seal_seconds_count", "cumulus_push_sealed_to_live_seconds_count", `cumulus_push_served_age_seconds{model="fm"}`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics has no %s:\n%s", want, regexp.MustCompile(`(?m)^cumulus_push_(batches|rows).*$`).FindAllString(string(metrics), -1))
		}
	}
}

// TestPushTrainer: examples/push_trainer.py, a PyTorch FM trainer,
// pushes the rows each optimizer step changed to `cumulus dev` over HTTP
// with Python's standard library; once its last push is served, the
// front scores what the trainer's own forward pass scores, within 1e-5.
func TestPushTrainer(t *testing.T) {
	python := requireTorch(t)
	repo, out := t.TempDir(), t.TempDir()
	gen, err := loader.Repo{Dir: repo}.Generate(loader.GenSpec{Name: "fm", Shape: model.Shape{Type: model.FM, Dim: 4}, Params: 2000, Partitions: 8, Seed: 5, Dense: true})
	if err != nil {
		t.Fatal(err)
	}
	dev := startProcess(t, []string{"http: http://", "push: http://", "ready"}, "dev", "--repo", repo, "--shards", "2",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--push-addr", "127.0.0.1:0",
		"--push-token", "push-t", "--log-level", "warn")
	front := dev.out["http: http://"]
	pushAddr, _, _ := strings.Cut(dev.out["push: http://"], " ")
	waitRouterReady(t, front)
	cmd := exec.Command(python, "../../examples/push_trainer.py", "--addr", pushAddr, "--model", "fm", "--token", "push-t",
		"--bias", fmt.Sprint(gen.Bias), "--dim", "4", "--steps", "10", "--out", out)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("push_trainer.py: %v\n%s", err, b)
	}
	var last uint64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if i := strings.Index(line, "version "); i >= 0 {
			fmt.Sscan(line[i+len("version "):], &last)
		}
	}
	if last == 0 {
		t.Fatalf("the trainer's output names no version:\n%s", b)
	}
	reqs, err := os.ReadFile(filepath.Join(out, "requests.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(reqs)), "\n")
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, line := range lines {
			var req struct {
				Inputs json.RawMessage `json:"inputs"`
				Want   []float64       `json:"want"`
			}
			json.Unmarshal([]byte(line), &req)
			resp, err := http.Post("http://"+front+"/v2/models/fm/infer", "application/json", strings.NewReader(`{"inputs":`+string(req.Inputs)+`}`))
			if err != nil {
				return err
			}
			var got struct {
				Version string `json:"model_version"`
				Outputs []struct {
					Data []float64 `json:"data"`
				} `json:"outputs"`
			}
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			var v uint64
			fmt.Sscan(got.Version, &v)
			if err != nil || len(got.Outputs) != 1 || v < last {
				return fmt.Errorf("version %s answered (%v); waiting for %d", got.Version, err, last)
			}
			for i, w := range req.Want {
				if math.Abs(got.Outputs[0].Data[i]-w) > 1e-5 {
					return fmt.Errorf("row %d scores %v, PyTorch %v", i, got.Outputs[0].Data[i], w)
				}
			}
		}
		return nil
	})
}
