package topo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
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
	subs    map[string]string // key suffix (after key + "/") → value
	lease   clientv3.LeaseID
	gen     uint64 // values Set so far
	written uint64 // the gen of the value last written
	held    bool   // the lease is alive, as far as this process knows
	changed chan struct{}
	wrote   chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	abandon atomic.Bool
	// inEtcd is what the current lease's writes put in etcd; the writing
	// goroutine's (establish, run) only.
	inEtcd struct {
		value string
		subs  map[string]string
	}
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
	r := &Registration{cli: cli, key: key, ttl: ttl, value: value, changed: make(chan struct{}, 1),
		wrote: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
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
	v, subs, gen := r.value, r.subs, r.gen
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
	// The records beside it go in transactions of their own (as many
	// as etcd's bounds need); until they are written, the registration
	// is not Current.
	r.inEtcd.value, r.inEtcd.subs = v, nil
	if len(subs) > 0 {
		if err = r.write(ctx, v, subs, lease.ID); err != nil {
			r.cli.Revoke(context.Background(), lease.ID)
			return nil, err
		}
	}
	ka, err := r.cli.KeepAlive(ctx, lease.ID)
	if err == nil {
		r.wroteValue(gen, true)
	}
	return ka, err
}

// SetReport replaces the registered value and the records kept beside it
// under the same lease (key + "/" + suffix → value; a suffix no longer
// given is deleted). Only what changed is written, in one transaction.
func (r *Registration) SetReport(value string, subs map[string]string) {
	r.mu.Lock()
	if value == r.value && maps.Equal(subs, r.subs) {
		r.mu.Unlock()
		return
	}
	r.value, r.subs = value, maps.Clone(subs)
	r.gen++
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// write puts what changed since the last write under lease. Records
// are grouped by what follows their first "/" (a shard's held/M and
// parts/M go together), and a transaction never splits a group (Txn).
func (r *Registration) write(ctx context.Context, v string, subs map[string]string, lease clientv3.LeaseID) error {
	var t Txn
	if v != r.inEtcd.value {
		if err := t.Put(r.key, []byte(v), clientv3.WithLease(lease)); err != nil {
			return err
		}
	}
	// A group's deletes before its puts; "parts" before "held" (a
	// reader pairs a new held record only with its partitions).
	groups := map[string][]string{} // group → keys to delete, then to put
	var order []string
	note := func(k string) {
		_, g, _ := strings.Cut(k, "/")
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], k)
	}
	for _, k := range slices.Sorted(maps.Keys(r.inEtcd.subs)) {
		if _, ok := subs[k]; !ok {
			note(k)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(subs), func(a, b string) int { return strings.Compare(recordOrder(a), recordOrder(b)) }) {
		if was, ok := r.inEtcd.subs[k]; !ok || was != subs[k] {
			note(k)
		}
	}
	for _, g := range order {
		end := t.Together()
		for _, k := range groups[g] {
			if val, ok := subs[k]; !ok {
				t.Delete(r.key + "/" + k)
			} else if err := t.Put(r.key+"/"+k, []byte(val), clientv3.WithLease(lease)); err != nil {
				end()
				return err
			}
		}
		end()
	}
	if len(t.Ops) == 0 {
		r.inEtcd.value, r.inEtcd.subs = v, subs
		return nil
	}
	if err := t.Each(func(batch []clientv3.Op) error {
		_, err := r.cli.Txn(ctx).Then(batch...).Commit()
		return err
	}); err != nil {
		r.unknown(subs)
		return err
	}
	r.inEtcd.value, r.inEtcd.subs = v, subs
	return nil
}

// recordOrder orders records by what follows their kind, and "held"
// after the others (a reader pairs a held record with its partitions).
func recordOrder(k string) string {
	kind, rest, _ := strings.Cut(k, "/")
	order := "0"
	if kind == "held" {
		order = "1"
	}
	return rest + "/" + order + kind
}

// unknown notes, after a write that failed part way, that etcd may hold
// any of what was there or what was being written: the next write puts
// every record and deletes every one no longer given.
func (r *Registration) unknown(subs map[string]string) {
	merged := maps.Clone(r.inEtcd.subs)
	if merged == nil {
		merged = map[string]string{}
	}
	for k := range subs {
		merged[k] = "\x00unknown"
	}
	r.inEtcd.value, r.inEtcd.subs = "\x00unknown", merged
}

// wroteValue notes that the value of generation gen is in etcd under a
// live lease (held) or that the lease is lost (!held).
func (r *Registration) wroteValue(gen uint64, held bool) {
	r.mu.Lock()
	r.held = held
	r.written = max(r.written, gen)
	r.mu.Unlock()
	select {
	case r.wrote <- struct{}{}:
	default:
	}
}

// Current reports whether etcd holds the value last Set, under a lease
// that is alive as far as this process knows: what others read of this
// registration is what it says now.
func (r *Registration) Current() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held && r.written == r.gen
}

// Held reports whether the lease is alive, as far as this process knows:
// some value of the registration is in etcd (Current: the last one Set).
func (r *Registration) Held() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held
}

// Wrote receives after each write of the key and when the lease is lost:
// the moments Current may change. For one reader.
func (r *Registration) Wrote() <-chan struct{} { return r.wrote }

// Abandon stops keeping the key alive without deleting it, as a crashed
// process would: the key stays until its lease runs out (or a new
// registration takes it over). For fault-injection tests.
func (r *Registration) Abandon() {
	r.abandon.Store(true)
	r.Close()
}

// retry asks run to write the value again.
func (r *Registration) retry() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// Set replaces the registered value. Setting the value it has already
// writes nothing: an idle process leaves etcd alone.
func (r *Registration) Set(value string) {
	r.mu.Lock()
	if value == r.value {
		r.mu.Unlock()
		return
	}
	r.value = value
	r.gen++
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *Registration) run(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer func() {
		r.wroteValue(0, false)
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
			r.wroteValue(0, false)
			for ctx.Err() == nil {
				var err error
				if ka, err = r.establish(ctx); err == nil {
					break
				}
				if ctx.Err() != nil {
					break
				}
				slog.Warn("topo: re-registering failed; retrying", "key", r.key, "err", err)
				sleep(ctx, time.Second)
			}
		case <-r.changed:
			r.mu.Lock()
			v, subs, lease, gen := r.value, r.subs, r.lease, r.gen
			r.mu.Unlock()
			if err := r.write(ctx, v, subs, lease); err != nil {
				if ctx.Err() == nil {
					slog.Warn("topo: updating registration failed", "key", r.key, "err", err)
					r.retry() // try again on the next turn
					sleep(ctx, 200*time.Millisecond)
				}
				continue
			}
			r.wroteValue(gen, true)
		}
	}
}
