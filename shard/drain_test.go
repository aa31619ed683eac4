package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// assignedShard publishes testModel(1) in two partitions, assigns both
// to s1 in the serving map, then starts s1 with opts (ID, Repo, Etcd and
// DataDir filled in) and dials it.
func assignedShard(t *testing.T, opts Options) (*Shard, *clientv3.Client, *grpc.ClientConn) {
	t.Helper()
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	if _, err := repo.Publish("m", testModel(1), 2, ""); err != nil {
		t.Fatal(err)
	}
	putMap(t, cli, repo, 2, 1, 0)
	opts.ID, opts.Repo, opts.Etcd, opts.DataDir = "s1", repo, cli, t.TempDir()
	s, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, cli, conn
}

func healthOf(conn *grpc.ClientConn) healthpb.HealthCheckResponse_ServingStatus {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return r.Status
}

func waitHealth(t *testing.T, conn *grpc.ClientConn, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		if got := healthOf(conn); got != want {
			return fmt.Errorf("health %s, want %s", got, want)
		}
		return nil
	})
}

// registration reads s1's registration from etcd; ok is false when
// there is none.
func registration(t *testing.T, cli *clientv3.Client) (si topo.ShardInfo, ok bool) {
	t.Helper()
	resp, err := cli.Get(context.Background(), topo.DefaultCluster.ShardKey("s1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return si, false
	}
	si, err = topo.Decode[topo.ShardInfo]("s1", resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return si, true
}

// A shard is ready (gRPC health SERVING) only once it holds what the map
// assigns it and its registration in etcd says so.
func TestReadyOnceServingAssigned(t *testing.T) {
	loading, release := make(chan struct{}, 2), make(chan struct{})
	_, cli, conn := assignedShard(t, Options{BeforeLoad: func(ctx context.Context, _ string, _ uint64, _ uint32) error {
		loading <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	select {
	case <-loading:
	case <-time.After(10 * time.Second):
		t.Fatal("the shard did not start loading its assignment in 10s")
	}
	if got := healthOf(conn); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health %s while loading what the map assigns, want NOT_SERVING", got)
	}
	close(release)
	waitHealth(t, conn, healthpb.HealthCheckResponse_SERVING)
	si, _ := registration(t, cli)
	if len(si.Loaded) != 1 || !slices.Equal(si.Loaded[0].Have, []uint32{0, 1}) {
		t.Errorf("SERVING, but etcd has the shard report %+v; want both partitions of version 1", si.Loaded)
	}
}

// lookupAll asks the shard over gRPC for every key of testModel(1) and
// checks the answer.
func lookupAll(c *Client) error {
	keys := slices.Clone(testModel(1).Keys)
	sections := sectionsOf(keys, 2)
	raw, err := c.Lookup(context.Background(), codec.AppendLookupRequest(nil, "m", 1, sections))
	if err != nil {
		return err
	}
	var r codec.LookupResponse
	if err := r.Decode(raw, len(keys), 1, codec.EncFP32); err != nil {
		return err
	}
	k := 0
	for _, sec := range sections {
		for _, key := range sec.Keys {
			if !r.Found(k) || r.Value(k, 0) != float32(key%1000+1) {
				return fmt.Errorf("key %d: found %v, value %v", key, r.Found(k), r.Value(k, 0))
			}
			k++
		}
	}
	return nil
}

// heldLookups returns a BeforeLookup hook that holds lookups while hold
// is open, telling held as each is caught, until release is closed or
// the call ends.
func heldLookups(hold *atomic.Bool, held chan<- struct{}, release <-chan struct{}) func(context.Context) {
	return func(ctx context.Context) {
		if !hold.Load() {
			return
		}
		held <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
}

// Draining, a shard leaves etcd and reports NOT_SERVING at once, still
// answers lookups that come, finishes the one under way, and stops.
func TestDrainFinishesLookupsUnderWay(t *testing.T) {
	var hold atomic.Bool
	hold.Store(true)
	held, release := make(chan struct{}, 1), make(chan struct{})
	s, cli, conn := assignedShard(t, Options{DrainQuiet: 200 * time.Millisecond, BeforeLookup: heldLookups(&hold, held, release)})
	waitHealth(t, conn, healthpb.HealthCheckResponse_SERVING)
	c := NewClient(conn)

	underWay := make(chan error, 1)
	go func() { underWay <- lookupAll(c) }()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the lookup did not reach the shard in 10s")
	}
	hold.Store(false)
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		drained <- s.Drain(ctx)
	}()

	waitHealth(t, conn, healthpb.HealthCheckResponse_NOT_SERVING)
	testenv.Eventually(t, 10*time.Second, func() error {
		if _, ok := registration(t, cli); ok {
			return errors.New("the registration is still in etcd")
		}
		return nil
	})
	// A router that has not yet seen the shard go still gets answers.
	if err := lookupAll(c); err != nil {
		t.Fatalf("a lookup arriving during the drain: %v", err)
	}
	select {
	case err := <-drained:
		t.Fatalf("the drain ended (%v) with a lookup under way", err)
	default:
	}
	close(release)
	if err := <-underWay; err != nil {
		t.Fatalf("the lookup under way when the drain began: %v", err)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the drain did not end in a minute")
	}
	if err := lookupAll(c); err == nil {
		t.Error("a lookup after the drain was answered")
	}
}

// A drain whose time runs out stops the shard, failing the lookup still
// under way, and says so.
func TestDrainTimesOut(t *testing.T) {
	var hold atomic.Bool
	hold.Store(true)
	held, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	s, cli, conn := assignedShard(t, Options{BeforeLookup: heldLookups(&hold, held, release)})
	waitHealth(t, conn, healthpb.HealthCheckResponse_SERVING)
	underWay := make(chan error, 1)
	go func() { underWay <- lookupAll(NewClient(conn)) }()
	<-held
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- s.Drain(ctx) }()
	testenv.Eventually(t, 10*time.Second, func() error {
		if _, ok := registration(t, cli); ok {
			return errors.New("the registration is still in etcd")
		}
		return nil
	})
	cancel()
	if err := <-drained; !errors.Is(err, context.Canceled) {
		t.Errorf("drain: %v, want the context's error", err)
	}
	if err := <-underWay; err == nil {
		t.Error("the lookup under way when the drain was cut short was answered")
	}
}

// TestLookupAdmission: with its one slot held by a lookup, a shard
// refuses the next with ResourceExhausted (the router asks another
// replica), and answers again once the slot is free.
func TestLookupAdmission(t *testing.T) {
	var hold atomic.Bool
	hold.Store(true)
	held, release := make(chan struct{}, 1), make(chan struct{})
	s, _, conn := assignedShard(t, Options{MaxInflight: 1, MaxQueueTime: time.Millisecond, BeforeLookup: heldLookups(&hold, held, release)})
	waitHealth(t, conn, healthpb.HealthCheckResponse_SERVING)
	c := NewClient(conn)
	underWay := make(chan error, 1)
	go func() { underWay <- lookupAll(c) }()
	<-held
	hold.Store(false)
	if err := lookupAll(c); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second lookup beside the held one: %v, want ResourceExhausted", err)
	}
	close(release)
	if err := <-underWay; err != nil {
		t.Fatalf("the held lookup: %v", err)
	}
	if err := lookupAll(c); err != nil {
		t.Errorf("after the slot is free: %v", err)
	}
	if got := testutil.ToFloat64(s.metrics.refused); got != 1 {
		t.Errorf("refusals counted: %v, want 1", got)
	}
}
