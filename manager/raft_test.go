package manager_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/raftgroup"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
)

// raftManager starts a manager that is member id of a raft group, its
// data in dir/id.
func raftManager(t *testing.T, cli *clientv3.Client, repo loader.Repo, dir, id, addr string, peers []raftgroup.Peer) *manager.Manager {
	t.Helper()
	m, err := manager.Start(context.Background(), manager.Options{Repo: repo, Etcd: cli, ScanInterval: time.Hour, Replicas: 2,
		Raft: &manager.RaftOptions{ID: id, Addr: addr, Dir: filepath.Join(dir, id), Peers: peers}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// raftTrio starts managers a, b and c in dir as one group: a bootstraps
// it alone and adds the others; it returns once each knows all three.
func raftTrio(t *testing.T, cli *clientv3.Client, repo loader.Repo, dir string) (a, b, c *manager.Manager) {
	t.Helper()
	a = raftManager(t, cli, repo, dir, "a", "127.0.0.1:0", []raftgroup.Peer{{ID: "a"}})
	leaderOf(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b = raftManager(t, cli, repo, dir, "b", "127.0.0.1:0", nil)
	c = raftManager(t, cli, repo, dir, "c", "127.0.0.1:0", nil)
	for _, m := range []*manager.Manager{b, c} {
		if err := a.Group().Add(ctx, m.Group().ID(), m.Group().Addr()); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, m := range []*manager.Manager{a, b, c} {
			if ms, err := m.Group().Members(); err != nil || len(ms) != 3 {
				return fmt.Errorf("%s knows %d members (%v)", m.Group().ID(), len(ms), err)
			}
		}
		return nil
	})
	return a, b, c
}

func leaderOf(t *testing.T, ms ...*manager.Manager) *manager.Manager {
	t.Helper()
	var l *manager.Manager
	testenv.Eventually(t, 20*time.Second, func() error {
		l = nil
		for _, m := range ms {
			if m != nil && m.Leading() {
				if l != nil {
					return errors.New("two leading")
				}
				l = m
			}
		}
		if l == nil {
			return errors.New("none leads")
		}
		return nil
	})
	return l
}

// TestRaftManagers: three managers in a raft group. One leads and
// publishes the map; the others follow its state and refuse changes,
// naming it; an admin change is in every member's state once answered.
// The leader stops: another takes over, publishes under a newer term
// (the old one could no longer publish), and carries on from the state
// the old one left; the old one comes back from its directory as a
// follower.
func TestRaftManagers(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	fakeShards(t, cli, "s0", "s1", "s2")
	dir := t.TempDir()
	a, b, c := raftTrio(t, cli, repo, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testenv.Eventually(t, 30*time.Second, func() error {
		if ms := a.State().Models["m"]; ms == nil || ms.Live != 1 {
			return errors.New("version 1 not live")
		}
		return nil
	})
	if _, err := repo.Publish("m", lrModel(2), 4, ""); err != nil {
		t.Fatal(err)
	}
	a.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 2 || len(got.Replicas[0]) != 2 {
			return fmt.Errorf("published live %d replicas %v", got.Live, got.Replicas)
		}
		return nil
	})
	// A rollback, answered once committed: every member holds it.
	if _, err := a.Do(ctx, manager.Command{Op: manager.OpRollback, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*manager.Manager{a, b, c} {
		testenv.Eventually(t, 10*time.Second, func() error {
			if ms := m.State().Models["m"]; ms == nil || ms.Pin != 1 {
				return fmt.Errorf("%s: not pinned to 1", m.Group().ID())
			}
			return nil
		})
	}
	_, err := b.Do(ctx, manager.Command{Op: manager.OpUnpin, Model: "m"})
	if !errors.Is(err, manager.ErrNotLeader) || !strings.Contains(err.Error(), "the leader is a") {
		t.Fatalf("a change asked of a follower: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 1 {
			return fmt.Errorf("published live %d", got.Live)
		}
		return nil
	})
	termKey := topo.DefaultCluster.ManagerPrefix() + "term"
	resp, err := cli.Get(ctx, termKey)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the fence: %v %v", resp, err)
	}
	before := string(resp.Kvs[0].Value)

	// The leader stops: another takes over from its state.
	addrA := a.Group().Addr()
	stopped := time.Now()
	a.Close()
	l := leaderOf(t, b, c)
	t.Logf("%s leads %v after the leader stopped", l.Group().ID(), time.Since(stopped).Round(time.Millisecond))
	resp, err = cli.Get(ctx, termKey)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) <= before {
		t.Fatalf("the fence after the takeover: %v (was %s)", resp.Kvs, before)
	}
	if _, err := l.Do(ctx, manager.Command{Op: manager.OpUnpin, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 2 {
			return fmt.Errorf("published live %d", got.Live)
		}
		return nil
	})
	entries := l.State()
	if ms := entries.Models["m"]; ms.Pin != 0 {
		t.Fatalf("the new leader's state: pin %d", ms.Pin)
	}
	// The old leader comes back, follows.
	a = raftManager(t, cli, repo, dir, "a", addrA, []raftgroup.Peer{{ID: "a"}})
	testenv.Eventually(t, 20*time.Second, func() error {
		if ms := a.State().Models["m"]; ms == nil || ms.Pin != 0 || ms.Live != 2 {
			return errors.New("the restarted member has not caught up")
		}
		return nil
	})
	if a.Leading() && l.Leading() {
		t.Fatal("two leaders")
	}
}

// TestRaftPartitionedLeader: the leader is cut off from the others (a
// transport fault injected on purpose). It stops leading within its
// lease; another leads and publishes under a newer term; a change asked
// of the cut-off one is refused. Joined again, it follows and holds what
// was decided without it.
func TestRaftPartitionedLeader(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	fakeShards(t, cli, "s0", "s1", "s2")
	dir := t.TempDir()
	a, b, c := raftTrio(t, cli, repo, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 1 {
			return fmt.Errorf("published live %d", got.Live)
		}
		return nil
	})
	fenced := func() string {
		resp, err := cli.Get(ctx, topo.DefaultCluster.ManagerPrefix()+"term")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("the fence: %v", err)
		}
		return string(resp.Kvs[0].Value)
	}
	before := fenced()

	cut := time.Now()
	a.Group().SetPartitioned(true)
	testenv.Eventually(t, 10*time.Second, func() error {
		if a.Leading() {
			return errors.New("the cut-off leader still leads")
		}
		return nil
	})
	stepped := time.Since(cut)
	l := leaderOf(t, b, c)
	testenv.Eventually(t, 10*time.Second, func() error {
		if fenced() <= before {
			return errors.New("no newer term published yet")
		}
		return nil
	})
	t.Logf("the cut-off leader stopped leading %v after the cut; %s leads and published %v after it", stepped.Round(time.Millisecond),
		l.Group().ID(), time.Since(cut).Round(time.Millisecond))
	if _, err := a.Do(ctx, manager.Command{Op: manager.OpCordon, Shard: "x"}); !errors.Is(err, manager.ErrNotLeader) {
		t.Fatalf("a change asked of the cut-off manager: %v", err)
	}
	if _, err := l.Do(ctx, manager.Command{Op: manager.OpCordon, Shard: "decided-without-a"}); err != nil {
		t.Fatal(err)
	}
	a.Group().SetPartitioned(false)
	testenv.Eventually(t, 20*time.Second, func() error {
		if st := a.State(); !slices.Contains(st.Cordoned, "decided-without-a") {
			return errors.New("the rejoined manager does not hold the cordon decided without it")
		}
		return nil
	})
	if a.Leading() && l.Leading() {
		t.Fatal("two leaders")
	}
}

