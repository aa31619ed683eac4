package topo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Registration keeps one key alive under a lease for as long as its
// process lives: if the process dies, etcd deletes the key after the TTL.
// Set may be called at any time from any goroutine; the newest value is
// (re)written whenever the lease is (re)established.
type Registration struct {
	cli *clientv3.Client
	key string
	ttl int64

	mu      sync.Mutex
	value   string
	lease   clientv3.LeaseID
	changed chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	abandon atomic.Bool
}

// ErrTaken is returned when the key is registered by another process.
var ErrTaken = errors.New("topo: the key is registered by another live process")

// Register starts keeping key alive with the given TTL in seconds. The
// key is written by the time Register returns, or an error is returned.
// A key another process holds is never overwritten: Register waits up to
// two TTLs for it to go (a crashed predecessor's lease running out), then
// fails with ErrTaken.
func Register(ctx context.Context, cli *clientv3.Client, key, value string, ttl int64) (*Registration, error) {
	ctx, cancel := context.WithCancel(ctx)
	r := &Registration{cli: cli, key: key, ttl: ttl, value: value, changed: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	giveUp := time.Now().Add(2 * time.Duration(ttl) * time.Second)
	ka, err := r.establish(ctx)
	for errors.Is(err, ErrTaken) && time.Now().Before(giveUp) {
		slog.Warn("topo: key registered by another process; waiting for it to go", "key", key, "err", err)
		sleep(ctx, 500*time.Millisecond)
		ka, err = r.establish(ctx)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	go func() { defer close(r.done); r.run(ctx, ka) }()
	return r, nil
}

// Close revokes the lease, deleting the key now rather than after the
// TTL, and returns once that is done (or has failed).
func (r *Registration) Close() {
	r.cancel()
	<-r.done
}

func (r *Registration) establish(ctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	lease, err := r.cli.Grant(ctx, r.ttl)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.lease = lease.ID
	v := r.value
	r.mu.Unlock()
	resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)).
		Then(clientv3.OpPut(r.key, v, clientv3.WithLease(lease.ID))).Else(clientv3.OpGet(r.key)).Commit()
	if err == nil && !resp.Succeeded {
		err = fmt.Errorf("%w: %s", ErrTaken, r.key)
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			err = fmt.Errorf("%w: %s = %.200s", ErrTaken, r.key, kvs[0].Value)
		}
	}
	if err != nil {
		r.cli.Revoke(context.Background(), lease.ID)
		return nil, err
	}
	return r.cli.KeepAlive(ctx, lease.ID)
}

// Abandon stops keeping the key alive without deleting it, as a crashed
// process would: the key stays until its lease runs out (or a new
// registration takes it over). For fault-injection tests.
func (r *Registration) Abandon() {
	r.abandon.Store(true)
	r.Close()
}

// Set replaces the registered value.
func (r *Registration) Set(value string) {
	r.mu.Lock()
	r.value = value
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *Registration) run(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer func() {
		if r.abandon.Load() {
			return
		}
		// Leave at once rather than after the TTL.
		r.mu.Lock()
		lease := r.lease
		r.mu.Unlock()
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r.cli.Revoke(c, lease)
		cancel()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ka:
			if ok {
				continue
			}
			for ctx.Err() == nil {
				var err error
				if ka, err = r.establish(ctx); err == nil {
					break
				}
				slog.Warn("topo: re-registering failed; retrying", "key", r.key, "err", err)
				sleep(ctx, time.Second)
			}
		case <-r.changed:
			r.mu.Lock()
			v, lease := r.value, r.lease
			r.mu.Unlock()
			if _, err := r.cli.Put(ctx, r.key, v, clientv3.WithLease(lease)); err != nil && ctx.Err() == nil {
				slog.Warn("topo: updating registration failed", "key", r.key, "err", err)
				r.Set(v) // try again on the next turn
				sleep(ctx, 200*time.Millisecond)
			}
		}
	}
}
