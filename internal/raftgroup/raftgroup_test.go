package raftgroup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

type member struct {
	*Group
	fsm *testenv.ListFSM
	dir string
}

func startMember(t *testing.T, id, addr, dir string, peers []Peer, src *tlsconf.Source, snapEvery uint64) *member {
	t.Helper()
	fsm := &testenv.ListFSM{}
	g, err := Start(Config{ID: id, Addr: addr, Dir: dir, Peers: peers, FSM: fsm, TLS: src, SnapshotEvery: snapEvery, TrailingLogs: 8})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{Group: g, fsm: fsm, dir: dir}
	t.Cleanup(func() { m.Close() })
	return m
}

// leaderOf waits until exactly one of ms leads, and returns it.
func leaderOf(t *testing.T, ms ...*member) *member {
	t.Helper()
	var l *member
	testenv.Eventually(t, 10*time.Second, func() error {
		l = nil
		for _, m := range ms {
			if m.Leading() {
				if l != nil {
					return errors.New("two leaders")
				}
				l = m
			}
		}
		if l == nil {
			return errors.New("no leader")
		}
		return nil
	})
	return l
}

func apply(t *testing.T, m *member, entries ...string) {
	t.Helper()
	for _, e := range entries {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := m.Apply(ctx, []byte(e))
		cancel()
		if err != nil {
			t.Fatalf("apply %s on %s: %v", e, m.ID(), err)
		}
	}
}

// converged waits until every member's list is want.
func converged(t *testing.T, want []string, ms ...*member) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, m := range ms {
			if got := m.fsm.Get(); !slices.Equal(got, want) {
				return fmt.Errorf("%s has %d entries, want %d", m.ID(), len(got), len(want))
			}
		}
		return nil
	})
}

func entries(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("e%d", i))
	}
	return out
}

