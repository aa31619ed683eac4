package manager

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// The managers' state in a raft group (Control plane III): each member
// holds a replicated, the state machine its committed log entries build.
// An entry is what one decision of the leader wrote (raftEntry: the
// models' states that changed, models gone, the cordons, audit entries),
// not the events it decided on: members apply results, so a rolling
// upgrade that changes Decide cannot make two members disagree, and a
// follower needs no clock, repository or shard reports to follow.
//
// Records follow the schema rule (topo.Schema): a "schema" field, fields
// added only as optional, readers refusing a newer schema than they know.

// raftEntrySchema is the newest schema of raftEntry and raftSnapshot
// this build reads. 2: Models, patches of the models' states
// (raftpatch.go), written once every member says it reads them
// (MemberRecord.Entries); schema 1's States are still read.
const raftEntrySchema = 2

// raftSnapshotSchema is raftSnapshot's (whole states, as schema 1
// entries).
const raftSnapshotSchema = 1

// raftEntry is one committed change.
type raftEntry struct {
	Schema int `json:"schema"`
	// At is the leader's clock when it wrote the entry: audit retention by
	// age counts from it, so every member drops the same entries.
	At time.Time `json:"at"`
	// States are the models' states that changed, by name, whole
	// (schema 1).
	States map[string]json.RawMessage `json:"states,omitempty"`
	// Models are the models' states that changed, as patches of the
	// states the entry applies to (schema 2).
	Models map[string]modelPatch `json:"models,omitempty"`
	// Gone are models that left the state.
	Gone []string `json:"gone,omitempty"`
	// Cordons, when set, is the new list of cordoned shards.
	Cordons *[]string `json:"cordons,omitempty"`
	// Audit entries to append.
	Audit []AuditEntry `json:"audit,omitempty"`
	// AuditKeep and AuditMaxAge (seconds) are the audit retention of the
	// leader that wrote the entry: every member keeps what it says, so
	// members started with other flags hold the same log. Zero: the
	// member's own.
	AuditKeep   int   `json:"audit_keep,omitempty"`
	AuditMaxAge int64 `json:"audit_max_age,omitempty"`
}

// AuditRetention bounds the audit log the managers keep: the newest Keep
// entries (default 100,000), none older than MaxAge (default 90 days).
type AuditRetention struct {
	Keep   int
	MaxAge time.Duration
}

func (r AuditRetention) withDefaults() AuditRetention {
	if r.Keep <= 0 {
		r.Keep = 100_000
	}
	if r.MaxAge <= 0 {
		r.MaxAge = 90 * 24 * time.Hour
	}
	return r
}

// replicated is the state machine: the persisted part of State (models
// and cordons) and the audit log. Views it hands out are never modified.
type replicated struct {
	keep AuditRetention

	mu      sync.Mutex
	state   *State // Models and Cordoned only
	audit   []AuditEntry
	seq     uint64 // audit entries ever appended
	applied uint64 // index of the last entry applied
	gen     uint64 // changes of state: entries applied and snapshots restored
	changed chan struct{}
}

func newReplicated(keep AuditRetention) *replicated {
	return &replicated{keep: keep.withDefaults(), state: &State{Models: map[string]*ModelState{}}, changed: make(chan struct{}, 1)}
}

// errEntry marks an entry this build cannot apply; every member refuses
// it alike and the state stays as it was.
var errEntry = errors.New("manager: raft entry refused")

// decodeEntry reads and checks an entry: a known schema, states that are
// models' states under their own names, nothing both changed and gone.
func decodeEntry(b []byte) (raftEntry, map[string]*ModelState, error) {
	e, err := topo.Decode[raftEntry]("raft entry", b)
	if err == nil && e.Schema > raftEntrySchema {
		err = fmt.Errorf("schema %d, this build reads 1 to %d (upgrade it)", e.Schema, raftEntrySchema)
	}
	if err != nil {
		return e, nil, fmt.Errorf("%w: %v", errEntry, err)
	}
	states := make(map[string]*ModelState, len(e.States))
	for name, raw := range e.States {
		ms, err := topo.Decode[ModelState]("raft entry: model "+name, raw)
		if err != nil {
			return e, nil, fmt.Errorf("%w: %v", errEntry, err)
		}
		if ms.Name != name || slices.Contains(e.Gone, name) {
			return e, nil, fmt.Errorf("%w: model state %q filed under %q, or also gone", errEntry, ms.Name, name)
		}
		ms.Schema = ModelStateSchema
		states[name] = &ms
	}
	for name := range e.Models {
		if states[name] != nil || slices.Contains(e.Gone, name) {
			return e, nil, fmt.Errorf("%w: model %q both patched and replaced, or gone", errEntry, name)
		}
	}
	if e.Cordons != nil && len(*e.Cordons) > maxCordons {
		return e, nil, fmt.Errorf("%w: %d cordons, over %d", errEntry, len(*e.Cordons), maxCordons)
	}
	return e, states, nil
}

