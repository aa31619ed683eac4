package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/manager"
)

// TestCordonScaleInEndToEnd: separate shard, manager and router
// processes, one replica per partition, load running: a third shard
// joins and takes its share; `cumulus admin cordon` empties another,
// which is then killed (SIGKILL). No request fails or is answered
// differently at any point.
func TestCordonScaleInEndToEnd(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "20000", "--partitions", "8", "--ids", "dense").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	cli := testenv.Etcd(t)
	common := []string{"--etcd", cli.Endpoints()[0], "--log-level", "warn"}
	startShard := func(id string) *process {
		// The moves are loaded at a bounded rate, and each shard reports
		// its budget.
		args := append([]string{"shard", "--id", id, "--repo", repo, "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, id),
			"--load-rate", "1MB", "--memory-budget", "64MiB"}, common...)
		return startProcess(t, []string{"shard " + id + " serving on "}, args...)
	}
	shards := map[string]*process{"s0": startShard("s0"), "s1": startShard("s1")}
	mgr := startProcess(t, []string{"admin: http://"}, append([]string{"manager", "--repo", repo, "--replicas", "1", "--admin-addr", "127.0.0.1:0", "--admin-token", "t"}, common...)...)
	rt := startProcess(t, []string{"http: http://", "grpc: "}, append([]string{"router", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, common...)...)
	waitRouterReady(t, rt.out["http: http://"])
	admin := func(args ...string) string {
		t.Helper()
		out, err := cumulus(append(append([]string{"admin"}, args...), "--addr", mgr.out["admin: http://"], "--admin-token", "t")...).CombinedOutput()
		if err != nil {
			t.Fatalf("cumulus admin %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	shardStates := func() map[string]manager.ShardSummary {
		var out struct {
			Shards []manager.ShardSummary `json:"shards"`
		}
		if err := json.Unmarshal([]byte(admin("shards", "--json")), &out); err != nil {
			t.Fatal(err)
		}
		m := map[string]manager.ShardSummary{}
		for _, s := range out.Shards {
			m[s.ID] = s
		}
		return m
	}

	calls := startCheckedLoad(t, rt.out["grpc: "], 3)
	awaitLoad := func(n int64) { t.Helper(); calls.await(t, n) }
	awaitLoad(20)

	// Scale out: s2 joins and takes about a third.
	t0 := time.Now()
	shards["s2"] = startShard("s2")
	testenv.Eventually(t, 60*time.Second, func() error {
		st := shardStates()
		if st["s2"].Assigned < 2 || st["s2"].Held < st["s2"].Assigned || len(strings.Split(strings.TrimSpace(admin("plan")), "\n")) != 1 {
			return fmt.Errorf("s2: %+v", st["s2"])
		}
		return nil
	})
	if b := shardStates()["s2"].Budget; b != 64<<20 {
		t.Errorf("s2 reports a budget of %d bytes, started with 64 MiB", b)
	}
	t.Logf("scale-out to 3 shards balanced in %v: %s", time.Since(t0).Round(time.Millisecond), strings.TrimSpace(admin("plan")))
	awaitLoad(20)

	// Scale in: cordon s0, wait for empty, kill it.
	t0 = time.Now()
	if out := admin("cordon", "s0"); !strings.Contains(out, "s0") {
		t.Fatalf("cordon: %s", out)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		if st := shardStates()["s0"]; st.State != "empty" {
			return fmt.Errorf("s0: %+v", st)
		}
		return nil
	})
	t.Logf("cordoned s0 empty in %v", time.Since(t0).Round(time.Millisecond))
	shards["s0"].cmd.Process.Signal(syscall.SIGKILL)
	awaitLoad(100)
	calls.halt()
	if n := calls.failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed; the first: %v", n, calls.ok.Load()+n, calls.first.Load())
	}
	t.Logf("%d requests answered, none failed or changed, through the scale-out, the cordon and the kill", calls.ok.Load())
	if out := admin("shards"); !strings.Contains(out, "empty") {
		t.Fatalf("shards after the kill:\n%s", out)
	}
}
