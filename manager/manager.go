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
	written map[string]string
}

// Start begins managing. It returns at once.
func Start(ctx context.Context, opts Options) (*Manager, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &Manager{opts: opts, rescan: make(chan struct{}, 1), cancel: cancel, checked: map[string]error{}, written: map[string]string{}}
	shards := make(chan []string, 1)
	m.done.Add(2)
	go func() {
		defer m.done.Done()
		topo.Watch(ctx, opts.Etcd, topo.ShardsPrefix, func(kv map[string][]byte) {
			ids := make([]string, 0, len(kv))
			for k := range kv {
				ids = append(ids, topo.Suffix(k, topo.ShardsPrefix))
			}
			slices.Sort(ids)
			select {
			case <-shards:
			default:
			}
			shards <- ids
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

func (m *Manager) loop(ctx context.Context, shardsCh <-chan []string) {
	tick := time.NewTicker(m.opts.ScanInterval)
	defer tick.Stop()
	var shards []string
	for {
		select {
		case <-ctx.Done():
			return
		case ids := <-shardsCh:
			if slices.Equal(ids, shards) {
				continue
			}
			shards = ids
		case <-tick.C:
		case <-m.rescan:
		}
		models := m.scan()
		for _, a := range Assign(models, shards, m.opts.Replicas) {
			b, _ := json.Marshal(a)
			if m.written[a.Model] == string(b) {
				continue
			}
			if _, err := m.opts.Etcd.Put(ctx, topo.ModelKey(a.Model), string(b)); err != nil {
				slog.Error("manager: publishing assignment", "model", a.Model, "err", err)
				continue
			}
			m.written[a.Model] = string(b)
			slog.Info("manager: serving", "model", a.Model, "version", a.Version, "partitions", a.Partitions, "shards", len(shards))
		}
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
			key := fmt.Sprintf("%s/%d", name, vs[i])
			err, seen := m.checked[key]
			man, merr := m.opts.Repo.Manifest(name, vs[i])
			if !seen {
				err = merr
				if err == nil {
					err = m.opts.Repo.Verify(man)
				}
				m.checked[key] = err
				if err != nil {
					slog.Error("manager: version fails validation; not serving it", "model", name, "version", vs[i], "err", err)
				}
			}
			if err == nil && merr == nil {
				out = append(out, Model{Name: name, Version: vs[i], Partitions: man.Partitions})
				break
			}
		}
	}
	return out
}

// lastGood is what was last published, for when the repository cannot
// be read at all.
func (m *Manager) lastGood() []Model {
	var out []Model
	for _, name := range slices.Sorted(maps.Keys(m.written)) {
		var a topo.Assignment
		json.Unmarshal([]byte(m.written[name]), &a)
		out = append(out, Model{Name: a.Model, Version: a.Version, Partitions: a.Partitions})
	}
	return out
}
