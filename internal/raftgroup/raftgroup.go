// Package raftgroup runs one member of a raft group (hashicorp/raft) on
// the project's pebble log and stable store (internal/raftstore), with
// file snapshots beside it and a TCP transport, mutual TLS when given a
// certificate. It is what the managers replicate their state with.
//
// A member's directory holds everything it needs to rejoin after a
// crash: DIR/log (pebble) and DIR/snapshots. A group is bootstrapped
// once, from the configuration a fresh member is given (Peers); members
// that find state in their directory ignore Peers and carry on.
package raftgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cumulus-serving/cumulus/internal/raftstore"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// Peer is a voting member: its ID and the address its transport is
// dialed at.
type Peer struct {
	ID   string
	Addr string
}

// ParsePeers reads "ID=ADDR,ID=ADDR,…" (--raft-peers). IDs and addresses
// must each be unique.
func ParsePeers(s string) ([]Peer, error) {
	var peers []Peer
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, kv := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("raftgroup: peer %q is not ID=HOST:PORT", kv)
		}
		if err := ValidID(id); err != nil {
			return nil, err
		}
		if _, _, err := splitAddr(addr); err != nil {
			return nil, fmt.Errorf("raftgroup: peer %s: %w", id, err)
		}
		if slices.ContainsFunc(peers, func(p Peer) bool { return p.ID == id || p.Addr == addr }) {
			return nil, fmt.Errorf("raftgroup: peer %s=%s named twice", id, addr)
		}
		peers = append(peers, Peer{ID: id, Addr: addr})
	}
	return peers, nil
}

// ValidID checks a member ID: 1 to 64 letters, digits, '.', '_' or '-'.
func ValidID(id string) error {
	if id == "" || len(id) > 64 || strings.IndexFunc(id, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
	}) >= 0 {
		return fmt.Errorf("raftgroup: member ID %q: 1 to 64 letters, digits, '.', '_' or '-'", id)
	}
	return nil
}

func splitAddr(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 || host == "" {
		return "", 0, fmt.Errorf("address %q: want HOST:PORT", addr)
	}
	return host, p, nil
}

// Config configures a member.
type Config struct {
	// ID is this member's ID in the group; required (ValidID).
	ID string
	// Addr is the transport's listen address; Advertise the one peers
	// dial (default Addr, which must then not be 0.0.0.0).
	Addr, Advertise string
	// Dir holds the member's log, stable store and snapshots; required.
	Dir string
	// Peers, for a member with nothing in Dir, bootstraps the group with
	// this configuration if it names this member (an empty address
	// there stands for this member's own, as when it listens on port 0).
	// Members given the
	// same Peers may all start with it: raft lets one bootstrap win.
	// Empty, or not naming this member: the member waits to be added by
	// the group's leader.
	Peers []Peer
	// FSM is the replicated state machine; required.
	FSM raft.FSM
	// TLS, if set, makes the transport mutual TLS.
	TLS *tlsconf.Source
	// HeartbeatTimeout and ElectionTimeout (default 500ms each) bound how
	// soon followers notice a leader gone; LeaderLease (default 250ms)
	// how soon a leader cut off from the others steps down.
	HeartbeatTimeout, ElectionTimeout, LeaderLease time.Duration
	// SnapshotEvery is how many applied entries trigger a snapshot
	// (default 8192); TrailingLogs how many entries are kept behind it for
	// followers slightly behind (default 1024).
	SnapshotEvery, TrailingLogs uint64
	// Notify, if set, receives true when this member becomes leader and
	// false when it stops being leader; it must be drained promptly.
	Notify chan<- bool
}

// Group is a running member.
type Group struct {
	cfg   Config
	raft  *raft.Raft
	store *raftstore.Store
	trans *raft.NetworkTransport
	layer *streamLayer
}

// ErrNotLeader is returned for a change asked of a member that does not
// lead; NotLeaderError says who does.
var ErrNotLeader = errors.New("raftgroup: not the leader")

// ErrNotMember is returned by Remove for an ID not in the group.
var ErrNotMember = errors.New("raftgroup: not a member of the group")

// ErrMember is returned by Add for an ID or address already in the
// group, and by Remove for its last member.
var ErrMember = errors.New("raftgroup: refused by the group's membership")

// NotLeaderError names the leader as this member knows it (empty while
// none is known).
type NotLeaderError struct{ LeaderID, LeaderAddr string }

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "raftgroup: not the leader, and no leader is known yet"
	}
	return fmt.Sprintf("raftgroup: not the leader; the leader is %s (%s)", e.LeaderID, e.LeaderAddr)
}

