// Package devcluster wires a whole Cumulus cluster into one process on
// loopback: an embedded etcd, a manager, N shard servers on their own
// gRPC ports and a router. It is `cumulus dev`, and the integration
// tests' cluster: every hop is a real socket.
package devcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/etcdlocal"
	"github.com/cumulus-serving/cumulus/internal/raftgroup"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/shard"
)

// Options configure a dev cluster. Zero values mean the documented default.
type Options struct {
	// Repo is the model repository; required.
	Repo string
	// DataDir holds etcd's data (DataDir/etcd) and shard N's copies of
	// the partitions it maps (DataDir/shard-N, its shard.Options.DataDir).
	// Default: a new temporary directory, removed on Close.
	DataDir string
	// Shards is the number of shard servers. Default 4.
	Shards int
	// Replicas per partition. Default 1.
	Replicas int
	// Cluster names the cluster in etcd. Default "default".
	Cluster topo.Cluster
	// Build is the version the shards report.
	Build string
	// ScanInterval for new versions. Default 2s.
	ScanInterval time.Duration
	// Router options; Etcd and Registry are filled in.
	Router router.Options
	// Registry receives every component's metrics; nil registers nowhere.
	Registry prometheus.Registerer
	// MemoryBudget is each shard's resident table budget in bytes (see
	// shard.Options.MemoryBudget). 0: no bound.
	MemoryBudget int64
	// Shard, if set, adjusts shard i's options before it starts.
	Shard func(i int, o *shard.Options)
	// Manager, if set, adjusts the manager's options (its policy, its
	// gates) before it starts. The manager is a one-member raft group
	// (Options.Raft); nil Raft keeps its state in etcd instead.
	Manager func(o *manager.Options)
	// EtcdTLS, if set, serves etcd over TLS with these files (client
	// certificates required, see etcdlocal.Start), and the cluster's own
	// client presents them.
	EtcdTLS *tlsconf.Files
}

// Cluster is a running dev cluster.
type Cluster struct {
	Etcd     *clientv3.Client
	Manager  *manager.Manager
	Shards   []*shard.Shard
	Router   *router.Router
	etcd     *etcdlocal.Etcd
	tmp      string
	ctx      context.Context
	cancel   context.CancelFunc
	opts     Options
	EtcdAddr string
	loadTurn chan struct{} // the shards load one partition at a time between them
	// managerOpts are the options the manager was started with.
	managerOpts manager.Options
}

// Start starts everything; it does not wait for models to load (see
// Router.Ready).
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Repo == "" {
		return nil, errors.New("devcluster: Options.Repo is required")
	}
	if o.Shards == 0 {
		o.Shards = 4
	}
	if o.ScanInterval == 0 {
		o.ScanInterval = 2 * time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	c = &Cluster{ctx: ctx, cancel: cancel, opts: o, loadTurn: make(chan struct{}, 1)}
	// A failure closes what was started. The cluster is held apart from
	// the result c, which `return nil, err` has set to nil by the time
	// this runs.
	started := c
	defer func() {
		if err != nil {
			started.Close()
		}
	}()
	if o.DataDir == "" {
		if c.tmp, err = os.MkdirTemp("", "cumulus-dev-"); err != nil {
			return nil, fmt.Errorf("devcluster: %w", err)
		}
		o.DataDir = c.tmp
		c.opts.DataDir = c.tmp
	}
	if c.etcd, err = etcdlocal.Start(filepath.Join(o.DataDir, "etcd"), o.EtcdTLS); err != nil {
		return nil, err
	}
	c.EtcdAddr = c.etcd.Endpoint
	var etcdTLS tlsconf.Files
	if o.EtcdTLS != nil {
		etcdTLS = *o.EtcdTLS
	}
	if c.Etcd, err = topo.Dial(ctx, []string{c.etcd.Endpoint}, etcdTLS); err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	for range o.Shards {
		if _, err := c.AddShard(); err != nil {
			return nil, err
		}
	}
	repo := loader.Repo{Dir: o.Repo}
	// The manager starts after the shards have registered, so its first
	// assignment already spreads partitions over all of them.
	mo := manager.Options{Repo: repo, Etcd: c.Etcd, Cluster: o.Cluster, Replicas: o.Replicas, ScanInterval: o.ScanInterval, Registry: o.Registry}
	// The manager is a raft group of one, as a real cluster's are of
	// three, its log in the data directory (a dev cluster started again
	// on the same directory carries on from it).
	// Alone, it need not wait long to call an election.
	mo.Raft = &manager.RaftOptions{ID: "dev", Addr: "127.0.0.1:0", Dir: filepath.Join(o.DataDir, "manager-raft"), Peers: []raftgroup.Peer{{ID: "dev"}},
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, LeaderLease: 100 * time.Millisecond}
	if o.Manager != nil {
		o.Manager(&mo)
	}
	c.managerOpts = mo
	if c.Manager, err = manager.Start(ctx, mo); err != nil {
		return nil, err
	}
	// Ready means acting: the manager leads and has read the repository.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err = c.Manager.WaitLeading(wctx)
	wcancel()
	if err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	ro := o.Router
	ro.Etcd, ro.Registry, ro.Cluster = c.Etcd, o.Registry, o.Cluster
	if c.Router, err = router.Start(ctx, ro); err != nil {
		return nil, err
	}
	return c, nil
}

