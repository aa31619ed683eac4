package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/manager"
)

// freeAddrs picks n loopback addresses no one listens on now (for a raft
// group whose members must know each other's addresses before they
// start).
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	var held []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range held {
		l.Close()
	}
	return addrs
}

// TestRaftManagerFailover: three manager processes in a raft group, two
// shards (replicas 2), a router under load. A version starts rolling out
// (shards loading it slowly); an admin change is acknowledged; the
// leading manager is killed with SIGKILL. Another leads, publishes under
// a newer term, finishes the rollout; no request fails and the
// acknowledged change is there.
func TestRaftManagerFailover(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	gen := func() {
		if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "400000", "--partitions", "4").CombinedOutput(); err != nil {
			t.Fatalf("model gen: %v\n%s", err, b)
		}
	}
	gen()
	cli := testenv.Etcd(t)
	common := []string{"--etcd", cli.Endpoints()[0], "--log-level", "info"}
	for _, id := range []string{"s0", "s1"} {
		// Once serving, a shard loads 1 MiB a second: a new version
		// (4.8 MB, two replicas) takes a few seconds to roll out.
		startProcess(t, []string{"shard " + id + " serving on "}, append([]string{"shard", "--id", id, "--repo", repo, "--addr", "127.0.0.1:0",
			"--data-dir", filepath.Join(dir, id), "--load-rate", "1MiB"}, common...)...)
	}
	raftAddrs := freeAddrs(t, 3)
	var peers []string
	for i, a := range raftAddrs {
		peers = append(peers, fmt.Sprintf("m%d=%s", i, a))
	}
	managers := map[string]*process{}
	admins := map[string]string{}
	for i, a := range raftAddrs {
		id := fmt.Sprintf("m%d", i)
		managers[id] = startProcess(t, []string{"admin: http://", "raft: "}, append([]string{"manager", "--repo", repo, "--replicas", "2",
			"--admin-addr", "127.0.0.1:0", "--admin-token", "t", "--raft-id", id, "--raft-addr", a, "--raft-dir", filepath.Join(dir, id),
			"--raft-peers", strings.Join(peers, ",")}, common...)...)
		admins[id] = managers[id].out["admin: http://"]
	}
	admin := func(id string, args ...string) (string, error) {
		out, err := cumulus(append(append([]string{"admin"}, args...), "--addr", admins[id], "--admin-token", "t")...).CombinedOutput()
		return string(out), err
	}
	// leader asks each live manager which member leads.
	leader := func() string {
		var l string
		testenv.Eventually(t, 30*time.Second, func() error {
			for id, p := range managers {
				if p.cmd.ProcessState != nil {
					continue
				}
				out, err := admin(id, "managers")
				if err != nil {
					continue
				}
				for _, line := range strings.Split(out, "\n") {
					if f := strings.Fields(line); len(f) >= 4 && f[3] == "leader" {
						l = f[0]
						return nil
					}
				}
			}
			return fmt.Errorf("no manager names a leader")
		})
		return l
	}
	l := leader()
	rt := startProcess(t, []string{"http: http://", "grpc: "}, append([]string{"router", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, common...)...)
	waitRouterReady(t, rt.out["http: http://"])
	load := startCheckedLoad(t, rt.out["grpc: "], 4)
	load.await(t, 100)

	// The console: a follower's names the leader and links to its
	// console; the leader's shows the router's traffic, read from the
	// metrics address the router registered.
	consoleView := func(id string) manager.ConsoleView {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+admins[id]+"/admin/v1/console", nil)
		req.Header.Set("Authorization", "Bearer t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v manager.ConsoleView
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for id := range managers {
		if id == l {
			continue
		}
		testenv.Eventually(t, 10*time.Second, func() error {
			v := consoleView(id)
			if v.Manager.Leading || v.Manager.Leader != l || v.Manager.LeaderAdmin != "http://"+admins[l]+"/console/" || len(v.Members) != 3 {
				return fmt.Errorf("follower %s's console: %+v, %d members; want leader %s at http://%s/console/", id, v.Manager, len(v.Members), l, admins[l])
			}
			return nil
		})
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		v := consoleView(l)
		if len(v.Routers) != 1 || v.Routers[0].Metrics != "http://"+rt.out["http: http://"]+"/metrics" {
			return fmt.Errorf("routers %+v", v.Routers)
		}
		if len(v.Traffic) == 0 || v.Traffic[0].Model != "ctr" || v.Traffic[0].QPS <= 0 || v.Traffic[0].P99 <= 0 {
			return fmt.Errorf("traffic %+v", v.Traffic)
		}
		return nil
	})

	// An acknowledged change, then a rollout under way.
	if out, err := admin(l, "cordon", "ghost"); err != nil {
		t.Fatalf("cordon: %v\n%s", err, out)
	}
	gen() // version 2
	if out, err := admin(l, "rescan"); err != nil {
		t.Fatalf("rescan: %v\n%s", err, out)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		out, err := admin(l, "models")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 3 && f[0] == "ctr" && f[1] == "1" && f[3] == "2" {
				return nil
			}
		}
		return fmt.Errorf("version 2 not staging yet: %v\n%s", err, out)
	})
	ctx := context.Background()
	term := func() string {
		resp, err := cli.Get(ctx, topo.DefaultCluster.ManagerPrefix()+"term")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("the fence: %v", err)
		}
		return string(resp.Kvs[0].Value)
	}
	before := term()
	watch := cli.Watch(ctx, topo.DefaultCluster.ManagerPrefix()+"term", clientv3.WithRev(0))
	killed := time.Now()
	managers[l].cmd.Process.Signal(syscall.SIGKILL)
	<-managers[l].exited
	var published time.Duration
	for published == 0 {
		select {
		case wr := <-watch:
			for _, ev := range wr.Events {
				if string(ev.Kv.Value) > before {
					published = time.Since(killed)
				}
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no newer term published the map within 30 s of the kill")
		}
	}
	next := leader()
	t.Logf("leader %s killed; %s leads, the map published under its term %v after the kill", l, next, published.Round(time.Millisecond))
	testenv.Eventually(t, 60*time.Second, func() error {
		out, err := admin(next, "models")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "ctr" && f[1] == "2" {
				return nil
			}
		}
		return fmt.Errorf("version 2 not live yet: %v\n%s", err, out)
	})
	if out, err := admin(next, "shards"); err != nil || !strings.Contains(out, "ghost") {
		t.Fatalf("the cordon acknowledged before the kill is gone: %v\n%s", err, out)
	}
	if out, err := admin(next, "audit"); err != nil || !strings.Contains(out, "cordon") {
		t.Fatalf("the audit log lost the cordon: %v\n%s", err, out)
	}
	// The killed manager comes back from its directory and follows.
	restart := func(id string, args ...string) {
		managers[id] = startProcess(t, []string{"admin: http://", "raft: "}, append(append([]string{"manager", "--repo", repo, "--replicas", "2",
			"--admin-addr", "127.0.0.1:0", "--admin-token", "t", "--raft-id", id}, args...), common...)...)
		admins[id] = managers[id].out["admin: http://"]
	}
	i := strings.TrimPrefix(l, "m")
	restart(l, "--raft-addr", raftAddrs[i[0]-'0'], "--raft-dir", filepath.Join(dir, l), "--raft-peers", strings.Join(peers, ","))
	holds := func(id, shard string) error {
		out, err := admin(id, "shards")
		if err != nil || !strings.Contains(out, shard) {
			return fmt.Errorf("%s does not hold the cordon of %s: %v\n%s", id, shard, err, out)
		}
		return nil
	}
	testenv.Eventually(t, 30*time.Second, func() error { return holds(l, "ghost") })

	// The leader is frozen (SIGSTOP: cut off, as by a partition): another
	// leads and decides; thawed, the old one follows, and what it may
	// still try to publish is fenced off.
	frozen := leader()
	managers[frozen].cmd.Process.Signal(syscall.SIGSTOP)
	var third string
	testenv.Eventually(t, 30*time.Second, func() error {
		for id := range managers {
			if id == frozen || managers[id].cmd.ProcessState != nil {
				continue
			}
			if out, err := admin(id, "cordon", "ghost2"); err == nil {
				third = id
				return nil
			} else if !strings.Contains(out, "503") {
				return fmt.Errorf("cordon through %s: %v\n%s", id, err, out)
			}
		}
		return fmt.Errorf("no manager but the frozen %s acknowledges a change", frozen)
	})
	managers[frozen].cmd.Process.Signal(syscall.SIGCONT)
	for id := range managers {
		testenv.Eventually(t, 30*time.Second, func() error { return holds(id, "ghost2") })
	}
	if out, _ := admin(frozen, "cordon", "ghost3"); !strings.Contains(out, "503") || !strings.Contains(out, "the leader is "+third) {
		t.Fatalf("the thawed manager, asked for a change: %s", out)
	}

	// Membership: a fourth manager joins through the leader and catches
	// up; it is then removed.
	m3 := freeAddrs(t, 1)[0]
	// Refused: an ID already in the group, and an address where no
	// manager waits to join (a typo, another service).
	for _, bad := range [][]string{{third, m3}, {"m9", cli.Endpoints()[0][len("http://"):]}} {
		if out, err := admin(third, "managers", "add", bad[0], bad[1]); err == nil || !strings.Contains(out, "409") {
			t.Fatalf("managers add %s %s: %v\n%s", bad[0], bad[1], err, out)
		}
	}
	restart("m3", "--raft-addr", m3, "--raft-dir", filepath.Join(dir, "m3"))
	// m3 says it waits to join (its record in etcd) shortly after it
	// prints its addresses: until then the add is refused, 409.
	testenv.Eventually(t, 30*time.Second, func() error {
		out, err := admin(third, "managers", "add", "m3", m3)
		switch {
		case err != nil && strings.Contains(out, "start it first"):
			return fmt.Errorf("m3 not waiting to join yet: %s", out)
		case err != nil || !strings.Contains(out, "m3"):
			t.Fatalf("managers add: %v\n%s", err, out)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, func() error { return holds("m3", "ghost2") })
	if out, err := admin(third, "managers", "remove", "m3"); err != nil || strings.Contains(out, "m3 ") {
		t.Fatalf("managers remove: %v\n%s", err, out)
	}
	if out, err := admin(third, "managers", "remove", "nobody"); err == nil || !strings.Contains(out, "404") {
		t.Fatalf("managers remove nobody: %v\n%s", err, out)
	}
	if out, _ := admin(third, "audit"); strings.Contains(out, "nobody") {
		t.Fatalf("a refused removal was audited:\n%s", out)
	}
	// Three members, each reporting the same term.
	var out string
	testenv.Eventually(t, 20*time.Second, func() error {
		var err error
		out, err = admin(third, "managers")
		terms := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
			if f := strings.Fields(line); len(f) == 6 {
				terms[f[4]] = true
			}
		}
		if err != nil || strings.Count(out, "\n") != 4 || len(terms) != 1 {
			return fmt.Errorf("three members reporting one term? %v\n%s", err, out)
		}
		return nil
	})
	t.Logf("cumulus admin managers:\n%s", out)
	// A leader stopped (SIGTERM, as a rolling update does) hands the lead
	// over first: the next publishes without an election timeout.
	before = term()
	watch = cli.Watch(ctx, topo.DefaultCluster.ManagerPrefix()+"term", clientv3.WithRev(0))
	stopping := leader()
	stopped := time.Now()
	managers[stopping].stop(t)
	published = 0
	for published == 0 {
		select {
		case wr := <-watch:
			for _, ev := range wr.Events {
				if string(ev.Kv.Value) > before {
					published = time.Since(stopped)
				}
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no newer term published the map within 30 s of the stop")
		}
	}
	t.Logf("leader %s stopped with SIGTERM; the map published under the next term %v after", stopping, published.Round(time.Millisecond))
	load.await(t, 100)
	load.halt()
	t.Logf("%d requests answered, %d failed", load.ok.Load(), load.failed.Load())
	if n := load.failed.Load(); n > 0 {
		t.Fatalf("%d requests failed; the first: %v", n, load.first.Load())
	}
}