func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// Start opens the member's directory, starts its transport and raft, and
// bootstraps the group if the directory is fresh and Peers are given.
func Start(cfg Config) (*Group, error) {
	if err := ValidID(cfg.ID); err != nil {
		return nil, err
	}
	switch {
	case cfg.Dir == "":
		return nil, errors.New("raftgroup: Config.Dir is required")
	case cfg.FSM == nil:
		return nil, errors.New("raftgroup: Config.FSM is required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.HeartbeatTimeout, 500*time.Millisecond)
	def(&cfg.ElectionTimeout, 500*time.Millisecond)
	def(&cfg.LeaderLease, 250*time.Millisecond)
	if cfg.SnapshotEvery == 0 {
		cfg.SnapshotEvery = 8192
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 1024
	}
	// A member the peers do not name (one added later to a StatefulSet
	// whose pods all carry the first members' list) waits to be added.
	bootstrap := slices.ContainsFunc(cfg.Peers, func(p Peer) bool { return p.ID == cfg.ID })
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("raftgroup: %w", err)
	}
	store, err := raftstore.Open(filepath.Join(cfg.Dir, "log"))
	if err != nil {
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, hclogger("raft-snapshots"))
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("raftgroup: %w", err)
	}
	layer, err := listen(cfg.Addr, cfg.Advertise, cfg.TLS)
	if err != nil {
		store.Close()
		return nil, err
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: layer, MaxPool: 3,
		Timeout: 5 * time.Second, Logger: hclogger("raft-net")})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLease
	rc.CommitTimeout = 5 * time.Millisecond
	rc.SnapshotThreshold, rc.TrailingLogs = cfg.SnapshotEvery, cfg.TrailingLogs
	rc.SnapshotInterval = 30 * time.Second
	rc.NotifyCh = cfg.Notify
	// A member removed from the group (even the leader) stays up, out of
	// it, rather than shutting its raft down under a running process.
	rc.ShutdownOnRemove = false
	rc.Logger = hclogger("raft")
	if err := raft.ValidateConfig(rc); err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("raftgroup: %w", err)
	}
	fresh, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("raftgroup: reading %s: %w", cfg.Dir, err)
	}
	fresh = !fresh
	r, err := raft.NewRaft(rc, cfg.FSM, store, store, snaps, trans)
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("raftgroup: %w", err)
	}
	g := &Group{cfg: cfg, raft: r, store: store, trans: trans, layer: layer}
	known := func() []string {
		var hosts []string
		add := func(addr string) {
			if h, _, err := net.SplitHostPort(addr); err == nil && !slices.Contains(hosts, h) {
				hosts = append(hosts, h)
			}
		}
		for _, p := range cfg.Peers {
			add(p.Addr)
		}
		if f := r.GetConfiguration(); f.Error() == nil {
			for _, s := range f.Configuration().Servers {
				add(string(s.Address))
			}
		}
		return hosts
	}
	layer.known.Store(&known)
	if fresh && !bootstrap && len(cfg.Peers) > 0 {
		slog.Info("raftgroup: this member is not among the peers given; waiting to be added to the group", "id", cfg.ID)
	}
	if fresh && bootstrap {
		var servers []raft.Server
		for _, p := range cfg.Peers {
			if p.ID == cfg.ID {
				switch {
				case p.Addr == "":
					p.Addr = g.Addr()
				case p.Addr != g.Addr():
					g.Close()
					return nil, fmt.Errorf("raftgroup: the peers name this member %s at %s, but it is dialed at %s (--raft-addr, or its advertised address)", p.ID, p.Addr, g.Addr())
				}
			}
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
		}
		// ErrCantBootstrap: another start got there (a restart that found
		// state after all); the configuration in the log stands.
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			g.Close()
			return nil, fmt.Errorf("raftgroup: bootstrapping: %w", err)
		}
	}
	return g, nil
}

// Addr is the address peers dial this member at.
func (g *Group) Addr() string { return string(g.trans.LocalAddr()) }

// ID is this member's ID.
func (g *Group) ID() string { return g.cfg.ID }

// Leading reports whether this member leads now.
func (g *Group) Leading() bool { return g.raft.State() == raft.Leader }

// Leader is the leader as this member knows it ("" while none is).
func (g *Group) Leader() (id, addr string) {
	a, i := g.raft.LeaderWithID()
	return string(i), string(a)
}

func (g *Group) notLeader() error {
	id, addr := g.Leader()
	return &NotLeaderError{LeaderID: id, LeaderAddr: addr}
}

// wait waits for f, or ctx's end (the change may then still be made).
func wait[F raft.Future](ctx context.Context, f F) (F, error) {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return f, err
	case <-ctx.Done():
		return f, ctx.Err()
	}
}

// Apply appends cmd to the log and returns the FSM's answer once the
// entry is committed and applied on this member (the leader). A member
// that does not lead returns a NotLeaderError; a leader deposed before
// the entry committed returns raft.ErrLeadershipLost (the entry may yet
// be committed by the next leader).
func (g *Group) Apply(ctx context.Context, cmd []byte) (any, error) {
	if !g.Leading() {
		return nil, g.notLeader()
	}
	f, err := wait(ctx, g.raft.Apply(cmd, timeoutOf(ctx)))
	if errors.Is(err, raft.ErrNotLeader) {
		return nil, g.notLeader()
	}
	if err != nil {
		return nil, err
	}
	return f.Response(), nil
}