// TestGroup: a member bootstraps alone, two join through it, entries
// reach all three; the leader stops, another takes over, and the old one
// comes back from its directory and catches up; a follower refuses a
// change naming the leader; one member is removed.
func TestGroup(t *testing.T) {
	dir := t.TempDir()
	a := startMember(t, "a", "127.0.0.1:0", filepath.Join(dir, "a"), []Peer{{ID: "a"}}, nil, 0)
	leaderOf(t, a)
	b := startMember(t, "b", "127.0.0.1:0", filepath.Join(dir, "b"), nil, nil, 0)
	c := startMember(t, "c", "127.0.0.1:0", filepath.Join(dir, "c"), nil, nil, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range []*member{b, c} {
		if err := a.Add(ctx, m.ID(), m.Addr()); err != nil {
			t.Fatalf("add %s: %v", m.ID(), err)
		}
	}
	apply(t, a, entries(0, 10)...)
	converged(t, entries(0, 10), a, b, c)

	members, err := b.Members()
	if err != nil || len(members) != 3 {
		t.Fatalf("members as b sees them: %v %v", members, err)
	}
	for _, s := range members {
		switch {
		case s.ID == "a" && s.Role != "leader", s.ID == "b" && (!s.Self || s.Role != "follower" || s.Term == 0 || s.Applied == 0):
			t.Errorf("member %+v", s)
		}
	}
	_, err = b.Apply(ctx, []byte("from a follower"))
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.LeaderID != "a" || nl.LeaderAddr != a.Addr() {
		t.Fatalf("a follower's Apply: %v", err)
	}
	if err := b.Add(ctx, "d", "127.0.0.1:1"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a follower's Add: %v", err)
	}

	// The leader stops: one of the others takes over.
	termBefore := a.Term()
	addrA := a.Addr()
	stopped := time.Now()
	a.Close()
	l := leaderOf(t, b, c)
	t.Logf("%s leads %v after the leader stopped", l.ID(), time.Since(stopped).Round(time.Millisecond))
	if l.Term() <= termBefore {
		t.Errorf("new leader's term %d, the old one's %d", l.Term(), termBefore)
	}
	apply(t, l, entries(10, 20)...)
	// The old leader comes back from its directory, on its address.
	a = startMember(t, "a", addrA, filepath.Join(dir, "a"), []Peer{{ID: "a"}}, nil, 0)
	converged(t, entries(0, 20), a, b, c)
	if a.Leading() {
		t.Error("the restarted member leads: it should have joined the newer term")
	}

	// Removing one: the others carry on.
	l = leaderOf(t, a, b, c)
	var gone *member
	for _, m := range []*member{a, b, c} {
		if m != l {
			gone = m
			break
		}
	}
	if err := l.Remove(ctx, gone.ID()); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(ctx, "nobody"); err == nil {
		t.Error("removing a member that is not one succeeded")
	}
	if ms, _ := l.Members(); len(ms) != 2 {
		t.Errorf("after the removal: %+v", ms)
	}
	apply(t, l, "after removal")
}

// TestSnapshotCatchUp: with snapshots every 16 entries and 8 kept behind
// them, a member added after 100 entries catches up from a snapshot, and
// a restarted member restores from its own.
func TestSnapshotCatchUp(t *testing.T) {
	dir := t.TempDir()
	a := startMember(t, "a", "127.0.0.1:0", filepath.Join(dir, "a"), []Peer{{ID: "a"}}, nil, 16)
	leaderOf(t, a)
	apply(t, a, entries(0, 100)...)
	if err := a.Snapshot(); err != nil {
		t.Fatal(err)
	}
	first, err := a.store.FirstIndex()
	if err != nil || first <= 1 {
		t.Fatalf("the log was not truncated behind the snapshot: first index %d (%v)", first, err)
	}
	b := startMember(t, "b", "127.0.0.1:0", filepath.Join(dir, "b"), nil, nil, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Add(ctx, "b", b.Addr()); err != nil {
		t.Fatal(err)
	}
	converged(t, entries(0, 100), a, b)
	addr := a.Addr()
	a.Close()
	// Alone of two, b cannot elect itself; a restarts from snapshot and log.
	a = startMember(t, "a", addr, filepath.Join(dir, "a"), nil, nil, 16)
	converged(t, entries(0, 100), a, b)
	l := leaderOf(t, a, b)
	apply(t, l, "more")
	converged(t, append(entries(0, 100), "more"), a, b)
}

// TestTLS: members of one CA form a group over mutual TLS; a member
// whose certificate another CA signed is not let in (adding it cannot
// commit: the group cannot reach it), and gets no entry; nor does a
// certificate of the CA without the manager role, even one naming a
// member's host.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconf.NewCA("cluster")
	if err != nil {
		t.Fatal(err)
	}
	other, err := tlsconf.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	source := func(ca *tlsconf.CA, name string, role tlsconf.Role, trust *tlsconf.CA, hosts ...string) *tlsconf.Source {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if len(hosts) == 0 {
			hosts = []string{"127.0.0.1"}
		}
		f, err := ca.WriteIssued(filepath.Join(dir, name), name, append(hosts, tlsconf.Identity{Cluster: "test", Role: role}.String())...)
		if err != nil {
			t.Fatal(err)
		}
		f.CA = filepath.Join(dir, name, "trust.pem")
		if err := writeFile(f.CA, trust.PEM); err != nil {
			t.Fatal(err)
		}
		src, err := tlsconf.Load(t.Context(), f)
		if err != nil {
			t.Fatal(err)
		}
		src.SetRoles("test", tlsconf.RolesEnforce)
		return src
	}
	a := startMember(t, "a", "127.0.0.1:0", filepath.Join(dir, "a", "raft"), []Peer{{ID: "a"}}, source(ca, "a", tlsconf.RoleManager, ca), 0)
	b := startMember(t, "b", "127.0.0.1:0", filepath.Join(dir, "b", "raft"), nil, source(ca, "b", tlsconf.RoleManager, ca), 0)
	leaderOf(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Add(ctx, "b", b.Addr()); err != nil {
		t.Fatal(err)
	}
	apply(t, a, "secret")
	converged(t, []string{"secret"}, a, b)

	// A certificate of the cluster's CA that names no member (a
	// manager's of elsewhere), or one of another role naming a member's
	// host (an operator's on the same machine), gets nothing from the
	// transport: a forged AppendEntries sent to the follower is refused,
	// and not applied.
	for _, c := range []struct {
		what string
		src  *tlsconf.Source
	}{
		{"a manager's certificate naming no member", source(ca, "elsewhere", tlsconf.RoleManager, ca, "manager.example")},
		{"an operator's certificate naming a member", source(ca, "operator", tlsconf.RoleOperator, ca)},
	} {
		layer, err := listen("127.0.0.1:0", "", c.src)
		if err != nil {
			t.Fatal(err)
		}
		forger := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: layer, MaxPool: 1, Timeout: 2 * time.Second, Logger: hclogger("forger")})
		var resp raft.AppendEntriesResponse
		err = forger.AppendEntries(raft.ServerID("b"), raft.ServerAddress(b.Addr()), &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ID: []byte("a"), Addr: []byte(a.Addr())}, Term: a.Term() + 5, PrevLogEntry: b.raft.LastIndex(), PrevLogTerm: a.Term(),
			Entries: []*raft.Log{{Index: b.raft.LastIndex() + 1, Term: a.Term() + 5, Type: raft.LogCommand, Data: []byte("forged")}}, LeaderCommitIndex: b.raft.LastIndex() + 1}, &resp)
		forger.Close()
		t.Logf("a forged AppendEntries from %s: %v", c.what, err)
		if err == nil {
			t.Fatalf("the follower took an AppendEntries from %s", c.what)
		}
		if slices.Contains(b.fsm.Get(), "forged") {
			t.Fatalf("the follower applied the entry forged with %s", c.what)
		}
	}

	// The stranger trusts the cluster's CA, but the cluster does not
	// trust its certificate.
	s := startMember(t, "s", "127.0.0.1:0", filepath.Join(dir, "s", "raft"), nil, source(other, "s", tlsconf.RoleManager, ca), 0)
	sctx, scancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer scancel()
	err = a.Add(sctx, "s", s.Addr())
	t.Logf("adding the stranger: %v", err)
	if got := s.fsm.Get(); len(got) != 0 {
		t.Fatalf("the stranger got entries: %v", got)
	}
	// The stranger may sit in the configuration, unreachable: taking it
	// out again lets the group carry on.
	if ms, _ := a.Members(); slices.ContainsFunc(ms, func(m Status) bool { return m.ID == "s" }) {
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		if err := leaderOf(t, a, b).Remove(rctx, "s"); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, leaderOf(t, a, b), "still private")
	converged(t, []string{"secret", "still private"}, a, b)
	if got := s.fsm.Get(); len(got) != 0 {
		t.Fatalf("the stranger got entries: %v", got)
	}
}

