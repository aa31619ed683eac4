package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
)

// Options configure a manager. Zero values mean the documented default.
type Options struct {
	// Repo is the model repository to serve from; required.
	Repo loader.Repo
	// Etcd is the cluster store; required.
	Etcd *clientv3.Client
	// Replicas is how many shards hold each partition. Default 1.
	Replicas int
	// ScanInterval is how often the repository is scanned for new
	// versions. Default 10s.
	ScanInterval time.Duration
}

// Validate checks required fields and fills defaults.
func (o *Options) Validate() error {
	switch {
	case o.Repo.Dir == "":
		return errors.New("manager: Options.Repo is required")
	case o.Etcd == nil:
		return errors.New("manager: Options.Etcd is required")
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.ScanInterval == 0 {
		o.ScanInterval = 10 * time.Second
	}
	return nil
}

// Manager publishes the serving map: for every model in the repository,
// the newest version that passes validation, spread over the live shards.
type Manager struct {
	opts    Options
	rescan  chan struct{}
	cancel  context.CancelFunc
	done    sync.WaitGroup
	checked map[string]error // "model/version" → validation result; loop goroutine only
	// published is each model's assignment as last written (or read back
	// at start): its Live is the committed version.
	published map[string]topo.Assignment
}

// Start begins managing. It returns at once.
func Start(ctx context.Context, opts Options) (*Manager, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	// A restarted manager carries on from the published assignments: what
	// is committed stays committed.
	resp, err := opts.Etcd.Get(ctx, topo.ModelsPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("manager: reading assignments: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &Manager{opts: opts, rescan: make(chan struct{}, 1), cancel: cancel, checked: map[string]error{},
		published: map[string]topo.Assignment{}}
	for _, kv := range resp.Kvs {
		a, err := topo.Decode[topo.Assignment](string(kv.Key), kv.Value)
		if err != nil {
			continue
		}
		m.published[a.Model] = a
	}
	shards := make(chan map[string]topo.ShardInfo, 1)
	m.done.Add(2)
	go func() {
		defer m.done.Done()
		topo.Watch(ctx, opts.Etcd, topo.ShardsPrefix, func(kv map[string][]byte) {
			infos := topo.DecodeAll[topo.ShardInfo](kv, topo.ShardsPrefix)
			select {
			case <-shards:
			default:
			}
			shards <- infos
		})
	}()
	go func() {
		defer m.done.Done()
		m.loop(ctx, shards)
	}()
	return m, nil
}

// Rescan asks for a repository scan now.
func (m *Manager) Rescan() {
	select {
	case m.rescan <- struct{}{}:
	default:
	}
}

// Close stops the manager. The serving map stays as last written.
func (m *Manager) Close() {
	m.cancel()
	m.done.Wait()
}

func (m *Manager) loop(ctx context.Context, shardsCh <-chan map[string]topo.ShardInfo) {
	tick := time.NewTicker(m.opts.ScanInterval)
	defer tick.Stop()
	var shards map[string]topo.ShardInfo
	for {
		select {
		case <-ctx.Done():
			return
		case shards = <-shardsCh:
		case <-tick.C:
		case <-m.rescan:
		}
		m.publish(ctx, shards)
	}
}

// maxTxnOps is etcd's default limit on operations in one transaction.
const maxTxnOps = 128

// publish writes the assignments of this pass that changed. They go in
// one etcd transaction (up to maxTxnOps models), so a router sees the
// whole serving map change at once: never one model's new assignment
// without another's.
func (m *Manager) publish(ctx context.Context, shards map[string]topo.ShardInfo) {
	models := m.scan()
	ids := slices.Sorted(maps.Keys(shards))
	var changed []topo.Assignment
	var vals []string
	for _, a := range Assign(models, ids, m.opts.Replicas) {
		prev := m.published[a.Model]
		a.Live = prev.Live
		if a.Live != a.Version && Ready(a, shards) {
			a.Live = a.Version // commit: every replica holds the new version
		}
		a = Handover(a, prev, shards)
		b, _ := json.Marshal(a)
		if was, _ := json.Marshal(prev); string(was) == string(b) {
			continue
		}
		changed, vals = append(changed, a), append(vals, string(b))
	}
	for len(changed) > 0 {
		n := min(len(changed), maxTxnOps)
		ops := make([]clientv3.Op, n)
		for i := range n {
			ops[i] = clientv3.OpPut(topo.ModelKey(changed[i].Model), vals[i])
		}
		if _, err := m.opts.Etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
			slog.Error("manager: publishing assignments", "models", n, "err", err)
			return
		}
		for _, a := range changed[:n] {
			if a.Live != m.published[a.Model].Live {
				slog.Info("manager: committed", "model", a.Model, "version", a.Live)
			}
			m.published[a.Model] = a
			slog.Info("manager: assigned", "model", a.Model, "version", a.Version, "live", a.Live, "partitions", a.Partitions, "shards", len(shards))
		}
		changed, vals = changed[n:], vals[n:]
	}
}

// scan lists, per model, the newest version that passes the validation
// gate: a valid manifest and every file matching its checksums. A version
// that fails is logged once and skipped, so the previous one keeps serving.
func (m *Manager) scan() []Model {
	names, err := m.opts.Repo.Models()
	if err != nil {
		slog.Error("manager: scanning repository", "err", err)
		return m.lastGood()
	}
	var out []Model
	for _, name := range names {
		vs, err := m.opts.Repo.Versions(name)
		if err != nil {
			continue
		}
		for i := len(vs) - 1; i >= 0; i-- {
			// A delta is servable when it and every version under it, down
			// to a full version, pass.
			chain, err := m.opts.Repo.Chain(name, vs[i])
			for _, man := range chain {
				if err != nil {
					break
				}
				err = m.validate(man)
			}
			if err == nil {
				out = append(out, Model{Name: name, Version: vs[i], Partitions: chain[0].Partitions})
				break
			}
		}
	}
	return out
}

// validate checks one version's files, once: results are cached, and a
// failure is logged the first time.
func (m *Manager) validate(man *codec.Manifest) error {
	key := fmt.Sprintf("%s/%d", man.Name, man.Version)
	err, seen := m.checked[key]
	if !seen {
		err = m.opts.Repo.Verify(man)
		m.checked[key] = err
		if err != nil {
			slog.Error("manager: version fails validation; not serving it", "model", man.Name, "version", man.Version, "err", err)
		}
	}
	return err
}

// lastGood is what was last published, for when the repository cannot
// be read at all.
func (m *Manager) lastGood() []Model {
	var out []Model
	for _, name := range slices.Sorted(maps.Keys(m.published)) {
		a := m.published[name]
		out = append(out, Model{Name: a.Model, Version: a.Version, Partitions: a.Partitions})
	}
	return out
}
