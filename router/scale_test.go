package router_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/shard"
)

// traffic sends one request again and again, from its own goroutine,
// until stopped or until a request fails or is answered wrongly.
type traffic struct {
	answered atomic.Int64
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	err      error
}

func startTraffic(t *testing.T, r *router.Router, req *router.Request, check func(*router.Response) error) *traffic {
	tr := &traffic{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		for {
			select {
			case <-tr.stop:
				return
			default:
			}
			resp, err := r.Predict(context.Background(), req)
			if err == nil {
				err = check(resp)
			}
			if err != nil {
				tr.err = fmt.Errorf("request %d: %w", tr.answered.Load()+1, err)
				return
			}
			tr.answered.Add(1)
		}
	}()
	t.Cleanup(func() { tr.Stop() })
	return tr
}

// Stop ends the traffic and returns how many requests were answered and
// the first failure.
func (tr *traffic) Stop() (int64, error) {
	tr.once.Do(func() { close(tr.stop) })
	<-tr.done
	return tr.answered.Load(), tr.err
}

// await waits until n more requests have been answered.
func (tr *traffic) await(t *testing.T, n int64) {
	t.Helper()
	until := tr.answered.Load() + n
	tr.until(t, func() error {
		if tr.answered.Load() < until {
			return fmt.Errorf("%d of %d requests answered", tr.answered.Load(), until)
		}
		return nil
	})
}

// until waits for cond, failing the test at once if the traffic stops on
// an error first.
func (tr *traffic) until(t *testing.T, cond func() error) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		select {
		case <-tr.done:
			t.Fatalf("traffic stopped: %v", tr.err)
		default:
		}
		return cond()
	})
}

func assignment(t *testing.T, c *devcluster.Cluster, model string) topo.Assignment {
	t.Helper()
	a, ok, err := topo.ReadAssignment(context.Background(), c.Etcd, topo.DefaultCluster, model)
	if err != nil || !ok {
		t.Fatalf("reading %s's assignment: %v", model, err)
	}
	return a
}

// TestScaleOutNeverFails adds a shard under traffic. The manager moves
// half the partitions to it; the new shard is held before it loads them,
// and the old one must keep serving them meanwhile (make before break).
// No request may fail or be answered wrongly, before, during or after
// the handover.
func TestScaleOutNeverFails(t *testing.T) {
	repoDir := t.TempDir()
	m := randomModel(model.LR, 0, 4000, 21)
	if _, err := (loader.Repo{Dir: repoDir}).Publish("lr", m, 8, "test"); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 1, ScanInterval: time.Hour,
		Shard: func(i int, o *shard.Options) {
			if i == 1 {
				o.BeforeLoad = func(ctx context.Context, _ string, _ uint64, _ uint32) error {
					select {
					case <-release:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
		}})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the cluster's own cleanup: never leave the new shard blocked
	ref := reference.New(m)
	req := randomRequest(rand.New(rand.NewPCG(21, 21)), "lr", m, 50, 20, 5)
	tr := startTraffic(t, c.Router, req, func(resp *router.Response) error { return scoresMatch(ref, req, resp) })
	tr.await(t, 10)

	if _, err := c.AddShard(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if !slices.ContainsFunc(assignment(t, c, "lr").Replicas, func(r []string) bool { return slices.Contains(r, "shard-1") }) {
			return errors.New("shard-1 has no partition yet")
		}
		return nil
	})
	for p, reps := range assignment(t, c, "lr").Replicas {
		if !slices.Contains(reps, "shard-0") {
			t.Errorf("partition %d taken from shard-0 before shard-1 loaded it: %v", p, reps)
		}
	}
	tr.await(t, 20) // served by shard-0 alone while shard-1 is held

	unblock()
	var moved []uint32
	testenv.Eventually(t, 30*time.Second, func() error {
		moved = moved[:0]
		for p, reps := range assignment(t, c, "lr").Replicas {
			if len(reps) != 1 {
				return fmt.Errorf("partition %d still assigned to %v", p, reps)
			}
			if reps[0] == "shard-1" {
				moved = append(moved, uint32(p))
			}
		}
		for _, l := range c.Shards[0].Loaded() {
			if l.Model == "lr" && slices.ContainsFunc(moved, func(p uint32) bool { return slices.Contains(l.Have, p) }) {
				return fmt.Errorf("shard-0 still holds some of %v", moved)
			}
		}
		return nil
	})
	if len(moved) == 0 || len(moved) == 8 {
		t.Fatalf("shard-1 took %d of 8 partitions", len(moved))
	}
	tr.await(t, 20) // served by both after the handover
	n, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests answered through the scale-out; partitions %v moved", n, moved)
}

