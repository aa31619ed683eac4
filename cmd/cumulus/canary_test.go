package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/manager"
)

// canaryBody is an infer request for features 1..3 with the key given,
// if any.
func canaryBody(key string) []byte {
	params := ""
	if key != "" {
		params = fmt.Sprintf(`"parameters":{"canary_key":%q},`, key)
	}
	return []byte(`{` + params + `"inputs":[{"name":"ids","datatype":"INT64","shape":[3],"data":[1,2,3]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,3]}]}`)
}

// inferVersion posts body to a front and returns the version that
// answered.
func inferVersion(addr, version string, body []byte) (string, error) {
	path := "/v2/models/ctr/infer"
	if version != "" {
		path = "/v2/models/ctr/versions/" + version + "/infer"
	}
	resp, err := http.Post("http://"+addr+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	var out struct {
		Version string `json:"model_version"`
	}
	return out.Version, json.Unmarshal(b, &out)
}

// TestCanaryEndToEnd: with `cumulus dev` and a second router process, a
// load generator running: a 10% canary serves a share of the keyed
// requests within binomial tolerance, each key on the same arm on both
// routers; "canary" and "stable" name the arms; the routers export the
// version per track; promote makes the canary live (the pin follows);
// a rollback drops the next canary. No request fails.
func TestCanaryEndToEnd(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	gen := func() {
		t.Helper()
		if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "20000", "--partitions", "4", "--ids", "dense").CombinedOutput(); err != nil {
			t.Fatalf("model gen: %v\n%s", err, b)
		}
	}
	gen()
	dev := startProcess(t, []string{"http: http://", "admin: http://", "etcd: "}, "dev", "--repo", repo, "--shards", "2", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--admin-token", "t", "--log-level", "warn")
	adminAddr, _, _ := strings.Cut(dev.out["admin: http://"], " ")
	admin := func(args ...string) string {
		t.Helper()
		out, err := cumulus(append(append([]string{"admin"}, args...), "--addr", adminAddr, "--admin-token", "t")...).CombinedOutput()
		if err != nil {
			t.Fatalf("cumulus admin %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	detail := func() manager.ModelDetail {
		var d manager.ModelDetail
		if err := json.Unmarshal([]byte(admin("show", "ctr", "--json")), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	waitFor := func(what string, ok func(d manager.ModelDetail) bool) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, func() error {
			if d := detail(); !ok(d) {
				return fmt.Errorf("waiting for %s: live %d, pin %d, canary %+v, staged %d", what, d.Live, d.Pin, d.Canary, d.Staged)
			}
			return nil
		})
	}
	waitFor("v1 live", func(d manager.ModelDetail) bool { return d.Live == 1 })
	router2 := startProcess(t, []string{"http: http://"}, "router", "--etcd", dev.out["etcd: "], "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-level", "warn")
	fronts := []string{dev.out["http: http://"], router2.out["http: http://"]}
	for _, f := range fronts {
		waitRouterReady(t, f)
	}

	// The load: unkeyed requests to both routers all along.
	var sent, failed atomic.Int64
	var errMu sync.Mutex
	var errs []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				if _, err := inferVersion(fronts[i], "", canaryBody("")); err != nil {
					failed.Add(1)
					errMu.Lock()
					if len(errs) < 5 {
						errs = append(errs, fmt.Sprintf("router %d at %s: %v", i, time.Now().Format("15:04:05.000"), err))
					}
					errMu.Unlock()
				}
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

	// v2 waits behind a pin to v1, then serves as a 10% canary.
	admin("pin", "ctr", "1")
	gen()
	waitFor("v2 ready", func(d manager.ModelDetail) bool {
		for _, v := range d.Versions {
			if v.Version == 2 && v.Phase == manager.PhaseReady {
				return true
			}
		}
		return false
	})
	if out := admin("canary", "ctr", "2", "--fraction", "0.1"); !strings.Contains(out, "canary 2 at 0.1") {
		t.Fatalf("canary: %s", out)
	}
	waitFor("canary 2 serving", func(d manager.ModelDetail) bool { return d.Canary != nil && d.Canary.Serving && d.Live == 1 })
	for _, f := range fronts {
		testenv.Eventually(t, 30*time.Second, func() error {
			if v, err := inferVersion(f, "canary", canaryBody("")); err != nil || v != "2" {
				return fmt.Errorf("canary arm at %s: %q %v", f, v, err)
			}
			return nil
		})
	}

	// 2,000 keys, each asked of both routers.
	const n = 2000
	canaryKeys := 0
	for i := range n {
		key := fmt.Sprintf("user-%d", i)
		var got [2]string
		for r, f := range fronts {
			v, err := inferVersion(f, "", canaryBody(key))
			if err != nil {
				t.Fatal(err)
			}
			got[r] = v
		}
		if got[0] != got[1] || got[0] != "1" && got[0] != "2" {
			t.Fatalf("key %s: versions %v on the two routers", key, got)
		}
		if got[0] == "2" {
			canaryKeys++
		}
	}
	// Binomial: mean 200, standard deviation √(2000·0.1·0.9) ≈ 13.4; four
	// deviations either side.
	sd := math.Sqrt(n * 0.1 * 0.9)
	t.Logf("canary share: %d of %d keys (%.2f%%), on the same arm on both routers", canaryKeys, n, 100*float64(canaryKeys)/n)
	if math.Abs(float64(canaryKeys)-0.1*n) > 4*sd {
		t.Fatalf("%d of %d keys on the 10%% canary", canaryKeys, n)
	}
	if v, err := inferVersion(fronts[1], "stable", canaryBody("user-0")); err != nil || v != "1" {
		t.Fatalf("stable arm: %q %v", v, err)
	}
	for _, f := range fronts {
		resp, err := http.Get("http://" + f + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`cumulus_model_version{model="ctr",track="canary"} 2`, `cumulus_model_version{model="ctr",track="stable"} 1`,
			`cumulus_router_requests_total{model="ctr",outcome="ok",track="canary"}`, `cumulus_router_score_sum{model="ctr",track="canary"}`,
			"\ngo_goroutines ", "\nprocess_open_fds "} {
			if !bytes.Contains(b, []byte(want)) {
				t.Fatalf("%s/metrics lacks %s", f, want)
			}
		}
	}

	// Promote: v2 live, pinned (the pin follows), no canary.
	admin("promote", "ctr")
	waitFor("v2 promoted", func(d manager.ModelDetail) bool { return d.Live == 2 && d.Pin == 2 && d.Canary == nil })
	for _, f := range fronts {
		testenv.Eventually(t, 30*time.Second, func() error {
			if v, err := inferVersion(f, "", canaryBody("user-0")); err != nil || v != "2" {
				return fmt.Errorf("after promote, %s answers %q %v", f, v, err)
			}
			if _, err := inferVersion(f, "canary", canaryBody("")); err == nil || !strings.Contains(err.Error(), "404") {
				return fmt.Errorf("after promote, the canary arm at %s: %v", f, err)
			}
			return nil
		})
	}

	// v3 as a canary at 0.5; a rollback (to v1) drops it.
	gen()
	waitFor("v3 ready", func(d manager.ModelDetail) bool {
		for _, v := range d.Versions {
			if v.Version == 3 && v.Phase == manager.PhaseReady {
				return true
			}
		}
		return false
	})
	admin("canary", "ctr", "3", "--fraction", "0.5")
	waitFor("canary 3 serving", func(d manager.ModelDetail) bool { return d.Canary != nil && d.Canary.Serving })
	admin("rollback", "ctr")
	waitFor("rolled back to v1, canary dropped", func(d manager.ModelDetail) bool { return d.Live == 1 && d.Canary == nil })
	for _, f := range fronts {
		testenv.Eventually(t, 30*time.Second, func() error {
			for i := range 20 {
				if v, err := inferVersion(f, "", canaryBody(fmt.Sprint("k", i))); err != nil || v != "1" {
					return fmt.Errorf("after the rollback, %s answers %q %v", f, v, err)
				}
			}
			return nil
		})
	}
	stopLoad()
	t.Logf("load: %d requests, %d failed", sent.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed; the first: %s", failed.Load(), sent.Load(), strings.Join(errs, "; "))
	}
}
