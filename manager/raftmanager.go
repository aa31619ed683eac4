package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/raftgroup"
)

// A manager with Options.Raft keeps its state in a raft group of
// managers (raftstate.go): the group's leader decides as a lone manager
// does, commits each decision's result to the group's log, and only then
// publishes the serving map, fenced by its term (fence.go). Followers
// follow the state machine; a new leader first applies everything
// committed (a barrier), then publishes the whole map under its own term,
// then acts.

func (m *Manager) startRaft() error {
	o := m.opts.Raft
	m.fsm = newReplicated(o.Audit)
	// Raft blocks on its notification channel: drain it at once, into a
	// signal followRaft reads the leadership news from.
	m.notify, m.leadNews = make(chan bool, 16), make(chan struct{}, 1)
	g, err := raftgroup.Start(raftgroup.Config{ID: o.ID, Addr: o.Addr, Advertise: o.Advertise, Dir: o.Dir, Peers: o.Peers,
		FSM: m.fsm, TLS: o.TLS, HeartbeatTimeout: o.HeartbeatTimeout, ElectionTimeout: o.ElectionTimeout,
		LeaderLease: o.LeaderLease, Notify: m.notify})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	m.group = g
	m.st.group = true
	m.fence = fence{cli: m.opts.Etcd, cluster: m.opts.Cluster}
	m.unpublished = map[string]bool{}
	return nil
}

// Group is the raft member of a manager started with Options.Raft (nil
// otherwise).
func (m *Manager) Group() *raftgroup.Group { return m.group }

// raftState is the state machine's state as a State to decide on, and
// notes the generation it reflects. Loop goroutine (or Start).
func (m *Manager) raftState() *State {
	s, gen := m.fsm.view()
	m.seen = gen
	return &State{Models: s.Models, Cordoned: s.Cordoned}
}

// refreshRaft makes the state machine's state the one persisted and
// shown, keeping the shards' and routers' reports. Loop goroutine.
func (m *Manager) refreshRaft() {
	if _, gen := m.fsm.view(); gen == m.seen {
		return
	}
	fresh := m.raftState()
	fresh.Shards, fresh.Routers = m.view.Load().Shards, m.view.Load().Routers
	m.view.Store(fresh)
	m.setPersisted(fresh)
	m.held = false
}

// drainNotify reads raft's leadership notifications as they come (raft
// waits on them) and signals followRaft.
func (m *Manager) drainNotify(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.notify:
			select {
			case m.leadNews <- struct{}{}:
			default:
			}
		}
	}
}

// followRaft turns the group's leadership into the loop's: a member that
// leads first applies everything committed and publishes the map under
// its term (retrying while it leads that term), then acts; one that no
// longer leads stops at once.
func (m *Manager) followRaft(ctx context.Context) {
	var told uint64 // the term this manager was told to act in; 0: none
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.leadNews:
		}
		leading, term := m.group.Leading(), m.group.Term()
		if told != 0 && (!leading || term != told) {
			told = 0
			m.term.Store(0)
			slog.Warn("manager: no longer leads the raft group")
			m.tell(ctx, false)
		}
		if !leading || told != 0 {
			continue
		}
		for {
			err := m.takeOver(ctx, term)
			if err == nil {
				break
			}
			slog.Error("manager: taking over as the raft group's leader", "term", term, "err", err)
			m.takeoverErr.Store(&err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if !m.group.Leading() || m.group.Term() != term {
				break
			}
		}
		m.takeoverErr.Store(nil)
		if m.group.Leading() && m.group.Term() == term {
			told = term
			m.term.Store(term)
			slog.Info("manager: leading the raft group", "id", m.group.ID(), "term", term)
			m.tell(ctx, true)
		}
		// Leadership may have changed meanwhile: look again.
		select {
		case m.leadNews <- struct{}{}:
		default:
		}
	}
}

// takeOver applies what the group committed and publishes the whole
// serving map (and removes the records of models the state no longer
// has) under term.
func (m *Manager) takeOver(ctx context.Context, term uint64) error {
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := m.group.Barrier(bctx); err != nil {
		return fmt.Errorf("applying what the group committed: %w", err)
	}
	if err := m.importEtcdState(bctx); err != nil {
		return err
	}
	resp, err := m.opts.Etcd.Get(bctx, m.opts.Cluster.ModelsPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("reading the serving map: %w", err)
	}
	s, _ := m.fsm.view()
	names := map[string]bool{}
	for name := range s.Models {
		names[name] = true
	}
	for _, kv := range resp.Kvs {
		if name, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), m.opts.Cluster.ModelsPrefix()), "/"); name != "" {
			names[name] = true
		}
	}
	m.pub = newPublisher(m.opts.Etcd, m.opts.Cluster) // what another leader wrote is read again
	return m.pub.publish(bctx, s, slices.Sorted(maps.Keys(names)), func(ops txnOps) error { return m.fence.publish(bctx, term, ops) })
}

