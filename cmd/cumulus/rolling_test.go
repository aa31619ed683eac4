package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// TestRollingRestart restarts, one at a time and under load, every shard
// of a cluster with two replicas per partition and then every router, as
// a Kubernetes rolling update does: SIGTERM, wait for the exit, start
// again, wait until ready. A client balancing over both routers, that
// asks again a call answered Unavailable, sees no request fail, and
// requests keep being answered during each restart.
func TestRollingRestart(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "20000", "--partitions", "4", "--ids", "dense").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	cli := testenv.Etcd(t)

	common := []string{"--etcd", cli.Endpoints()[0], "--log-level", "info"}
	startShard := func(id string) *process {
		args := append([]string{"shard", "--id", id, "--repo", repo, "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, id)}, common...)
		return startProcess(t, []string{"shard " + id + " serving on "}, args...)
	}
	startRouter := func(httpAddr, grpcAddr string) *process {
		args := append([]string{"router", "--http-addr", httpAddr, "--grpc-addr", grpcAddr}, common...)
		return startProcess(t, []string{"http: http://", "grpc: "}, args...)
	}
	shardIDs := []string{"s0", "s1"}
	var shards []*process
	for _, id := range shardIDs {
		shards = append(shards, startShard(id))
	}
	mgr := startProcess(t, []string{"admin: http://"}, append([]string{"manager", "--repo", repo, "--replicas", "2", "--admin-addr", "127.0.0.1:0", "--admin-token", "t"}, common...)...)
	var routers []*process
	for range 2 {
		routers = append(routers, startRouter("127.0.0.1:0", "127.0.0.1:0"))
	}
	// Both routers are registered, each scoring the live version.
	testenv.Eventually(t, 30*time.Second, func() error {
		out, err := cumulus("admin", "routers", "--addr", mgr.out["admin: http://"], "--admin-token", "t").CombinedOutput()
		if err != nil || strings.Count(string(out), ": scores 1") != 2 {
			return fmt.Errorf("cumulus admin routers: %v\n%s", err, out)
		}
		return nil
	})
	for i, id := range shardIDs {
		waitShardReady(t, shards[i].out["shard "+id+" serving on "])
	}
	devclustertest.WaitReplicated(t, cli, 2)
	for _, r := range routers {
		waitRouterReady(t, r.out["http: http://"])
	}

	// The load: closed loop over both routers, round robin.
	rb := manual.NewBuilderWithScheme("rolling")
	var addrs []resolver.Address
	for _, r := range routers {
		addrs = append(addrs, resolver.Address{Addr: r.out["grpc: "]})
	}
	rb.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient("rolling:///routers", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		// A restarted router is found again within a second.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := kservepb.NewGRPCInferenceServiceClient(conn)
	req := rollingRequest()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	want, err := client.ModelInfer(ctx, req)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	var l load
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); l.run(client, req, want.Outputs[0].Contents.Fp32Contents, stop) }()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			wg.Wait()
		}
	}()

	phase := func(name string, restart func()) {
		t.Helper()
		before := l.ok.Load()
		t0 := time.Now()
		restart()
		n := l.ok.Load() - before
		t.Logf("%s: %d requests answered in %v", name, n, time.Since(t0).Round(time.Millisecond))
		if n == 0 {
			t.Errorf("%s: no request answered while it restarted", name)
		}
	}
	for i, id := range shardIDs {
		phase("restarting shard "+id, func() {
			shards[i].stop(t)
			shards[i] = startShard(id)
			waitShardReady(t, shards[i].out["shard "+id+" serving on "])
			devclustertest.WaitReplicated(t, cli, 2)
		})
	}
	// Shard calls that failed at the routers while the shards restarted,
	// asked again of the other replica.
	for _, r := range routers {
		t.Logf("router at %s: %s", r.out["grpc: "], shardCallErrors(t, r.out["http: http://"]))
	}
	for i := range routers {
		phase(fmt.Sprintf("restarting router %d", i), func() {
			httpAddr, grpcAddr := routers[i].out["http: http://"], routers[i].out["grpc: "]
			routers[i].stop(t)
			routers[i] = startRouter(httpAddr, grpcAddr)
			waitRouterReady(t, httpAddr)
			// Until the client balances over it again.
			l.answeredBy(grpcAddr).Store(0)
			testenv.Eventually(t, 30*time.Second, func() error {
				if l.answeredBy(grpcAddr).Load() == 0 {
					return fmt.Errorf("no request answered by the restarted router at %s yet", grpcAddr)
				}
				return nil
			})
		})
	}
	close(stop)
	wg.Wait()
	t.Logf("%d requests answered, %d asked again after Unavailable, %d failed", l.ok.Load(), l.retried.Load(), l.failed.Load())
	if n := l.failed.Load(); n > 0 {
		t.Errorf("%d requests failed; the first: %v", n, l.firstErr())
	}
}

// rollingRequest is 8 rows of 16 ids each over the whole model.
func rollingRequest() *kservepb.ModelInferRequest {
	var ids []int64
	splits := []int64{0}
	for r := range int64(8) {
		for k := range int64(16) {
			ids = append(ids, (r*7919+k*1237)%20000)
		}
		splits = append(splits, int64(len(ids)))
	}
	return &kservepb.ModelInferRequest{ModelName: "ctr", Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
		{Name: "ids", Datatype: "INT64", Shape: []int64{int64(len(ids))}, Contents: &kservepb.InferTensorContents{Int64Contents: ids}},
		{Name: "row_splits", Datatype: "INT64", Shape: []int64{int64(len(splits))}, Contents: &kservepb.InferTensorContents{Int64Contents: splits}},
	}}
}

