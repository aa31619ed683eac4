package main

import (
	"bufio"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/testenv"
)

// metricSum sums the samples of a Prometheus text exposition whose line
// starts with prefix (a name, perhaps with some of its labels).
func metricSum(t *testing.T, httpAddr, prefix string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// TestSlowAndKilledShards runs shards, a manager and a router as separate
// processes (replicas 2) under a steady load of predict calls, with no
// retries by the client: a shard answering a fifth of its lookups 30ms
// late through its fault drill (PUT /admin/v1/fault) is hedged around,
// and a shard killed with SIGKILL costs no failed call — its calls are
// asked of the other replica while its registration outlives it.
func TestSlowAndKilledShards(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "20000", "--partitions", "4", "--ids", "dense").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	cli := testenv.Etcd(t)
	common := []string{"--etcd", cli.Endpoints()[0], "--log-level", "warn"}
	ids := []string{"s0", "s1", "s2"}
	var shards []*process
	for _, id := range ids {
		shards = append(shards, startProcess(t, []string{"shard " + id + " serving on ", "http: http://"},
			append([]string{"shard", "--id", id, "--repo", repo, "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, id),
				"--http-addr", "127.0.0.1:0", "--admin-token", "drill"}, common...)...))
	}
	startProcess(t, []string{"admin: http://"}, append([]string{"manager", "--repo", repo, "--replicas", "2", "--admin-addr", "127.0.0.1:0", "--admin-token", "t"}, common...)...)
	router := startProcess(t, []string{"http: http://", "grpc: "}, append([]string{"router", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, common...)...)
	devclustertest.WaitReplicated(t, cli, 2)
	for _, s := range shards {
		testenv.Eventually(t, 30*time.Second, func() error {
			resp, err := http.Get("http://" + s.out["http: http://"] + "/readyz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/readyz: %s", resp.Status)
			}
			return nil
		})
	}
	routerHTTP := router.out["http: http://"]
	waitRouterReady(t, routerHTTP)

	calls := startCheckedLoad(t, router.out["grpc: "], 4)
	answered := func(n int64) { t.Helper(); calls.await(t, n) }
	answered(200)

	// A straggler: s1 answers a fifth of its lookups 30ms late.
	if err := putFault(shards[1].out["http: http://"], "drill", "delay=30ms,fraction=0.2"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		if won := metricSum(t, routerHTTP, `cumulus_router_hedges_total{outcome="won"}`); won == 0 {
			return fmt.Errorf("no hedge has won yet (%d requests answered)", calls.ok.Load())
		}
		return nil
	})
	if err := putFault(shards[1].out["http: http://"], "drill", ""); err != nil {
		t.Fatal(err)
	}
	if err := putFault(shards[1].out["http: http://"], "wrong", "stall"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a fault set with the wrong token: %v, want 401", err)
	}

	// s0 killed, once it is seen answering: its registration stays until
	// its lease runs out, and the calls routed to it meanwhile are asked
	// of the other replica. The load runs until the router has dropped it.
	s0calls := `cumulus_router_shard_call_seconds_count{outcome="ok",shard="s0"}`
	before := metricSum(t, routerHTTP, s0calls)
	testenv.Eventually(t, 60*time.Second, func() error {
		if metricSum(t, routerHTTP, s0calls) == before {
			return fmt.Errorf("no call answered by s0 yet")
		}
		return nil
	})
	if err := shards[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-shards[0].exited
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := metricSum(t, routerHTTP, `cumulus_router_shard_call_seconds_count{outcome="ok",shard="s0"}`); n > 0 {
			return fmt.Errorf("the router still routes to s0 (%d requests answered)", calls.ok.Load())
		}
		return nil
	})
	answered(500)
	calls.halt()
	t.Logf("%d requests answered, %d failed; router: hedges %v sent, %v won; %v calls asked again",
		calls.ok.Load(), calls.failed.Load(), metricSum(t, routerHTTP, `cumulus_router_hedges_total{outcome="sent"}`),
		metricSum(t, routerHTTP, `cumulus_router_hedges_total{outcome="won"}`), metricSum(t, routerHTTP, `cumulus_router_retries_total{kind="replica"}`))
	if n := calls.failed.Load(); n > 0 {
		t.Errorf("%d predict calls failed; the first: %v", n, calls.first.Load())
	}
}
