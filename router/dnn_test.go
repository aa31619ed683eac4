package router_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/shard"
)

// dnnRequest is randomRequest with each row's continuous features.
func dnnRequest(rng *rand.Rand, name string, m *loader.Sparse, rows, perRow, shared int) *router.Request {
	req := randomRequest(rng, name, m, rows, perRow, shared)
	for range rows * m.DenseInputs {
		req.Dense = append(req.Dense, float32(rng.NormFloat64()))
	}
	req.DenseShape = [2]int64{int64(rows), int64(m.DenseInputs)}
	return req
}

// TestDNNRolloutAndRollback: a DNN is served once routers hold its dense
// part; a new version with another dense part rolls out, and back, under
// load, with no request failing and every answer scored with one
// version's sparse values and dense part together (each checked against
// the reference of the version it names).
func TestDNNRolloutAndRollback(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	shape := model.Shape{Type: model.DNN, Dim: 4, Fields: 3, Pooling: "mean", DenseInputs: 2}
	v1 := randomShaped(shape, 2000, 21)
	v1.Dense = loader.GenDense(1, shape.DenseIn(), []int{16, 8})
	if _, err := repo.Publish("dnn", v1, 4, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, Replicas: 2, ScanInterval: time.Hour})
	refs := map[uint64]*reference.Model{1: reference.New(v1)}
	ctx := context.Background()
	testenv.Eventually(t, 30*time.Second, func() error {
		if s, _ := c.Router.Model("dnn"); s.Live != 1 {
			return errors.New("dnn v1 not live")
		}
		return nil
	})
	rng := rand.New(rand.NewPCG(5, 5))
	for _, sz := range [][3]int{{1, 1, 0}, {50, 12, 9}, {13, 0, 4}} {
		req := dnnRequest(rng, "dnn", v1, sz[0], sz[1], sz[2])
		resp, err := c.Router.Predict(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		checkScores(t, refs[1], req, resp)
	}
	// Without dense inputs, or with the wrong number, a request is refused.
	bad := dnnRequest(rng, "dnn", v1, 3, 2, 1)
	bad.Dense = bad.Dense[1:]
	if _, err := c.Router.Predict(ctx, bad); !errors.Is(err, router.ErrInvalidArgument) {
		t.Errorf("short dense: %v", err)
	}

	// Load runs through a rollout of v2 (a delta with a new dense part)
	// and a rollback to v1.
	v2 := &loader.Sparse{Shape: shape, Keys: v1.Keys, Values: append([]float32(nil), v1.Values...), Bias: v1.Bias,
		Dense: loader.GenDense(2, shape.DenseIn(), []int{16, 8})}
	for i := range v2.Values {
		v2.Values[i] *= 1.5
	}
	refs[2] = reference.New(v2)
	var failed, checked atomic.Int64
	var mu sync.Mutex
	var mismatch error
	seen := map[uint64]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for {
				select {
				case <-stop:
					return
				default:
				}
				req := dnnRequest(rng, "dnn", v1, 20, 8, 5)
				resp, err := c.Router.Predict(ctx, req)
				if err != nil {
					failed.Add(1)
					continue
				}
				checked.Add(1)
				mu.Lock()
				seen[resp.Version]++
				if err := scoresMatch(refs[resp.Version], req, resp); err != nil && mismatch == nil {
					mismatch = fmt.Errorf("an answer from version %d: %w", resp.Version, err)
				}
				mu.Unlock()
			}
		}()
	}
	if _, err := repo.PublishDelta("dnn", loader.Delta{Upserts: &loader.Sparse{Shape: shape, Keys: v2.Keys, Values: v2.Values}, Dense: v2.Dense}); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		if s, _ := c.Router.Model("dnn"); s.Live != 2 {
			return errors.New("dnn v2 not live")
		}
		return nil
	})
	waitChecked := func() {
		n := checked.Load()
		testenv.Eventually(t, 10*time.Second, func() error {
			if checked.Load() < n+50 {
				return errors.New("load not flowing")
			}
			return nil
		})
	}
	waitChecked()
	if _, err := c.Manager.Do(ctx, manager.Command{Op: manager.OpRollback, Model: "dnn", Version: 1}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if s, _ := c.Router.Model("dnn"); s.Live != 1 {
			return errors.New("not rolled back to v1")
		}
		return nil
	})
	waitChecked()
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || mismatch != nil {
		t.Fatalf("%d of %d requests failed; %v", failed.Load(), failed.Load()+checked.Load(), mismatch)
	}
	if seen[1] == 0 || seen[2] == 0 {
		t.Fatalf("answers by version: %v; want both", seen)
	}
	t.Logf("%d requests, answers by version %v, none failed, none mixed", checked.Load(), seen)
}