// load counts the answers of a closed-loop client.
type load struct {
	ok, retried, failed atomic.Int64
	mu                  sync.Mutex
	first               error
	by                  sync.Map // router address → *atomic.Int64 answered
}

func (l *load) answeredBy(addr string) *atomic.Int64 {
	n, _ := l.by.LoadOrStore(addr, new(atomic.Int64))
	return n.(*atomic.Int64)
}

func (l *load) firstErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first
}

// run sends req until stop, asking again up to 4 more times a call
// answered Unavailable (a router going away, or none reachable for a
// moment), and checks each answer against want.
func (l *load) run(client kservepb.GRPCInferenceServiceClient, req *kservepb.ModelInferRequest, want []float32, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		var err error
		for attempt := range 5 {
			var p peer.Peer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var resp *kservepb.ModelInferResponse
			resp, err = client.ModelInfer(ctx, req, grpc.Peer(&p))
			cancel()
			if err == nil {
				if got := resp.Outputs[0].Contents.Fp32Contents; !slices.Equal(got, want) {
					err = fmt.Errorf("scores %v, want %v", got, want)
				} else {
					l.answeredBy(p.Addr.String()).Add(1)
				}
			}
			if status.Code(err) != codes.Unavailable {
				break
			}
			if attempt < 4 {
				l.retried.Add(1)
			}
		}
		if err != nil {
			l.failed.Add(1)
			l.mu.Lock()
			if l.first == nil {
				l.first = err
			}
			l.mu.Unlock()
			continue
		}
		l.ok.Add(1)
	}
}

// process is a cumulus process started by a test.
type process struct {
	cmd    *exec.Cmd
	out    map[string]string // what follows each awaited prefix on stdout
	stderr *syncBuffer
	exited chan error
}

// startProcess runs cumulus with args and waits until it has printed a
// line starting with each of prefixes. It is killed when the test ends,
// if it is still running.
func startProcess(t testing.TB, prefixes []string, args ...string) *process {
	t.Helper()
	p := &process{cmd: cumulus(args...), out: map[string]string{}, stderr: &syncBuffer{}, exited: make(chan error, 1)}
	stdout, _ := p.cmd.StdoutPipe()
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan map[string]string, 1)
	go func() {
		got := map[string]string{}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			for _, pre := range prefixes {
				if v, ok := strings.CutPrefix(sc.Text(), pre); ok {
					got[pre] = v
				}
			}
			if len(got) == len(prefixes) {
				found <- got
				break
			}
		}
		io.Copy(io.Discard, stdout)
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
		}
	})
	select {
	case p.out = <-found:
	case err := <-p.exited:
		t.Fatalf("cumulus %s exited: %v\n%s", args[0], err, p.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("cumulus %s printed no addresses in 30s\n%s", args[0], p.stderr)
	}
	return p
}

// stop sends SIGTERM and waits for a clean exit, logging the drain.
func (p *process) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("cumulus %s exited badly after SIGTERM: %v\n%s", p.cmd.Args[1], err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("cumulus %s did not exit within 30s of SIGTERM\n%s", p.cmd.Args[1], p.stderr)
	}
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		if _, msg, ok := strings.Cut(line, "msg="); ok && strings.Contains(msg, "drain") {
			t.Logf("%s: %s", p.cmd.Args[1], msg)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitShardReady waits until the shard at addr reports SERVING on gRPC
// health.
func waitShardReady(t *testing.T, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testenv.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if r.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("shard at %s: %s", addr, r.Status)
		}
		return nil
	})
}

// waitRouterReady waits until the router at httpAddr answers ready.
func waitRouterReady(t *testing.T, httpAddr string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + httpAddr + "/v2/health/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("router at %s: %s", httpAddr, resp.Status)
		}
		return nil
	})
}

// shardCallErrors reads a router's counts of failed shard calls and of
// lookups asked again from its /metrics.
func shardCallErrors(t *testing.T, httpAddr string) string {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, `cumulus_router_shard_call_seconds_count{outcome="error"`) || strings.HasPrefix(line, "cumulus_router_retries_total") {
			out = append(out, line)
		}
	}
	return strings.Join(out, ", ")
}

// checkedLoad is closed-loop load on a router from callers goroutines,
// sending rollingRequest: every answer must equal the first, and nothing
// is asked again.
type checkedLoad struct {
	ok, failed atomic.Int64
	first      atomic.Value // the first failure
	stop       chan struct{}
	wg         sync.WaitGroup
	once       sync.Once
}

func startCheckedLoad(t *testing.T, grpcAddr string, callers int) *checkedLoad {
	t.Helper()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := kservepb.NewGRPCInferenceServiceClient(conn)
	req := rollingRequest()
	first, err := client.ModelInfer(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := first.Outputs[0].Contents.Fp32Contents
	l := &checkedLoad{stop: make(chan struct{})}
	for range callers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := client.ModelInfer(ctx, req)
				cancel()
				if err == nil && !slices.Equal(resp.Outputs[0].Contents.Fp32Contents, want) {
					err = fmt.Errorf("scores %v, want %v", resp.Outputs[0].Contents.Fp32Contents, want)
				}
				if err != nil {
					l.failed.Add(1)
					l.first.CompareAndSwap(nil, err)
					continue
				}
				l.ok.Add(1)
			}
		}()
	}
	t.Cleanup(l.halt)
	return l
}

// await waits until n more requests have been answered.
func (l *checkedLoad) await(t *testing.T, n int64) {
	t.Helper()
	target := l.ok.Load() + n
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := l.ok.Load(); got < target {
			return fmt.Errorf("%d requests answered, waiting for %d", got, target)
		}
		return nil
	})
}

// halt stops the load and waits for its callers.
func (l *checkedLoad) halt() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}