// faulty is a shard's real gRPC client that, while fail holds a code
// other than OK, answers every lookup with that status instead.
type faulty struct {
	svc  shard.Service
	fail atomic.Uint32 // a codes.Code
	hang atomic.Bool   // answer only when the caller gives up
}

func (f *faulty) Lookup(ctx context.Context, req []byte) ([]byte, error) {
	if c := codes.Code(f.fail.Load()); c != codes.OK {
		return nil, status.Error(c, "injected fault")
	}
	if f.hang.Load() {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return f.svc.Lookup(ctx, req)
}

func (f *faulty) Extra(ctx context.Context, model string, version uint64, role string) ([]byte, error) {
	return f.svc.Extra(ctx, model, version, role)
}

// faultyCluster serves an FM model from two shards holding every
// partition each, reached through faulty wrappers: fault(i) is shard i's.
func faultyCluster(t *testing.T, reg *prometheus.Registry) (c *devcluster.Cluster, m *loader.Sparse, fault func(i int) *faulty) {
	repoDir := t.TempDir()
	m = randomModel(model.FM, 4, 3000, 31)
	if _, err := (loader.Repo{Dir: repoDir}).Publish("fm", m, 6, "test"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	faults := map[string]*faulty{}
	c = devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, Replicas: 2, ScanInterval: time.Hour, Registry: reg,
		Router: router.Options{Dial: func(addr string) (shard.Service, io.Closer, error) {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, nil, err
			}
			f := &faulty{svc: shard.NewClient(conn)}
			mu.Lock()
			faults[addr] = f
			mu.Unlock()
			return f, conn, nil
		}}})
	fault = func(i int) *faulty {
		mu.Lock()
		defer mu.Unlock()
		return faults[c.Shards[i].Addr()]
	}
	return c, m, fault
}