func TestParsePeers(t *testing.T) {
	got, err := ParsePeers("m-0=m-0.managers:7400, m-1=10.0.0.2:7400")
	if err != nil || !slices.Equal(got, []Peer{{"m-0", "m-0.managers:7400"}, {"m-1", "10.0.0.2:7400"}}) {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"m0", "=a:1", "m0=", "m0=host", "m0=host:0", "m0=:1", "m0=a:1,m0=b:1", "m0=a:1,m1=a:1", "m/0=a:1", "m0=a:99999"} {
		if _, err := ParsePeers(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

// TestAdvertise: a member is dialed at the name it was given (a host
// name stays one), with the port the kernel chose for port 0; an
// address of every interface needs one to advertise.
func TestAdvertise(t *testing.T) {
	m := startMember(t, "a", "localhost:0", filepath.Join(t.TempDir(), "a"), []Peer{{ID: "a"}}, nil, 0)
	host, port, err := net.SplitHostPort(m.Addr())
	if err != nil || host != "localhost" || port == "0" {
		t.Fatalf("advertised %q", m.Addr())
	}
	leaderOf(t, m)
	if _, err := Start(Config{ID: "b", Addr: "0.0.0.0:0", Dir: t.TempDir(), FSM: &testenv.ListFSM{}}); err == nil || !strings.Contains(err.Error(), "advertise") {
		t.Fatalf("listening on every interface with nothing to advertise: %v", err)
	}
	g, err := Start(Config{ID: "c", Addr: "0.0.0.0:0", Advertise: "c.example:7400", Dir: t.TempDir(), FSM: &testenv.ListFSM{}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Addr() != "c.example:7400" {
		t.Fatalf("advertised %q", g.Addr())
	}
}
