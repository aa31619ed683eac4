package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/raftgroup"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// MemberRecord is a raft member's account of itself, kept in etcd at
// MANAGER/members/ID under a lease and refreshed every second, so that
// any manager can list every member's role, term and applied index.
type MemberRecord struct {
	Schema  int    `json:"schema"`
	ID      string `json:"id"`
	Raft    string `json:"raft"`
	Role    string `json:"role"`
	Term    uint64 `json:"term"`
	Applied uint64 `json:"applied"`
	// Entries is the newest raft entry schema the member reads (absent:
	// 1). The leader writes patches (schema 2) once every member of the
	// group reads them.
	Entries int `json:"entries,omitempty"`
	// Admin is the URL of its console (its admin API's /console/), so
	// that a follower's console links to the leader's. (Added without
	// raising the schema: older readers ignore it.)
	Admin string `json:"admin,omitempty"`
}

// memberRecordSchema is MemberRecord's schema (topo.Schema's rule).
const memberRecordSchema = 1

func (m *Manager) membersPrefix() string { return m.opts.Cluster.ManagerPrefix() + "members/" }

// self is this member's record now.
func (m *Manager) self() MemberRecord {
	r := MemberRecord{Schema: memberRecordSchema, ID: m.group.ID(), Raft: m.group.Addr(), Entries: raftEntrySchema}
	if u := m.adminURL.Load(); u != nil {
		r.Admin = *u
	}
	if ms, err := m.group.Members(); err == nil {
		for _, s := range ms {
			if s.Self {
				r.Role, r.Term, r.Applied = s.Role, s.Term, s.Applied
			}
		}
	}
	if r.Role == "" {
		r.Role = "none" // not (or no longer) in the group's configuration
	}
	return r
}

// reportMember keeps this member's record in etcd, under a lease of its
// own: a member started again under the same ID writes over the record
// its killed predecessor left (the record only informs).
func (m *Manager) reportMember(ctx context.Context) {
	key := m.membersPrefix() + m.group.ID()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lease clientv3.LeaseID
	var alive <-chan *clientv3.LeaseKeepAliveResponse
	last, n := "", 0
	defer func() {
		if lease != 0 {
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			m.opts.Etcd.Revoke(rctx, lease)
			cancel()
		}
	}()
	for {
		if lease == 0 {
			l, err := m.opts.Etcd.Grant(ctx, 10)
			if err == nil {
				alive, err = m.opts.Etcd.KeepAlive(ctx, l.ID)
			}
			if err == nil {
				lease, last = l.ID, ""
			} else if ctx.Err() == nil {
				slog.Debug("manager: reporting this raft member in etcd", "err", err)
			}
		}
		// Written when it changes, and every few seconds regardless (a
		// manager wrongly started under the same ID may have taken the
		// key, and removed it on leaving).
		if n++; n%5 == 0 {
			last = ""
		}
		if b, _ := json.Marshal(m.self()); lease != 0 && string(b) != last {
			if _, err := m.opts.Etcd.Put(ctx, key, string(b), clientv3.WithLease(lease)); err == nil {
				last = string(b)
			}
		}
		m.patchEntries.Store(m.group.Leading() && m.allReadPatches(ctx))
		select {
		case <-ctx.Done():
			return
		case _, ok := <-alive:
			if !ok {
				lease, alive = 0, nil
			}
			continue
		case <-tick.C:
		}
	}
}

// Member is one manager of the raft group in GET /admin/v1/managers.
type Member struct {
	ID    string `json:"id"`
	Raft  string `json:"raft"`
	Voter bool   `json:"voter"`
	// Role is "leader" or "follower" as the manager asked knows the
	// leader (its own role for itself); Term and Applied are the member's
	// own account (its record in etcd, refreshed every second); Reported
	// says whether one was found: a member that is down has none once
	// its lease runs out (10 s).
	Role     string `json:"role"`
	Term     uint64 `json:"term,omitempty"`
	Applied  uint64 `json:"applied,omitempty"`
	Reported bool   `json:"reported"`
	// Admin is its console's URL, as its record says.
	Admin string `json:"admin,omitempty"`
}

// MemberChange is the body of POST /admin/v1/managers.
type MemberChange struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

// allReadPatches reports whether every member of the group says, in its
// record, that it reads raft entries of schema 2.
func (m *Manager) allReadPatches(ctx context.Context) bool {
	config, err := m.group.Members()
	if err != nil {
		return false
	}
	resp, err := m.opts.Etcd.Get(ctx, m.membersPrefix(), clientv3.WithPrefix())
	if err != nil {
		return false
	}
	reads := map[string]bool{}
	for _, kv := range resp.Kvs {
		if r, err := topo.Decode[MemberRecord](string(kv.Key), kv.Value); err == nil && r.Entries >= 2 {
			reads[r.ID] = true
		}
	}
	for _, s := range config {
		if !reads[s.ID] {
			return false
		}
	}
	return len(config) > 0
}

// errNotJoinable refuses adding a member that has not said it waits.
var errNotJoinable = errors.New("manager: not a manager waiting to join")