// Barrier returns once every entry committed before it is applied on
// this member, the leader: a new leader calls it before acting on its
// state.
func (g *Group) Barrier(ctx context.Context) error {
	_, err := wait(ctx, g.raft.Barrier(timeoutOf(ctx)))
	if errors.Is(err, raft.ErrNotLeader) {
		return g.notLeader()
	}
	return err
}

// VerifyLeader checks with a quorum that this member still leads.
func (g *Group) VerifyLeader(ctx context.Context) error {
	_, err := wait(ctx, g.raft.VerifyLeader())
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return g.notLeader()
	}
	return err
}

// Term is this member's current raft term.
func (g *Group) Term() uint64 { return g.raft.CurrentTerm() }

// Status is one member as this member sees it.
type Status struct {
	ID, Addr string
	// Voter: it votes (a member being added, or a non-voter, does not).
	Voter bool
	// Role is "leader", "follower", "candidate" or "shutdown" for this
	// member; for others, "leader" or "follower" as far as this member
	// knows (see their own Status for the truth).
	Role string
	// Term and Applied are this member's own (zero for the others).
	Term, Applied, LastIndex uint64
	// LastContact is when this member last heard from the leader (zero
	// on the leader itself, and for others).
	LastContact time.Time
	Self        bool
}

// Members lists the group's configuration as this member knows it.
func (g *Group) Members() ([]Status, error) {
	f := g.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("raftgroup: %w", err)
	}
	leaderID, _ := g.Leader()
	var out []Status
	for _, s := range f.Configuration().Servers {
		st := Status{ID: string(s.ID), Addr: string(s.Address), Voter: s.Suffrage == raft.Voter, Role: "follower"}
		if st.ID == leaderID {
			st.Role = "leader"
		}
		if st.ID == g.cfg.ID {
			st.Self = true
			st.Role = strings.ToLower(g.raft.State().String())
			st.Term, st.Applied, st.LastIndex = g.raft.CurrentTerm(), g.raft.AppliedIndex(), g.raft.LastIndex()
			if g.raft.State() != raft.Leader {
				st.LastContact = g.raft.LastContact()
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// Add makes id (dialed at addr) a voting member; only the leader can.
func (g *Group) Add(ctx context.Context, id, addr string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	if _, _, err := splitAddr(addr); err != nil {
		return fmt.Errorf("raftgroup: %w", err)
	}
	if !g.Leading() {
		return g.notLeader()
	}
	members, err := g.Members()
	if err != nil {
		return err
	}
	for _, m := range members {
		if m.ID == id || m.Addr == addr {
			return fmt.Errorf("%w: %s at %s (remove it first to move it)", ErrMember, m.ID, m.Addr)
		}
	}
	_, err = wait(ctx, g.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeoutOf(ctx)))
	if errors.Is(err, raft.ErrNotLeader) {
		return g.notLeader()
	}
	return err
}

// Remove takes id out of the group; only the leader can (it may remove
// itself: it then steps down).
func (g *Group) Remove(ctx context.Context, id string) error {
	if !g.Leading() {
		return g.notLeader()
	}
	members, err := g.Members()
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(members, func(s Status) bool { return s.ID == id }) {
		return fmt.Errorf("%w: %s", ErrNotMember, id)
	}
	if len(members) == 1 {
		return fmt.Errorf("%w: %s is the group's last member", ErrMember, id)
	}
	_, err = wait(ctx, g.raft.RemoveServer(raft.ServerID(id), 0, timeoutOf(ctx)))
	if errors.Is(err, raft.ErrNotLeader) {
		return g.notLeader()
	}
	return err
}

func timeoutOf(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return 0
}

// HandOver, on the leader, hands the lead to the most up-to-date other
// member and waits for it (a leader about to stop saves the others an
// election timeout); elsewhere it does nothing.
func (g *Group) HandOver(ctx context.Context) error {
	if !g.Leading() {
		return nil
	}
	if ms, err := g.Members(); err != nil || len(ms) < 2 {
		return err // alone: no one to hand over to
	}
	_, err := wait(ctx, g.raft.LeadershipTransfer())
	return err
}

// SetPartitioned cuts this member off from the others (true: every
// connection in or out is closed and refused) or joins it again: a fault
// for drills and tests, as a network partition would be.
func (g *Group) SetPartitioned(on bool) { g.layer.partition(on) }

// Snapshot takes a snapshot now, truncating the log behind it.
func (g *Group) Snapshot() error {
	err := g.raft.Snapshot().Error()
	if errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return nil
	}
	return err
}

// Close stops the member: raft, its transport and its store.
func (g *Group) Close() error {
	err := g.raft.Shutdown().Error()
	g.trans.Close()
	if cerr := g.store.Close(); err == nil {
		err = cerr
	}
	return err
}