// lyingShard answers lookups honestly and sends a corrupted dense part
// while lie is set.
type lyingShard struct {
	shard.Service
	lie atomic.Bool
}

func (l *lyingShard) Extra(ctx context.Context, model string, version uint64, role string) ([]byte, error) {
	b, err := l.Service.Extra(ctx, model, version, role)
	if err == nil && l.lie.Load() {
		b = append([]byte(nil), b...)
		b[len(b)-1] ^= 1
	}
	return b, err
}

// lyingCluster starts a cluster whose router reaches every shard through
// a lyingShard; lie turns their lies on or off.
func lyingCluster(t *testing.T, o devcluster.Options) (c *devcluster.Cluster, lie func(bool)) {
	var mu sync.Mutex
	var liars []*lyingShard
	o.Router.Dial = func(addr string) (shard.Service, io.Closer, error) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		l := &lyingShard{Service: shard.NewClient(conn)}
		mu.Lock()
		liars = append(liars, l)
		mu.Unlock()
		return l, conn, nil
	}
	return devclustertest.Start(t, o), func(on bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range liars {
			l.lie.Store(on)
		}
	}
}

// TestDenseFetchTrustsNoShard: a router refuses a dense part whose
// SHA-256 is not the map's, says so while the model cannot be served,
// and serves it once a shard sends the right bytes.
func TestDenseFetchTrustsNoShard(t *testing.T) {
	repoDir := t.TempDir()
	shape := model.Shape{Type: model.DNN, Dim: 2, Fields: 2, Pooling: "sum"}
	m := randomShaped(shape, 500, 3)
	m.Dense = loader.GenDense(3, shape.DenseIn(), []int{4})
	if _, err := (loader.Repo{Dir: repoDir}).Publish("lr", randomModel(model.LR, 0, 100, 1), 2, "test"); err != nil {
		t.Fatal(err)
	}
	// The router cannot score the version; it goes live once the
	// router's wait (a second) runs out.
	c, lie := lyingCluster(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour,
		Manager: func(o *manager.Options) { o.RouterWait = time.Second }})
	lie(true)
	if _, err := (loader.Repo{Dir: repoDir}).Publish("dnn", m, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	ctx := context.Background()
	req := dnnRequest(rand.New(rand.NewPCG(1, 1)), "dnn", m, 4, 3, 2)
	testenv.Eventually(t, 30*time.Second, func() error {
		_, err := c.Router.Predict(ctx, req)
		if !errors.Is(err, router.ErrUnavailable) || !strings.Contains(err.Error(), "SHA-256 is not the serving map's") {
			return fmt.Errorf("predict: %v; want unavailable, naming the bad dense part", err)
		}
		return nil
	})
	if c.Router.Ready() {
		t.Error("ready without the dense part of the live version")
	}
	lie(false)
	testenv.Eventually(t, 30*time.Second, func() error {
		resp, err := c.Router.Predict(ctx, req)
		if err != nil {
			return err
		}
		return scoresMatch(reference.New(m), req, resp)
	})
}