// ManagerOptions are the options the cluster's manager was started
// with: a test restarting the manager starts it with these.
func (c *Cluster) ManagerOptions() manager.Options { return c.managerOpts }

// WaitReady waits until the router can serve every model, or ctx ends.
func (c *Cluster) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !c.Router.Ready() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("devcluster: not ready: %w (models: %+v)", ctx.Err(), c.Router.Models())
		case <-t.C:
		}
	}
	return nil
}

// AddShard starts shard number len(c.Shards), as Options describe it, and
// registers it: scaling out. Close stops it with the others.
func (c *Cluster) AddShard() (*shard.Shard, error) {
	s, err := c.startShard(len(c.Shards))
	if err != nil {
		return nil, err
	}
	c.Shards = append(c.Shards, s)
	return s, nil
}

// RestartShard crashes shard i (its registration stays until the new one
// takes it over: the manager sees no departure) and starts it again with
// the same options: it comes back empty, as a restarted process does, and
// loads what the serving map gives it.
func (c *Cluster) RestartShard(i int) (*shard.Shard, error) {
	c.Shards[i].Crash()
	s, err := c.startShard(i)
	if err != nil {
		return nil, err
	}
	c.Shards[i] = s
	return s, nil
}

func (c *Cluster) startShard(i int) (*shard.Shard, error) {
	so := shard.Options{ID: fmt.Sprintf("shard-%d", i), Repo: loader.Repo{Dir: c.opts.Repo}, Etcd: c.Etcd, Cluster: c.opts.Cluster,
		Build: c.opts.Build, Registry: c.opts.Registry, MemoryBudget: c.opts.MemoryBudget, DataDir: filepath.Join(c.opts.DataDir, fmt.Sprintf("shard-%d", i)),
		LoadTurn: c.loadTurn}
	if c.opts.Shard != nil {
		c.opts.Shard(i, &so)
	}
	return shard.Start(c.ctx, so)
}

// Close stops everything: the router, then the manager (so that it does
// not move the partitions of shards that are stopping anyway), then the
// shards, then etcd.
func (c *Cluster) Close() {
	if c.Router != nil {
		c.Router.Close()
	}
	if c.Manager != nil {
		c.Manager.Close()
	}
	for _, s := range c.Shards {
		s.Close()
	}
	c.cancel()
	if c.Etcd != nil {
		c.Etcd.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	if c.tmp != "" {
		os.RemoveAll(c.tmp)
	}
}
