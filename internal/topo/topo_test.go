package topo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/testenv"
)

// A registration is visible to a watcher, follows Set, and disappears
// when its owner stops.
func TestRegisterAndWatch(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snaps := make(chan map[string][]byte, 100)
	go Watch(ctx, cli, DefaultCluster.ShardsPrefix(), func(m map[string][]byte, _ int64) { snaps <- m })

	latest := func() map[string][]byte {
		var m map[string][]byte
		for {
			select {
			case m = <-snaps:
			default:
				return m
			}
		}
	}
	var last map[string][]byte
	waitFor := func(want string) {
		testenv.Eventually(t, 10*time.Second, func() error {
			if m := latest(); m != nil {
				last = m
			}
			if got := string(last[DefaultCluster.ShardKey("a")]); got != want {
				return fmt.Errorf("value %q, want %q", got, want)
			}
			return nil
		})
	}
	rctx, rcancel := context.WithCancel(ctx)
	r, err := Register(rctx, cli, DefaultCluster.ShardKey("a"), "one", 5)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("one")
	if !r.Current() {
		t.Error("Current is false right after Register")
	}
	r.Set("two")
	// Current turns true again once "two" is in etcd, and Wrote says when.
	deadline := time.After(10 * time.Second)
	for !r.Current() {
		select {
		case <-r.Wrote():
		case <-deadline:
			t.Fatal("Current still false 10s after Set")
		}
	}
	if resp, err := cli.Get(ctx, DefaultCluster.ShardKey("a")); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "two" {
		t.Fatalf("Current, but etcd holds %v (%v)", resp, err)
	}
	waitFor("two")
	rcancel()
	waitFor("")
	r.Close()
	if r.Current() {
		t.Error("Current is true after the registration stopped")
	}
}

// A key another live process holds is not taken over; once its holder
// is gone (its lease revoked), it can be.
func TestRegisterRefusesTakenKey(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx := context.Background()
	key := DefaultCluster.ShardKey("dup")
	first, err := Register(ctx, cli, key, "first", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Register(ctx, cli, key, "second", 1); !errors.Is(err, ErrTaken) || !strings.Contains(err.Error(), "first") {
		t.Fatalf("second registration: %v, want ErrTaken naming the holder", err)
	}
	resp, err := cli.Get(ctx, key)
	if err != nil || string(resp.Kvs[0].Value) != "first" {
		t.Fatalf("the key after the refused registration: %v", err)
	}
	first.Close()
	second, err := Register(ctx, cli, key, "second", 1)
	if err != nil {
		t.Fatal(err)
	}
	second.Close()
}

// WatchKeys holds only the keys it is told to keep, yet reports the
// revision of every change under the prefix.
func TestWatchKeysKeepsOnlyAsked(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type snap struct {
		kv  map[string][]byte
		rev int64
	}
	snaps := make(chan snap, 100)
	keep := func(k string) bool { return strings.HasPrefix(k, DefaultCluster.ShardsPrefix()) }
	go WatchKeys(ctx, cli, DefaultCluster.Prefix(), keep, func(kv map[string][]byte, rev int64) { snaps <- snap{kv, rev} })
	<-snaps
	if _, err := cli.Put(ctx, DefaultCluster.ShardKey("a"), "kept"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(ctx, DefaultCluster.ManagerPrefix()+"guard", "not kept")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		for {
			select {
			case s := <-snaps:
				if s.rev < resp.Header.Revision {
					continue
				}
				if len(s.kv) != 1 || string(s.kv[DefaultCluster.ShardKey("a")]) != "kept" {
					t.Fatalf("held %v, want only the shard key", s.kv)
				}
				return nil
			default:
				return errors.New("the second change not seen yet")
			}
		}
	})
}

// TestSetUnchangedWritesNothing: setting the value a registration holds
// writes nothing and leaves it current (a shard that sets its report on
// every pass must not write etcd, nor flip its readiness, while idle);
// a new value is written once.
func TestSetUnchangedWritesNothing(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := DefaultCluster.ShardKey("idle")
	r, err := Register(ctx, cli, key, "same", 5)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	revision := func() int64 {
		resp, err := cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if !r.Current() {
			return errors.New("the first value is not written yet")
		}
		return nil
	})
	before := revision()
	for range 100 {
		r.Set("same")
		if !r.Current() {
			t.Fatal("setting the same value made the registration not current")
		}
	}
	r.Set("new")
	testenv.Eventually(t, 10*time.Second, func() error {
		resp, err := cli.Get(context.Background(), key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "new" {
			return errors.New("the new value is not written yet")
		}
		return nil
	})
	if got := revision() - before; got != 1 {
		t.Errorf("100 sets of the same value and one of a new one made %d etcd revisions, want 1", got)
	}
}

// TestSetReportWritesWhatChanged: a registration's reports, more than
// one transaction holds, are written whole, under its lease; a change
// writes what changed and deletes what is no longer given; etcd then
// holds exactly the reports given.
func TestSetReportWritesWhatChanged(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := DefaultCluster.ShardKey("reporter")
	r, err := Register(ctx, cli, key, "v0", 5)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	subs := map[string]string{}
	for i := range 150 { // 300 records: three transactions
		subs[fmt.Sprintf("parts/m%03d", i)] = fmt.Sprint("p", i)
		subs[fmt.Sprintf("held/m%03d", i)] = fmt.Sprint("h", i)
	}
	holds := func(value string, subs map[string]string) error {
		resp, err := cli.Get(context.Background(), key, clientv3.WithPrefix())
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, kv := range resp.Kvs {
			if kv.Lease == 0 {
				return fmt.Errorf("%s is not under the lease", kv.Key)
			}
			got[strings.TrimPrefix(string(kv.Key), key)] = string(kv.Value)
		}
		want := map[string]string{"": value}
		for k, v := range subs {
			want["/"+k] = v
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("etcd holds %d records, want %d", len(got), len(want))
		}
		return nil
	}
	r.SetReport("v1", subs)
	testenv.Eventually(t, 10*time.Second, func() error { return holds("v1", subs) })
	next := maps.Clone(subs)
	delete(next, "parts/m007")
	delete(next, "held/m007")
	next["held/m100"] = "changed"
	next["parts/n000"], next["held/n000"] = "new", "new"
	before, _ := cli.Get(context.Background(), key)
	r.SetReport("v1", next)
	testenv.Eventually(t, 10*time.Second, func() error { return holds("v1", next) })
	after, _ := cli.Get(context.Background(), key)
	if n := after.Header.Revision - before.Header.Revision; n != 1 {
		t.Errorf("a change of five records took %d transactions, want 1", n)
	}
}