// TestRouterHoldsBackTheRollout: a version whose dense part a router
// cannot fetch is not committed until the router's wait runs out; then
// it goes live, and that router answers its model 503, naming why, and
// is not ready, until it can score it.
func TestRouterHoldsBackTheRollout(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	shape := model.Shape{Type: model.DNN, Dim: 2, Fields: 2, Pooling: "sum"}
	v1 := randomShaped(shape, 500, 4)
	v1.Dense = loader.GenDense(4, shape.DenseIn(), []int{4})
	if _, err := repo.Publish("dnn", v1, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c, lie := lyingCluster(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour,
		Manager: func(o *manager.Options) { o.RouterWait = 2 * time.Second }})
	// A router holds rollouts back once it is registered (it registers
	// in the background, and may serve before).
	testenv.Eventually(t, 30*time.Second, func() error {
		if len(c.Manager.Routers()) != 1 {
			return errors.New("the router is not registered yet")
		}
		return nil
	})
	lie(true)
	if _, err := repo.PublishDelta("dnn", loader.Delta{Dense: loader.GenDense(5, shape.DenseIn(), []int{4})}); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	// Staged and held back, naming the router and why; v1 still serves.
	testenv.Eventually(t, 30*time.Second, func() error {
		ms := c.Manager.State().Models["dnn"]
		if ms == nil || ms.Staged != 2 {
			return fmt.Errorf("v2 not staged: %+v", ms)
		}
		for _, v := range ms.Versions {
			if v.Version == 2 && strings.Contains(v.Reason, "waiting for routers") && strings.Contains(v.Reason, "SHA-256") {
				return nil
			}
		}
		return fmt.Errorf("v2 not held back by the router: %+v", ms.Versions)
	})
	req := dnnRequest(rand.New(rand.NewPCG(2, 2)), "dnn", v1, 5, 3, 2)
	if resp, err := c.Router.Predict(context.Background(), req); err != nil || resp.Version != 1 {
		t.Fatalf("while v2 is held back: %v, %+v", err, resp)
	}
	// The wait runs out: v2 goes live; this router cannot score it.
	testenv.Eventually(t, 30*time.Second, func() error {
		if ms := c.Manager.State().Models["dnn"]; ms.Live != 2 {
			return errors.New("v2 not live")
		}
		_, err := c.Router.Predict(context.Background(), req)
		if !errors.Is(err, router.ErrUnavailable) || !strings.Contains(err.Error(), "dense part") {
			return fmt.Errorf("predict: %v; want unavailable, naming the dense part", err)
		}
		return nil
	})
	if c.Router.Ready() {
		t.Error("ready while the live version cannot be scored")
	}
	lie(false)
	testenv.Eventually(t, 30*time.Second, func() error {
		resp, err := c.Router.Predict(context.Background(), req)
		if err != nil {
			return err
		}
		if resp.Version != 2 || !c.Router.Ready() {
			return fmt.Errorf("answered by v%d, ready %v", resp.Version, c.Router.Ready())
		}
		return nil
	})
}

// TestValueLimit: a request may fetch at most Limits.MaxValues values
// (distinct ids times the version's width); past it, it is refused
// before anything is fetched.
func TestValueLimit(t *testing.T) {
	repoDir := t.TempDir()
	shape := model.Shape{Type: model.FFM, Fields: 6, Dim: 3} // 19 values per key
	m := randomShaped(shape, 100, 8)
	if _, err := (loader.Repo{Dir: repoDir}).Publish("ffm", m, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 1, ScanInterval: time.Hour,
		Router: router.Options{Limits: router.Limits{MaxValues: 19 * 10}}})
	req := func(n int) *router.Request {
		r := &router.Request{Model: "ffm", RowSplits: []int64{0, int64(n)}}
		for i := range n {
			r.IDs, r.Fields = append(r.IDs, uint64(i)<<40), append(r.Fields, 0) // absent ids count too
		}
		return r
	}
	if _, err := c.Router.Predict(context.Background(), req(10)); err != nil {
		t.Fatalf("10 ids: %v", err)
	}
	_, err := c.Router.Predict(context.Background(), req(11))
	if !errors.Is(err, router.ErrInvalidArgument) || !strings.Contains(err.Error(), "11 distinct ids of 19 values each") {
		t.Fatalf("11 ids: %v", err)
	}
}
