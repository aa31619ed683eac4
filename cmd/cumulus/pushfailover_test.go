package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/pushpb"
)

// TestPushFailover: three manager processes in a raft group, each with a
// push API; two shards, two routers under load. A client pushes batches
// through `cumulus push`'s pusher, which sends whatever was not answered
// again, to the next address, when a stream fails. The leader is killed
// with SIGKILL while batches are in flight. Followers answer
// Unavailable naming the leader; pushes resume under the new leader;
// every batch is answered, and both routers then serve exactly the
// values of the last batch to set each key: no batch was lost, and none
// was applied again after a later one. No predict fails.
func TestPushFailover(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "100000", "--partitions", "8").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	bias := func() float64 {
		vs, _ := (loader.Repo{Dir: repo}).Versions("ctr")
		m, err := (loader.Repo{Dir: repo}).Manifest("ctr", vs[0])
		if err != nil {
			t.Fatal(err)
		}
		return m.Bias
	}()
	cli := testenv.Etcd(t)
	common := []string{"--etcd", cli.Endpoints()[0], "--log-level", "info"}
	for _, id := range []string{"s0", "s1"} {
		startProcess(t, []string{"shard " + id + " serving on "}, append([]string{"shard", "--id", id, "--repo", repo, "--addr", "127.0.0.1:0",
			"--data-dir", filepath.Join(dir, id)}, common...)...)
	}
	raftAddrs := freeAddrs(t, 3)
	var peers []string
	for i, a := range raftAddrs {
		peers = append(peers, fmt.Sprintf("m%d=%s", i, a))
	}
	managers := map[string]*process{}
	pushAddrs := map[string]string{}
	var addrs []string
	for i, a := range raftAddrs {
		id := fmt.Sprintf("m%d", i)
		managers[id] = startProcess(t, []string{"admin: http://", "push: http://", "raft: "}, append([]string{"manager", "--repo", repo,
			"--admin-addr", "127.0.0.1:0", "--admin-token", "admin-t", "--push-addr", "127.0.0.1:0", "--push-token", "push-t",
			"--raft-id", id, "--raft-addr", a, "--raft-dir", filepath.Join(dir, id), "--raft-peers", strings.Join(peers, ",")}, common...)...)
		pushAddrs[id] = managers[id].out["push: http://"]
		addrs = append(addrs, pushAddrs[id])
	}
	var fronts []string
	for range 2 {
		rt := startProcess(t, []string{"http: http://", "grpc: "}, append([]string{"router", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, common...)...)
		waitRouterReady(t, rt.out["http: http://"])
		fronts = append(fronts, rt.out["http: http://"])
		load := startCheckedLoad(t, rt.out["grpc: "], 2)
		t.Cleanup(func() {
			load.halt()
			if n := load.failed.Load(); n > 0 {
				t.Errorf("%d predicts failed during the pushes; first: %v", n, load.first.Load())
			}
		})
	}

	// The leader: the one manager whose push API does not answer 503.
	leader := func() string {
		var l string
		testenv.Eventually(t, 30*time.Second, func() error {
			for id, a := range pushAddrs {
				if managers[id].cmd.ProcessState != nil {
					continue
				}
				req, _ := http.NewRequest("POST", "http://"+a+"/push/v1/models/ctr", strings.NewReader(`{"parameters":{"producer":"probe","sequence":1}}`))
				req.Header.Set("Authorization", "Bearer push-t")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable {
					l = id
					return nil
				}
			}
			return fmt.Errorf("no manager's push API leads")
		})
		return l
	}
	l := leader()
	for id, a := range pushAddrs { // a follower names the leader
		if id == l {
			continue
		}
		req, _ := http.NewRequest("POST", "http://"+a+"/push/v1/models/ctr", strings.NewReader(`{"parameters":{"producer":"probe","sequence":2}}`))
		req.Header.Set("Authorization", "Bearer push-t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4096)
		n, _ := resp.Body.Read(b)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b[:n]), "the leader is "+l) {
			t.Fatalf("follower %s: %s %s; want 503 naming leader %s", id, resp.Status, b[:n], l)
		}
		break
	}

	// Batch b (1..n) sets key base+b to b/64, and the shared key to b:
	// the shared key ends as the last batch's only if no earlier batch
	// was applied again after it.
	const n, base, shared = 60, 1 << 40, 1<<40 - 1
	batches := make([]*pushpb.Batch, n)
	for i := range batches {
		b := uint64(i + 1)
		batches[i] = &pushpb.Batch{Model: "ctr", Producer: "trainer-0", Sequence: b, Ids: []uint64{base + b, shared}, Values: []float32{float32(b) / 64, float32(b) / 8}}
	}
	var mu sync.Mutex
	var acks []time.Time
	p := &pusher{addrs: addrs, token: "push-t", retryFor: time.Minute, acked: func(*pushpb.Ack) {
		mu.Lock()
		acks = append(acks, time.Now())
		mu.Unlock()
	}}
	// The first 20, answered; then the rest, a batch every 50 ms, with
	// the leader killed once a few more are answered.
	ctx := context.Background()
	if _, err := p.push(ctx, batches[:20]); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var err error
		for i := 20; i < n && err == nil; i += 5 {
			_, err = p.push(ctx, batches[i:i+5])
			time.Sleep(50 * time.Millisecond)
		}
		done <- err
	}()
	testenv.Eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(acks) < 25 {
			return fmt.Errorf("%d batches answered", len(acks))
		}
		return nil
	})
	killed := time.Now()
	managers[l].cmd.Process.Signal(syscall.SIGKILL)
	<-managers[l].exited
	if err := <-done; err != nil {
		t.Fatalf("pushing across the failover: %v", err)
	}
	mu.Lock()
	var resumed time.Duration
	for _, at := range acks {
		if at.After(killed) {
			resumed = at.Sub(killed)
			break
		}
	}
	mu.Unlock()
	next := leader()
	t.Logf("leader %s killed; %s leads; the first batch answered after the kill came %s after it", l, next, resumed.Round(time.Millisecond))

	want := map[int64]float64{int64(shared): float64(n) / 8}
	for b := 1; b <= n; b++ {
		want[int64(base+b)] = float64(b) / 64
	}
	var ids []int64
	for id := range want {
		ids = append(ids, id)
	}
	for _, front := range fronts {
		testenv.Eventually(t, 30*time.Second, func() error {
			_, s := oneFeatureScores(t, front, "ctr", ids)
			for i, id := range ids {
				if w := float32(1 / (1 + math.Exp(-(bias + want[id])))); math.Abs(float64(s[i]-w)) > 1e-6 {
					return fmt.Errorf("router %s: id %d scores %v, want %v (weight %v)", front, id, s[i], w, want[id])
				}
			}
			return nil
		})
	}
}