// Apply applies one committed entry (raft.FSM). It answers the state's
// generation after it (see view), or errEntry for an entry it cannot
// read (the state unchanged).
func (r *replicated) Apply(l *raft.Log) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = l.Index
	if l.Type != raft.LogCommand {
		return r.gen
	}
	e, states, err := decodeEntry(l.Data)
	if err != nil {
		return err
	}
	for _, name := range patchNames(e.Models) {
		ms, err := applyPatch(name, r.state.Models[name], e.Models[name])
		if err != nil {
			return fmt.Errorf("%w: %v", errEntry, err)
		}
		states[name] = ms
	}
	r.gen++
	next := &State{Models: maps.Clone(r.state.Models), Cordoned: r.state.Cordoned}
	maps.Copy(next.Models, states)
	for _, name := range e.Gone {
		delete(next.Models, name)
	}
	if e.Cordons != nil {
		next.Cordoned = slices.Compact(slices.Sorted(slices.Values(*e.Cordons)))
	}
	r.state = next
	keep := r.keep
	if e.AuditKeep > 0 && e.AuditMaxAge > 0 {
		keep = AuditRetention{Keep: e.AuditKeep, MaxAge: time.Duration(e.AuditMaxAge) * time.Second}
	}
	r.appendAudit(e.At, e.Audit, keep)
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return r.gen
}

// appendAudit appends entries and drops those past retention, counting
// age from at (the entry's time, the same on every member).
func (r *replicated) appendAudit(at time.Time, entries []AuditEntry, keep AuditRetention) {
	r.audit = append(r.audit, entries...)
	r.seq += uint64(len(entries))
	drop := max(0, len(r.audit)-keep.Keep)
	for drop < len(r.audit) && at.Sub(r.audit[drop].Time) > keep.MaxAge {
		drop++
	}
	if drop > 0 {
		r.audit = slices.Delete(r.audit, 0, drop)
	}
}

// view is the replicated state now, models and cordons (no shard or
// router reports), and its generation: it changes with every entry
// applied and every snapshot restored, so equal generations mean the
// same state.
func (r *replicated) view() (*State, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state, r.gen
}

// audited is how many audit entries were ever appended.
func (r *replicated) audited() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// readAudit returns up to limit of the newest audit entries, oldest
// first.
func (r *replicated) readAudit(limit int64) []AuditEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(int64(len(r.audit)), max(limit, 0))
	return slices.Clone(r.audit[int64(len(r.audit))-n:])
}

// raftSnapshot is the whole state machine, as a snapshot holds it.
type raftSnapshot struct {
	Schema   int                    `json:"schema"`
	Models   map[string]*ModelState `json:"models"`
	Cordoned []string               `json:"cordoned,omitempty"`
	Audit    []AuditEntry           `json:"audit,omitempty"`
	AuditSeq uint64                 `json:"audit_seq"`
}

// Snapshot captures the state (raft.FSM); writing it happens off the
// apply path, from the values captured here, which are never modified.
func (r *replicated) Snapshot() (raft.FSMSnapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return raftSnapshot{Schema: raftSnapshotSchema, Models: r.state.Models, Cordoned: r.state.Cordoned,
		Audit: slices.Clone(r.audit), AuditSeq: r.seq}, nil
}

func (s raftSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (raftSnapshot) Release() {}

// maxSnapshotBytes bounds a snapshot read back: far above what the
// bounded state takes (models' states under 256 KiB each, the audit log
// bounded by AuditRetention).
const maxSnapshotBytes = 1 << 30

// Restore replaces the state with a snapshot's (raft.FSM).
func (r *replicated) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxSnapshotBytes+1))
	if err != nil {
		return fmt.Errorf("manager: reading a raft snapshot: %w", err)
	}
	if len(b) > maxSnapshotBytes {
		return fmt.Errorf("manager: a raft snapshot over %d bytes", maxSnapshotBytes)
	}
	s, err := topo.Decode[raftSnapshot]("raft snapshot", b)
	if err == nil && s.Schema > raftSnapshotSchema {
		err = fmt.Errorf("raft snapshot: schema %d, this build reads 1 to %d (upgrade it)", s.Schema, raftSnapshotSchema)
	}
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	models := map[string]*ModelState{}
	for name, ms := range s.Models {
		if ms == nil || ms.Name != name {
			return fmt.Errorf("manager: raft snapshot: model state filed under %q is not that model's", name)
		}
		ms.Schema = ModelStateSchema
		models[name] = ms
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state = &State{Models: models, Cordoned: slices.Compact(slices.Sorted(slices.Values(s.Cordoned)))}
	r.audit, r.seq = s.Audit, s.AuditSeq
	r.gen++
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

// entryOf is the raft entry that persists c, written at at by a leader
// keeping the audit log as keep says (zero: as each member's flags say).
func entryOf(c change, cordoned []string, at time.Time, keep AuditRetention) ([]byte, error) {
	e := raftEntry{Schema: 1, At: at, Gone: c.gone, Audit: c.audit}
	if len(c.patches) > 0 {
		e.Schema, e.Models = 2, c.patches
	}
	if keep.Keep > 0 && keep.MaxAge > 0 {
		e.AuditKeep, e.AuditMaxAge = keep.Keep, int64(keep.MaxAge/time.Second)
	}
	if len(c.states) > 0 {
		e.States = make(map[string]json.RawMessage, len(c.states))
		for name, b := range c.states {
			e.States[name] = b
		}
	}
	if c.cordons != nil {
		cs := slices.Clone(cordoned)
		if cs == nil {
			cs = []string{}
		}
		e.Cordons = &cs
	}
	return json.Marshal(e)
}