// retries reads cumulus_router_retries_total{kind}.
func retries(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cumulus_router_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestRetryOtherReplica: a replica that answers FailedPrecondition (it no
// longer holds the partition) or Unavailable (unreachable) costs a retry
// on the other replica, not a failed request; with every replica
// unreachable, the request fails as unavailable at once, and with one
// unreachable and the other not holding the partition it waits for a newer
// routing table within its deadline.
func TestRetryOtherReplica(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, m, fault := faultyCluster(t, reg)
	ref := reference.New(m)
	rng := rand.New(rand.NewPCG(31, 31))
	for _, code := range []codes.Code{codes.FailedPrecondition, codes.Unavailable} {
		fault(0).fail.Store(uint32(code))
		before := retries(t, reg, "replica")
		// Replicas are taken in turn, so shard-0 is asked (once the router
		// has seen it hold its partitions) and retried away from; every
		// request meanwhile must be answered right.
		testenv.Eventually(t, 30*time.Second, func() error {
			req := randomRequest(rng, "fm", m, 30, 10, 3)
			resp, err := c.Router.Predict(context.Background(), req)
			if err != nil {
				t.Fatalf("with shard-0 answering %v: %v", code, err)
			}
			checkScores(t, ref, req, resp)
			if retries(t, reg, "replica") == before {
				return fmt.Errorf("with shard-0 answering %v: no retry counted yet", code)
			}
			return nil
		})
	}
	// Every replica unreachable: unavailable at once, whichever failed
	// last.
	fault(1).fail.Store(uint32(codes.Unavailable))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Router.Predict(ctx, randomRequest(rng, "fm", m, 30, 10, 3))
	if !errors.Is(err, router.ErrUnavailable) || ctx.Err() != nil {
		t.Errorf("every replica unreachable: %v (deadline: %v), want unavailable before the deadline", err, ctx.Err())
	}
	// One unreachable, the other no longer holding the partition: the
	// table lags, so the request waits for the next one, whichever replica
	// failed last (CI once saw the order decide), and fails with its
	// deadline (or as unavailable if tables keep coming and none holds
	// it).
	fault(1).fail.Store(uint32(codes.FailedPrecondition))
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Router.Predict(ctx, randomRequest(rng, "fm", m, 30, 10, 3))
	if !errors.Is(err, router.ErrDeadlineExceeded) && status.Code(err) != codes.FailedPrecondition {
		t.Errorf("one replica unreachable, the other not holding: %v, want the deadline exceeded", err)
	}
	fault(0).fail.Store(uint32(codes.OK))
	fault(1).fail.Store(uint32(codes.OK))
	req := randomRequest(rng, "fm", m, 30, 10, 3)
	resp, err := c.Router.Predict(context.Background(), req)
	if err != nil {
		t.Fatalf("after the faults cleared: %v", err)
	}
	checkScores(t, ref, req, resp)
}

// TestShardErrorsKeepTheirCodes: with every replica failing, the request
// fails with what the shards' failure means to the caller: a missed
// deadline is DeadlineExceeded, overload ResourceExhausted, an internal
// failure Internal; unreachable replicas fail it Unavailable at once, not
// when its deadline runs out.
func TestShardErrorsKeepTheirCodes(t *testing.T) {
	c, m, fault := faultyCluster(t, prometheus.NewRegistry())
	rng := rand.New(rand.NewPCG(32, 32))
	req := randomRequest(rng, "fm", m, 30, 10, 3)
	testenv.Eventually(t, 30*time.Second, func() error {
		_, err := c.Router.Predict(context.Background(), req)
		return err
	})
	for _, tc := range []struct {
		code codes.Code
		want error
	}{
		{codes.Unavailable, router.ErrUnavailable},
		{codes.ResourceExhausted, router.ErrResourceExhausted},
		{codes.Internal, router.ErrInternal},
		{codes.InvalidArgument, router.ErrInternal}, // the router built the request
	} {
		fault(0).fail.Store(uint32(tc.code))
		fault(1).fail.Store(uint32(tc.code))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := c.Router.Predict(ctx, req)
		if !errors.Is(err, tc.want) {
			t.Errorf("every replica answering %v: %v, want %v", tc.code, err, tc.want)
		}
		if ctx.Err() != nil {
			t.Errorf("every replica answering %v: the request waited out its deadline", tc.code)
		}
		cancel()
	}
	fault(0).fail.Store(uint32(codes.OK))
	fault(1).fail.Store(uint32(codes.OK))
	fault(0).hang.Store(true)
	fault(1).hang.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Router.Predict(ctx, req); !errors.Is(err, router.ErrDeadlineExceeded) {
		t.Errorf("shards answering after the deadline: %v, want deadline exceeded", err)
	}
	// The router's own bound applies to a request without a deadline.
	if _, err := c.Router.Predict(context.Background(), req); !errors.Is(err, router.ErrDeadlineExceeded) {
		t.Errorf("no deadline, shards hanging: %v, want deadline exceeded (DefaultTimeout)", err)
	}
}

// TestShardLeavingFinishesCallsUnderWay: a call a shard is answering
// when it leaves (drains: out of etcd, still answering) is answered,
// though the router's table has dropped the shard meanwhile: the router
// keeps the connection open for the requests still using it, and nothing
// is asked again of another replica.
func TestShardLeavingFinishesCallsUnderWay(t *testing.T) {
	repoDir := t.TempDir()
	m := randomModel(model.FM, 4, 3000, 34)
	if _, err := (loader.Repo{Dir: repoDir}).Publish("fm", m, 6, "test"); err != nil {
		t.Fatal(err)
	}
	var hold atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	reg := prometheus.NewRegistry()
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, Replicas: 2, ScanInterval: time.Hour, Registry: reg,
		Shard: func(i int, o *shard.Options) {
			if i == 0 {
				o.BeforeLookup = func(ctx context.Context) {
					if hold.CompareAndSwap(true, false) {
						held <- struct{}{}
						<-release
					}
				}
			}
		}})
	ref := reference.New(m)
	rng := rand.New(rand.NewPCG(33, 33))
	req := randomRequest(rng, "fm", m, 30, 10, 3)
	// Settled: both shards hold every partition and the router has seen
	// it, so no call meets a shard that is still loading (a retry, too).
	devclustertest.WaitReplicated(t, c.Etcd, 2)
	testenv.Eventually(t, 30*time.Second, func() error {
		resp, err := c.Etcd.Get(context.Background(), "settled")
		if err == nil && c.Router.Revision() < resp.Header.Revision {
			err = fmt.Errorf("router at revision %d, etcd at %d", c.Router.Revision(), resp.Header.Revision)
		}
		if err == nil {
			_, err = c.Router.Predict(context.Background(), req)
		}
		return err
	})
	before := retries(t, reg, "replica")
	hold.Store(true)
	type answer struct {
		resp *router.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		for {
			// Replicas are taken in turn: some request reaches shard-0.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			resp, err := c.Router.Predict(ctx, req)
			cancel()
			if err != nil || !hold.Load() {
				answered <- answer{resp, err}
				return
			}
		}
	}()
	<-held
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		drained <- c.Shards[0].Drain(ctx)
	}()
	// The router's table no longer routes to shard-0.
	testenv.Eventually(t, 20*time.Second, func() error {
		resp, err := c.Etcd.Get(context.Background(), topo.DefaultCluster.ShardKey("shard-0"))
		if err != nil || len(resp.Kvs) > 0 || c.Router.Revision() < resp.Header.Revision {
			return fmt.Errorf("shard-0 still registered, or the router has not seen it go (%v)", err)
		}
		return nil
	})
	close(release)
	a := <-answered
	if a.err != nil {
		t.Fatalf("the request whose call shard-0 was answering when it left: %v", a.err)
	}
	checkScores(t, ref, req, a.resp)
	if got := retries(t, reg, "replica"); got != before {
		t.Errorf("%v calls asked again of another replica: the call under way was cut, not answered", got-before)
	}
	if err := <-drained; err != nil {
		t.Errorf("shard-0's drain: %v", err)
	}
}