// raftChanges tells the loop that the state machine changed: a
// follower's view follows it, and a leader's write whose outcome it did
// not learn shows once applied.
func (m *Manager) raftChanges(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.fsm.changed:
			// The loop's refresh reads nothing when the state is the one
			// it last wrote (its own entries).
			select {
			case m.reload <- struct{}{}:
			default:
			}
		}
	}
}

// commitRaft commits c to the group's log, then publishes its serving
// map records (and any a failed publication left behind) fenced by this
// leader's term. committed says whether the state is now next's, for
// certain: once it is, a failed publication is retried (publishPending)
// and the change stands. Loop goroutine.
func (m *Manager) commitRaft(ctx context.Context, c change, next *State) (committed bool, err error) {
	term := m.term.Load()
	if term == 0 || !m.group.Leading() {
		return false, m.notLeader()
	}
	if len(c.patches) > 0 || len(c.gone) > 0 || c.cordons != nil || len(c.audit) > 0 {
		if !m.patchEntries.Load() {
			// A member may not read schema 2 yet: whole states.
			c.wholeStates(next)
			c.patches = nil
		}
		entry, err := entryOf(c, next.Cordoned, time.Now(), m.fsm.keep)
		if err != nil {
			return false, err
		}
		resp, err := m.group.Apply(ctx, entry)
		if errors.Is(err, raftgroup.ErrNotLeader) {
			return false, m.notLeader()
		}
		if err != nil {
			// Perhaps committed after all: the state machine will say
			// (refreshRaft).
			return false, fmt.Errorf("manager: committing to the raft group: %w", err)
		}
		if err, ok := resp.(error); ok {
			return false, err
		}
		m.seen, _ = resp.(uint64)
	}
	for _, name := range c.maps {
		m.unpublished[name] = true
	}
	for _, name := range c.gone {
		m.unpublished[name] = true
	}
	return true, m.publishPending(ctx, next)
}

// publishPending publishes the map records of the models whose records
// etcd does not yet hold as next has them. Loop goroutine.
func (m *Manager) publishPending(ctx context.Context, next *State) error {
	if len(m.unpublished) == 0 {
		return nil
	}
	err := m.pub.publish(ctx, next, slices.Sorted(maps.Keys(m.unpublished)), func(ops txnOps) error { return m.fence.publish(ctx, m.term.Load(), ops) })
	if err != nil {
		return fmt.Errorf("committed, but the serving map is not published yet: %w", err)
	}
	clear(m.unpublished)
	return nil
}

// raftReady: the group has a leader this member knows of, and if this
// member is it, it can act (its takeover is not failing).
func (m *Manager) raftReady() error {
	if id, _ := m.group.Leader(); id == "" {
		return errors.New("the raft group of managers has no leader that this one knows of")
	}
	if err := m.takeoverErr.Load(); err != nil && m.group.Leading() {
		return fmt.Errorf("this manager leads the raft group but cannot take over: %w", *err)
	}
	return nil
}

// readAudit returns up to limit of the newest audit entries, oldest
// first, from where this manager keeps them.
func (m *Manager) readAudit(ctx context.Context, limit int64) ([]AuditEntry, error) {
	if m.fsm != nil {
		return m.fsm.readAudit(limit), nil
	}
	return m.st.readAudit(ctx, limit)
}

// importEtcdState carries the state that managers without raft kept in
// etcd (models, cordons, the audit log) into a group that holds nothing
// yet, in one entry: a cluster moving to --raft-* keeps what is live,
// pinned and cordoned.
func (m *Manager) importEtcdState(ctx context.Context) error {
	if s, _ := m.fsm.view(); len(s.Models) > 0 || len(s.Cordoned) > 0 || m.fsm.audited() > 0 {
		return nil
	}
	old, err := m.st.load(ctx)
	if err != nil {
		return fmt.Errorf("reading the state kept in etcd, to import it: %w", err)
	}
	if len(old.Models) == 0 && len(old.Cordoned) == 0 {
		return nil
	}
	audit, err := m.st.readAudit(ctx, maxAudit)
	if err != nil {
		return fmt.Errorf("reading the audit log kept in etcd, to import it: %w", err)
	}
	now := time.Now().UTC()
	c := change{states: map[string][]byte{}, audit: append(audit, AuditEntry{Time: now, Op: "import",
		Result: fmt.Sprintf("%d models, %d cordoned shards and %d audit entries from the state kept in etcd", len(old.Models), len(old.Cordoned), len(audit))})}
	for name, ms := range old.Models {
		c.states[name], _ = json.Marshal(ms)
	}
	if len(old.Cordoned) > 0 {
		c.cordons = []byte("set")
	}
	entry, err := entryOf(c, old.Cordoned, now, m.fsm.keep)
	if err != nil {
		return err
	}
	if _, err := m.group.Apply(ctx, entry); err != nil {
		return fmt.Errorf("importing the state kept in etcd: %w", err)
	}
	slog.Info("manager: imported the state kept in etcd into the raft group", "models", len(old.Models), "cordoned", len(old.Cordoned), "audit", len(audit))
	return nil
}