// joinable checks that a manager of this cluster runs with c's raft ID
// at c's address, outside any group (its record in etcd).
func (m *Manager) joinable(ctx context.Context, c MemberChange) error {
	resp, err := m.opts.Etcd.Get(ctx, m.membersPrefix()+c.ID)
	if err != nil {
		return fmt.Errorf("reading %s's record: %w", c.ID, err)
	}
	if len(resp.Kvs) == 1 {
		r, err := topo.Decode[MemberRecord](string(resp.Kvs[0].Key), resp.Kvs[0].Value)
		if err == nil && r.ID == c.ID && r.Raft == c.Addr && r.Role == "none" {
			if r.Entries < 2 && m.patchEntries.Load() {
				return fmt.Errorf("%w: manager %s is of an older build, which cannot read the entries this group writes; upgrade it first", errNotJoinable, c.ID)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: no manager of this cluster reports raft ID %s at %s outside a group; start it first (--raft-id %s --raft-addr %s, an empty --raft-dir, no --raft-peers naming it)",
		errNotJoinable, c.ID, c.Addr, c.ID, c.Addr)
}

// errNoGroup answers membership calls to a manager that is not in one.
const errNoGroup = "this manager is not a member of a raft group (cumulus manager --raft-dir, --raft-addr)"

// members lists the group's configuration as this manager knows it,
// each with its own account.
func (m *Manager) members(ctx context.Context) ([]Member, error) {
	config, err := m.group.Members()
	if err != nil {
		return nil, err
	}
	records := map[string]MemberRecord{}
	if resp, err := m.opts.Etcd.Get(ctx, m.membersPrefix(), clientv3.WithPrefix()); err == nil {
		for _, kv := range resp.Kvs {
			if r, err := topo.Decode[MemberRecord](string(kv.Key), kv.Value); err == nil {
				records[r.ID] = r
			}
		}
	}
	self := m.self()
	records[self.ID] = self
	var out []Member
	for _, s := range config {
		// The role as this member knows the leader (a member's record
		// may be up to a second old, or left by one that died); its own
		// account for the term and applied index.
		mb := Member{ID: s.ID, Raft: s.Addr, Voter: s.Voter, Role: s.Role}
		if r, ok := records[s.ID]; ok {
			mb.Term, mb.Applied, mb.Reported, mb.Admin = r.Term, r.Applied, true, consoleOf(r.Admin, s.Addr)
			if s.Self {
				mb.Role = r.Role
			}
		}
		out = append(out, mb)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (a *admin) managers(w http.ResponseWriter, r *http.Request) {
	if a.m.group == nil {
		writeError(w, http.StatusNotFound, errNoGroup)
		return
	}
	ms, err := a.m.members(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Members []Member `json:"members"`
	}{ms})
}

// changeMembers adds (body given) or removes (id given) a member through
// this manager, which must lead; the change is audited.
func (a *admin) changeMembers(w http.ResponseWriter, r *http.Request, add bool) {
	if a.m.group == nil {
		writeError(w, http.StatusNotFound, errNoGroup)
		return
	}
	var c MemberChange
	if add {
		if err := readBody(r, &c, false); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	} else {
		c.ID = r.PathValue("id")
	}
	if err := raftgroup.ValidID(c.ID); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), a.opts.CommandTimeout)
	defer cancel()
	op, result := "add-manager", c.ID+" at "+c.Addr
	if !add {
		op, result = "remove-manager", c.ID
	}
	audit := func() error {
		entry, _ := entryOf(change{audit: []AuditEntry{{Time: time.Now().UTC(), Op: op, From: r.RemoteAddr, Result: result}}}, nil, time.Now(), a.m.fsm.keep)
		_, err := a.m.group.Apply(ctx, entry)
		return err
	}
	var err error
	if add {
		// Only a manager that runs, with this ID at this address, outside
		// any group, says so in its record: a typo, another service or
		// another cluster's manager is not made a voter.
		if err = a.m.joinable(ctx, c); err == nil {
			if err = a.m.group.Add(ctx, c.ID, c.Addr); err == nil {
				if aerr := audit(); aerr != nil {
					slog.Warn("manager: membership changed, but its audit entry was not committed", "op", op, "id", c.ID, "err", aerr)
				}
			}
		}
	} else if ms, merr := a.m.group.Members(); merr != nil {
		err = merr
	} else if !slices.ContainsFunc(ms, func(s raftgroup.Status) bool { return s.ID == c.ID }) {
		err = fmt.Errorf("%w: %s", raftgroup.ErrNotMember, c.ID)
	} else if err = audit(); err == nil { // the leader may be the one removed: audit first
		err = a.m.group.Remove(ctx, c.ID)
	}
	switch {
	case errors.Is(err, raftgroup.ErrNotLeader):
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%v: send membership changes to the leader", err))
		return
	case errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusGatewayTimeout, fmt.Sprintf("no answer within %s: the change may still be made; list the managers", a.opts.CommandTimeout))
		return
	case errors.Is(err, raftgroup.ErrNotMember):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case errors.Is(err, raftgroup.ErrMember) || errors.Is(err, errNotJoinable):
		writeError(w, http.StatusConflict, err.Error())
		return
	case err != nil && strings.Contains(err.Error(), "raftgroup:"):
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	slog.Info("manager: admin call applied", "op", op, "id", c.ID, "addr", c.Addr, "from", r.RemoteAddr)
	a.managers(w, r)
}

// consoleOf is a member's console URL as its record says, if it is an
// http(s) URL of /console/ on the host of the member's raft address
// (from the group's configuration): a record forged in etcd cannot make
// a console link elsewhere. "" otherwise.
func consoleOf(u, raftAddr string) string {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Path != "/console/" || p.RawQuery != "" || p.User != nil || p.Fragment != "" {
		return ""
	}
	host, _, err := net.SplitHostPort(raftAddr)
	if err != nil || p.Hostname() != host {
		return ""
	}
	return u
}
