package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/golden"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
)

// fmTSV is an FM model of dim 4 as a TSV file.
func fmTSV(m *loader.Sparse) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "type fm\ndim %d\nbias %s\n", m.Dim, strconv.FormatFloat(m.Bias, 'g', -1, 64))
	w := m.Width()
	for i, k := range m.Keys {
		b.WriteString(strconv.FormatUint(k, 10))
		for _, v := range m.Values[i*w : (i+1)*w] {
			b.WriteString("\t" + strconv.FormatFloat(float64(v), 'g', -1, 32))
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// TestGatesEndToEnd runs every gate as an operator would, through the
// CLI and a `cumulus dev` process, a load generator sending requests all
// along: versions failing the finite, golden, hold-out and validator
// gates are rejected with their reasons and never answer a request; a
// delta, its golden requests scored again by `cumulus model delta`,
// passes them; `cumulus admin accept` lets a rejected version through,
// audited. No request fails.
func TestGatesEndToEnd(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	rng := rand.New(rand.NewPCG(5, 5))
	v1 := &loader.Sparse{Shape: model.Shape{Type: model.FM, Dim: 4}, Bias: -0.2}
	for i := range 2000 {
		v1.Keys = append(v1.Keys, uint64(i))
		for range 5 {
			v1.Values = append(v1.Values, float32(rng.NormFloat64()*0.3))
		}
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	request := func() *router.Request {
		req := &router.Request{RowSplits: []int64{0}, SharedIDs: []uint64{rng.Uint64N(2000)}}
		for range 20 {
			for range 1 + rng.IntN(8) {
				req.IDs = append(req.IDs, rng.Uint64N(2100))
			}
			req.RowSplits = append(req.RowSplits, int64(len(req.IDs)))
		}
		return req
	}
	lines := func(reqs []*router.Request, want, labels func(int) []float64) []byte {
		b, err := golden.Lines(reqs, want, labels)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	noneOf := golden.None
	var reqs, hold []*router.Request
	for range 5 {
		reqs = append(reqs, request())
	}
	for range 25 {
		hold = append(hold, request())
	}
	ref1 := reference.New(v1)
	// The hold-out labels are v1's predictions: v1 scores them well.
	holdout := write("holdout.jsonl", lines(hold, noneOf, func(i int) []float64 {
		var l []float64
		for _, row := range hold[i].ReferenceRows() {
			l = append(l, math.Round(ref1.ScoreRow(row)))
		}
		return l
	}))
	v1File, goldenFile := write("v1.tsv", fmTSV(v1)), write("golden.jsonl", lines(reqs, noneOf, noneOf))
	cli := func(args ...string) string { t.Helper(); return mustRun(t, args...) }
	cli("model", "import", "--format", "tsv", "--name", "fm", "--repo", repo, "--partitions", "4", "--golden", goldenFile, v1File)
	validator := write("validate", []byte("#!/bin/sh\nif grep -q refuse-me \"$1/manifest.json\"; then echo \"AUC 0.50 on last week\" >&2; exit 1; fi\n"))
	os.Chmod(validator, 0o755)
	dev := startProcess(t, []string{"http: http://", "admin: http://"}, "dev", "--repo", repo, "--shards", "2", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--admin-token", "t", "--log-level", "warn", "--holdout", "fm="+holdout, "--validator", validator)
	adminAddr, _, _ := strings.Cut(dev.out["admin: http://"], " ")
	admin := func(args ...string) string {
		return cli(append(append([]string{"admin"}, args...), "--addr", adminAddr, "--admin-token", "t")...)
	}
	detail := func() manager.ModelDetail {
		var d manager.ModelDetail
		if err := json.Unmarshal([]byte(admin("show", "fm", "--json")), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	gatesOf := func(d manager.ModelDetail, v uint64) (phase, gates, reason string) {
		for _, x := range d.Versions {
			if x.Version == v {
				var g []string
				for _, r := range x.Gates {
					g = append(g, r.Gate+" "+r.Outcome)
				}
				return string(x.Phase), strings.Join(g, ", "), x.Reason
			}
		}
		return "", "", ""
	}
	waitVersion := func(v uint64, phase, gates, reason string) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, func() error {
			d := detail()
			p, g, r := gatesOf(d, v)
			if p != phase || g != gates || !strings.Contains(r, reason) || phase == "live" && d.Live != v {
				return fmt.Errorf("version %d: %s, gates %q, reason %q; want %s, %q, %q (live %d)", v, p, g, r, phase, gates, reason, d.Live)
			}
			return nil
		})
	}
	waitVersion(1, "live", "finite passed, golden passed, holdout skipped, validator passed", "")
	waitRouterReady(t, dev.out["http: http://"])

	// The load: every golden request in turn, over HTTP; each answer's
	// version is recorded.
	var failed, sent atomic.Int64
	var mu sync.Mutex
	served := map[string]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	bodies := bytes.Split(bytes.TrimSpace(lines(reqs, noneOf, noneOf)), []byte("\n"))
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				resp, err := http.Post("http://"+dev.out["http: http://"]+"/v2/models/fm/infer", "application/json", bytes.NewReader(bodies[i%len(bodies)]))
				if err != nil {
					failed.Add(1)
					continue
				}
				var out struct {
					Version string `json:"model_version"`
				}
				err = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					failed.Add(1)
					continue
				}
				mu.Lock()
				served[out.Version]++
				mu.Unlock()
			}
		}()
	}
	stopLoad := func() {
		select {
		case <-stop:
		default:
			close(stop)
			wg.Wait()
		}
	}
	defer stopLoad()

	// v2: a delta nudging 200 weights; model delta scores v1's golden
	// requests again on it.
	up := &loader.Sparse{Shape: v1.Shape, Bias: v1.Bias}
	for k := 0; k < 2000; k += 10 {
		up.Keys, up.Values = append(up.Keys, uint64(k)), append(up.Values, v1.Values[k*5:(k+1)*5]...)
		up.Values[len(up.Values)-5] += 0.02
	}
	cli("model", "delta", "--name", "fm", "--repo", repo, "--upserts", write("up.tsv", fmTSV(up)))
	waitVersion(2, "live", "finite passed, golden passed, holdout passed, validator passed", "")

	// v3: an infinite parameter, written around the importers.
	w, err := loader.Repo{Dir: repo}.NewVersion(loader.Spec{Name: "fm", Shape: v1.Shape, Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(4) {
		var keys []uint64
		var vals []float32
		for i, k := range v1.Keys {
			if partition.Of(k, 4) == p {
				keys, vals = append(keys, k), append(vals, v1.Values[i*5:(i+1)*5]...)
			}
		}
		if p == 2 {
			vals[3] = float32(math.Inf(-1))
		}
		if err := w.WritePartition(p, keys, vals); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	waitVersion(3, "rejected", "finite failed", "not finite")

	// v4: v1 with golden wants 0.01 off.
	off := write("off.jsonl", lines(reqs, func(i int) []float64 {
		var want []float64
		for _, row := range reqs[i].ReferenceRows() {
			want = append(want, ref1.ScoreRow(row)+0.01)
		}
		return want
	}, noneOf))
	cli("model", "import", "--format", "tsv", "--name", "fm", "--repo", repo, "--partitions", "4", "--golden", off, v1File)
	waitVersion(4, "rejected", "finite passed, golden failed, holdout passed, validator passed", "gate golden failed: 100 of 100 scores off by more than 0.0001")

	// v5: v1 with its linear part negated: worse on the hold-out set.
	v5 := &loader.Sparse{Shape: v1.Shape, Bias: -v1.Bias, Keys: v1.Keys}
	for i, x := range v1.Values {
		if i%5 == 0 {
			x = -x
		}
		v5.Values = append(v5.Values, x)
	}
	cli("model", "import", "--format", "tsv", "--name", "fm", "--repo", repo, "--partitions", "4", write("v5.tsv", fmTSV(v5)))
	waitVersion(5, "rejected", "finite passed, holdout failed, validator passed", "gate holdout failed: mean log-loss")

	// v6: the validator refuses it (its source names refuse-me).
	cli("model", "import", "--format", "tsv", "--name", "fm", "--repo", repo, "--partitions", "4", write("refuse-me.tsv", fmTSV(v1)))
	waitVersion(6, "rejected", "finite passed, holdout passed, validator failed", "gate validator failed: AUC 0.50 on last week")
	if d := detail(); d.Live != 2 {
		t.Fatalf("live %d after the rejections", d.Live)
	}

	// Accepted, v4 goes live, its golden failure recorded as accepted.
	admin("accept", "fm", "4", "--reason", "wants from a buggy exporter; scores checked by hand")
	waitVersion(4, "live", "finite passed, golden accepted, holdout passed, validator passed", "")
	if out := admin("audit"); !strings.Contains(out, `accept`) || !strings.Contains(out, `(reason: "wants from a buggy exporter; scores checked by hand")`) {
		t.Fatalf("audit:\n%s", out)
	}
	if out := admin("show", "fm"); !strings.Contains(out, "golden accepted") || !strings.Contains(out, "(accepted: wants from a buggy exporter") {
		t.Fatalf("show:\n%s", out)
	}
	// The finite gate's rejection cannot be accepted.
	out, err := cumulus("admin", "accept", "fm", "3", "--reason", "try", "--addr", adminAddr, "--admin-token", "t").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cannot be accepted") {
		t.Fatalf("accepting the finite gate's rejection: %v\n%s", err, out)
	}
	// Requests to the live version go on after the load stops meanwhile.
	testenv.Eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if served["4"] == 0 {
			return fmt.Errorf("no answer from version 4 yet: %v", served)
		}
		return nil
	})
	stopLoad()
	t.Logf("load: %d requests, %d failed, answered by version: %v", sent.Load(), failed.Load(), served)
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed", failed.Load(), sent.Load())
	}
	for v := range served {
		if v != "1" && v != "2" && v != "4" {
			t.Fatalf("version %s answered requests: %v", v, served)
		}
	}
}