// TestRaftImportsEtcdState: a cluster whose manager kept its state in
// etcd moves to a raft group: the group's first leader imports the live
// version, the pin, the cordons and the audit log.
func TestRaftImportsEtcdState(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	fakeShards(t, cli, "s0", "s1")
	old := startWith(t, cli, repo, 1)
	if _, err := repo.Publish("m", lrModel(2), 4, ""); err != nil {
		t.Fatal(err)
	}
	old.Rescan()
	testenv.Eventually(t, 20*time.Second, func() error {
		if ms := old.State().Models["m"]; ms.Live != 2 {
			return errors.New("version 2 not live")
		}
		return nil
	})
	ctx := context.Background()
	for _, c := range []manager.Command{{Op: manager.OpRollback, Model: "m"}, {Op: manager.OpCordon, Shard: "s9"}} {
		if _, err := old.Do(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()

	m := raftManager(t, cli, repo, t.TempDir(), "a", "127.0.0.1:0", []raftgroup.Peer{{ID: "a"}})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := m.WaitLeading(wctx); err != nil {
		t.Fatal(err)
	}
	st := m.State()
	if ms := st.Models["m"]; ms == nil || ms.Live != 1 || ms.Pin != 1 || !slices.Contains(st.Cordoned, "s9") {
		t.Fatalf("imported: %+v cordoned %v", ms, st.Cordoned)
	}
	if got := published(t, cli, "m"); got.Live != 1 {
		t.Fatalf("published live %d", got.Live)
	}
	// A manager without raft can no longer join this cluster.
	if _, err := manager.Start(ctx, manager.Options{Repo: repo, Etcd: cli, ScanInterval: time.Hour}); !errors.Is(err, manager.ErrRaftCluster) {
		t.Fatalf("a manager without raft started on a raft group's cluster: %v", err)
	}
}

// TestRaftCommitStandsWhenPublishFails: a change the group committed
// stands, and is shown, even when publishing its map fails (here the
// fence, set by hand to a term far ahead); the map follows once a
// publication goes through again.
func TestRaftCommitStandsWhenPublishFails(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	fakeShards(t, cli, "s0", "s1")
	m, err := manager.Start(context.Background(), manager.Options{Repo: repo, Etcd: cli, ScanInterval: 200 * time.Millisecond,
		Raft: &manager.RaftOptions{ID: "a", Addr: "127.0.0.1:0", Dir: t.TempDir(), Peers: []raftgroup.Peer{{ID: "a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	testenv.Eventually(t, 20*time.Second, func() error {
		if ms := m.State().Models["m"]; ms == nil || ms.Live != 1 {
			return errors.New("version 1 not live")
		}
		return nil
	})
	if _, err := repo.Publish("m", lrModel(2), 4, ""); err != nil {
		t.Fatal(err)
	}
	m.Rescan()
	testenv.Eventually(t, 20*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 2 {
			return fmt.Errorf("published live %d", got.Live)
		}
		return nil
	})
	ctx := context.Background()
	termKey := topo.DefaultCluster.ManagerPrefix() + "term"
	if _, err := cli.Put(ctx, termKey, fmt.Sprintf("%020d", uint64(1)<<40)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Do(ctx, manager.Command{Op: manager.OpRollback, Model: "m"}); err != nil {
		t.Fatalf("a committed rollback whose map could not be published: %v", err)
	}
	if err := m.Ready(ctx); err != nil {
		t.Fatalf("ready while it leads, its takeover done: %v", err)
	}
	if ms := m.State().Models["m"]; ms.Live != 1 || ms.Pin != 1 {
		t.Fatalf("the leader shows live %d pin %d after the rollback", ms.Live, ms.Pin)
	}
	if got := published(t, cli, "m"); got.Live != 2 {
		t.Fatalf("published live %d through the fence", got.Live)
	}
	// The fence lifted: the pending map goes out, as committed.
	if _, err := cli.Delete(ctx, termKey); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 1 {
			return fmt.Errorf("published live %d", got.Live)
		}
		return nil
	})
	if ms := m.State().Models["m"]; ms.Live != 1 || ms.Pin != 1 {
		t.Fatalf("the leader shows live %d pin %d", ms.Live, ms.Pin)
	}
}

// TestRaftFencedGroupNotReady: a group rebuilt behind a newer term's
// fence cannot take over; its leader says so in readiness, until the
// fence key is deleted.
func TestRaftFencedGroupNotReady(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	ctx := context.Background()
	termKey := topo.DefaultCluster.ManagerPrefix() + "term"
	if _, err := cli.Put(ctx, termKey, fmt.Sprintf("%020d", uint64(1)<<40)); err != nil {
		t.Fatal(err)
	}
	m := raftManager(t, cli, repo, t.TempDir(), "a", "127.0.0.1:0", []raftgroup.Peer{{ID: "a"}})
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := m.Ready(ctx); err == nil || !strings.Contains(err.Error(), "cannot take over") {
			return fmt.Errorf("readiness: %v", err)
		}
		return nil
	})
	if _, err := cli.Delete(ctx, termKey); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := m.WaitLeading(wctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Ready(ctx); err != nil {
		t.Fatalf("readiness once the fence is lifted: %v", err)
	}
}