// TestScaleInNeverFails: with one replica, a cordoned shard keeps serving
// until its partitions are loaded elsewhere, is then shown empty, and can
// be killed with no request failing or answered wrongly.
func TestScaleInNeverFails(t *testing.T) {
	repoDir := t.TempDir()
	m := randomModel(model.LR, 0, 4000, 23)
	if _, err := (loader.Repo{Dir: repoDir}).Publish("lr", m, 8, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 3, ScanInterval: time.Hour})
	ref := reference.New(m)
	req := randomRequest(rand.New(rand.NewPCG(23, 23)), "lr", m, 50, 20, 5)
	var trs []*traffic
	for range 2 {
		trs = append(trs, startTraffic(t, c.Router, req, func(resp *router.Response) error { return scoresMatch(ref, req, resp) }))
	}
	trs[0].await(t, 10)
	held := 0
	for _, reps := range assignment(t, c, "lr").Replicas {
		if slices.Contains(reps, "shard-0") {
			held++
		}
	}
	if held == 0 {
		t.Fatal("shard-0 holds nothing to hand over")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Manager.Do(ctx, manager.Command{Op: manager.OpCordon, Shard: "shard-0", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	trs[0].until(t, func() error {
		if st := c.Manager.ShardState("shard-0"); st != "empty" {
			return fmt.Errorf("shard-0 is %s", st)
		}
		return nil
	})
	for p, reps := range assignment(t, c, "lr").Replicas {
		if slices.Contains(reps, "shard-0") {
			t.Fatalf("partition %d still on the empty shard-0: %v", p, reps)
		}
	}
	trs[0].await(t, 10)
	c.Shards[0].Crash() // as kill -9: its registration stays until its lease runs out
	trs[0].await(t, 50)
	for i, tr := range trs {
		n, err := tr.Stop()
		if err != nil {
			t.Fatalf("traffic %d: %v", i, err)
		}
		t.Logf("traffic %d: %d requests answered through the cordon and the kill; shard-0 held %d of 8 partitions", i, n, held)
	}
}
