package raftstore

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/cumulus-serving/cumulus/internal/testenv"
)

// node is one raft member on a Store in its own directory.
type node struct {
	id, addr, dir string
	store         *Store
	fsm           *testenv.ListFSM
	raft          *raft.Raft
	// What its directory held before raft started: last index and term.
	lastAtStart, termAtStart uint64
}

// start starts (or restarts, from what its directory holds) member id,
// listening on addr (127.0.0.1:0 picks a port).
func start(t *testing.T, id, addr, dir string) *node {
	t.Helper()
	store, err := Open(filepath.Join(dir, "raft"))
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	trans, err := raft.NewTCPTransport(addr, nil, 3, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := raft.DefaultConfig()
	c.LocalID = raft.ServerID(id)
	c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	c.CommitTimeout = 5 * time.Millisecond
	c.SnapshotThreshold, c.TrailingLogs = 1<<30, 10 // snapshots when the test asks; then keep 10 entries
	c.Logger = hclog.NewNullLogger()
	n := &node{id: id, addr: string(trans.LocalAddr()), dir: dir, store: store, fsm: &testenv.ListFSM{}}
	if n.lastAtStart, err = store.LastIndex(); err != nil {
		t.Fatal(err)
	}
	n.termAtStart, _ = store.GetUint64([]byte("CurrentTerm")) // "not found" on a fresh member
	if n.raft, err = raft.NewRaft(c, n.fsm, store, store, snaps, trans); err != nil {
		t.Fatal(err)
	}
	return n
}

// stop shuts the member down and closes its store.
func (n *node) stop(t *testing.T) {
	t.Helper()
	if err := n.raft.Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	if err := n.store.Close(); err != nil {
		t.Fatal(err)
	}
}

// leader waits for one of nodes to lead.
func leader(t *testing.T, nodes []*node) *node {
	t.Helper()
	var l *node
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, n := range nodes {
			if n.raft.State() == raft.Leader {
				l = n
				return nil
			}
		}
		return errors.New("no leader yet")
	})
	return l
}

// apply applies commands from..to-1 through leader l.
func apply(t *testing.T, l *node, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := l.raft.Apply(fmt.Appendf(nil, "cmd-%d", i), 5*time.Second).Error(); err != nil {
			t.Fatalf("applying command %d on %s: %v", i, l.id, err)
		}
	}
}

// caughtUp waits until every node's state machine holds commands 0..n-1.
func caughtUp(t *testing.T, nodes []*node, n int) {
	t.Helper()
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("cmd-%d", i))
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, nd := range nodes {
			if got := nd.fsm.Get(); !slices.Equal(got, want) {
				return fmt.Errorf("%s holds %d commands, want %d", nd.id, len(got), n)
			}
		}
		return nil
	})
}

// TestRaftGroup: three hashicorp/raft members on this store, over TCP
// on loopback, replicate commands; a snapshot truncates their logs; a
// member stopped and started again from its directory (snapshot, log,
// term and vote) catches up; the leader stopped, another takes over and
// the group goes on.
func TestRaftGroup(t *testing.T) {
	var nodes []*node
	for i := range 3 {
		nodes = append(nodes, start(t, fmt.Sprintf("m%d", i), "127.0.0.1:0", t.TempDir()))
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.raft.Shutdown().Error()
			n.store.Close()
		}
	})
	var servers []raft.Server
	for _, n := range nodes {
		servers = append(servers, raft.Server{ID: raft.ServerID(n.id), Address: raft.ServerAddress(n.addr)})
	}
	if err := nodes[0].raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		t.Fatal(err)
	}
	l := leader(t, nodes)
	apply(t, l, 0, 300)
	caughtUp(t, nodes, 300)

	// A snapshot on every member; their logs are cut behind it.
	for _, n := range nodes {
		if err := n.raft.Snapshot().Error(); err != nil {
			t.Fatalf("snapshot on %s: %v", n.id, err)
		}
		first, err := n.store.FirstIndex()
		if err != nil {
			t.Fatal(err)
		}
		if first < 250 {
			t.Fatalf("%s's log starts at %d after a snapshot at 300 keeping 10", n.id, first)
		}
	}

	// A follower stopped, the group goes on, the follower comes back
	// from its own directory.
	fi := slices.IndexFunc(nodes, func(n *node) bool { return n != l })
	f := nodes[fi]
	f.stop(t)
	apply(t, l, 300, 400)
	nodes[fi] = start(t, f.id, f.addr, f.dir)
	if n := nodes[fi]; n.lastAtStart < 300 || n.termAtStart == 0 {
		t.Fatalf("the follower came back with its log ending at %d, term %d; it held 300 commands", n.lastAtStart, n.termAtStart)
	}
	caughtUp(t, nodes, 400)

	// The leader stopped: another leads, and the group goes on with two.
	li := slices.Index(nodes, l)
	l.stop(t)
	rest := slices.Delete(slices.Clone(nodes), li, li+1)
	l2 := leader(t, rest)
	apply(t, l2, 400, 450)
	caughtUp(t, rest, 450)
	// Back from its directory, the old leader follows.
	nodes[li] = start(t, l.id, l.addr, l.dir)
	if n := nodes[li]; n.lastAtStart < 400 || n.termAtStart == 0 {
		t.Fatalf("the old leader came back with its log ending at %d, term %d; it held 400 commands", n.lastAtStart, n.termAtStart)
	}
	caughtUp(t, nodes, 450)
}
