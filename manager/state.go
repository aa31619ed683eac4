package manager

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// Phase is where one version of a model stands.
type Phase string

// A version is discovered in the repository, validated (its files
// against its manifest, its chain down to a full version), then rejected
// or ready. The version to serve is staged on the shards, committed live
// once every assigned replica holds it, and when another version goes
// live it stays loaded as standby for rollback, until the keep policy
// retires it: it then leaves the state (see ModelState.Floor).
const (
	PhaseDiscovered Phase = "discovered" // queued for validation
	PhaseValidating Phase = "validating"
	PhaseRejected   Phase = "rejected"
	PhaseReady      Phase = "ready"
	PhaseStaging    Phase = "staging"
	PhaseLive       Phase = "live"
	PhaseCanary     Phase = "canary" // served to a share of the traffic beside the live version
	PhaseStandby    Phase = "standby"
	PhaseRetired    Phase = "retired" // only on its way out of the state
)

// valid reports whether a version in phase p passed validation.
func (p Phase) valid() bool {
	switch p {
	case PhaseReady, PhaseStaging, PhaseLive, PhaseCanary, PhaseStandby, PhaseRetired:
		return true
	}
	return false
}

func (p Phase) pending() bool { return p == PhaseDiscovered || p == PhaseValidating }

// Version is the manager's record of one version.
type Version struct {
	Version uint64 `json:"version"`
	Kind    string `json:"kind,omitempty"`
	Parent  uint64 `json:"parent,omitempty"`
	Phase   Phase  `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	// Files fingerprints the version's files as last scanned; Checked is
	// the fingerprint its validation ran on. A rejected version whose
	// Files change is validated again.
	Files   string `json:"files,omitempty"`
	Checked string `json:"checked,omitempty"`
	// Gone: the version's directory left the repository while it was live.
	Gone bool `json:"gone,omitempty"`
	// Damaged: the files of this validated version changed after
	// validation and no longer hold the validated content (shards keep
	// serving the copies they verified; none can load it again).
	Damaged bool `json:"damaged,omitempty"`
	// Broken says why the version's chain can no longer be loaded: a
	// version of it, gone from the state, was removed or changed in the
	// repository. Like Gone, it is then no target, nor a rollback's.
	Broken string `json:"broken,omitempty"`
	// Info is set once the version's own files are verified.
	Info  *topo.VersionInfo `json:"info,omitempty"`
	Bytes int64             `json:"bytes,omitempty"` // its own files' size
	// LiveSeq orders versions by when they last went live (0: never).
	LiveSeq uint64 `json:"live_seq,omitempty"`
	// KeptSince is the model's Seq since which the version has been kept
	// loaded (live, staged or standby) without a break.
	KeptSince uint64 `json:"kept_since,omitempty"`
	// HeldAt is when every assigned shard came to hold the staged
	// version (zero: they do not, yet): routers that cannot score it hold
	// its commit back for Policy.RouterWait from then. (They fetch what
	// they need from the shards that hold it.)
	HeldAt time.Time `json:"held_at,omitzero"`
	// Gates are the validation gates' outcomes, as last run.
	Gates []GateResult `json:"gates,omitempty"`
	// Golden: the version has golden requests of its own
	// (golden.jsonl), which the golden gate sends.
	Golden bool `json:"golden,omitempty"`
	// Accepted: an operator accepted the version (OpAccept) after these
	// gates failed on it; they run again and are recorded, but do not
	// reject it.
	Accepted *Acceptance `json:"accepted,omitempty"`
	// Gating: the staged version's gates are running (not persisted: a
	// manager that takes over runs them again).
	Gating bool `json:"-"`
}

// Acceptance is an operator's acceptance of a rejected version.
type Acceptance struct {
	Gates  []string `json:"gates"`  // the gates that had failed
	Reason string   `json:"reason"` // the operator's
}

// GateResult is one validation gate's outcome on a version.
type GateResult struct {
	Gate string `json:"gate"` // GateFinite
	// Outcome is "passed", "failed", "skipped" (nothing to check it
	// against), "accepted" (failed; an operator accepted the version), or
	// "error" (it could not run: the version waits, and it runs again).
	Outcome string    `json:"outcome"`
	Reason  string    `json:"reason,omitempty"`
	At      time.Time `json:"at"`
	// Took is how long the gate ran (0 for the finite gate, which runs
	// within the files' verification).
	Took time.Duration `json:"took,omitempty"`
}

// Validation gates.
const (
	// GateFinite: no NaN or infinite parameter (a delta's deletion marker
	// excepted), checked while the files are verified.
	GateFinite = "finite"
	// GateValidator: the operator's program (--validator), run on the
	// version's directory once every shard holds it, before it is
	// committed.
	GateValidator = "validator"
	// GateGolden: the version's golden requests, sent to it staged, get
	// the scores they want (within a tolerance).
	GateGolden = "golden"
	// GateHoldout: the version's mean log-loss on the model's hold-out
	// set exceeds the live version's by at most a margin.
	GateHoldout = "holdout"
)

// ModelStateSchema is the schema ModelState records are written with (see
// topo.Schema). 2: Floor, and VersionInfo's compact form; a schema 1
// reader would find retired versions again and drop Floor.
const ModelStateSchema = 2

// ModelState is everything the manager knows and intends for one model:
// persisted, and replayable through Decide. It keeps only what can still
// be served, staged or rolled back to, so its size is bounded by the keep
// policy, never by the repository's history.
type ModelState struct {
	Schema int    `json:"schema"`
	Name   string `json:"name"`
	// Floor: a version at or below it that Versions does not list has
	// left the state (retired, or rejected long ago) and is ignored when
	// scanned. Versions are numbered above the repository's high-water
	// mark, so no new version is ever at or below it.
	Floor uint64 `json:"floor,omitempty"`
	// Chained holds, for versions gone from the state that a kept
	// version's chain needs, the fingerprint of their files as validated:
	// a scan that finds one removed or changed marks the versions whose
	// chains need it Broken.
	Chained map[uint64]string `json:"chained,omitempty"`
	// Partitions is fixed by the model's first valid version; a version
	// with another count is rejected.
	Partitions uint32 `json:"partitions,omitempty"`
	// Pin is the operator's intent: 0 follows the newest valid version.
	Pin uint64 `json:"pin,omitempty"`
	// Canary is the operator's canary (OpCanary): while set, the live
	// version does not move on by itself.
	Canary   *Canary    `json:"canary,omitempty"`
	Live     uint64     `json:"live,omitempty"`
	Staged   uint64     `json:"staged,omitempty"`
	Replicas [][]string `json:"replicas,omitempty"` // as last published
	LiveSeq  uint64     `json:"live_seq,omitempty"` // commits so far
	// Seq counts changes of the model's serving map record; PlaceSeq is
	// the Seq since which Replicas have not changed.
	Seq      uint64    `json:"seq,omitempty"`
	PlaceSeq uint64    `json:"place_seq,omitempty"`
	Versions []Version `json:"versions"` // ascending
}

func (m *ModelState) version(v uint64) *Version {
	if v == 0 {
		return nil
	}
	i, ok := slices.BinarySearchFunc(m.Versions, v, func(x Version, v uint64) int { return cmp.Compare(x.Version, v) })
	if !ok {
		return nil
	}
	return &m.Versions[i]
}

func (m *ModelState) clone() *ModelState {
	n := *m
	n.Schema = ModelStateSchema // what this build writes, whoever wrote what it read
	n.Versions = slices.Clone(m.Versions)
	n.Replicas = slices.Clone(m.Replicas)
	n.Chained = maps.Clone(m.Chained)
	if m.Canary != nil {
		c := *m.Canary
		n.Canary = &c
	}
	return &n
}

// Standby lists the standby versions, most recently live first.
func (m *ModelState) Standby() []uint64 {
	var vs []*Version
	for i := range m.Versions {
		if m.Versions[i].Phase == PhaseStandby {
			vs = append(vs, &m.Versions[i])
		}
	}
	slices.SortFunc(vs, func(a, b *Version) int { return cmp.Compare(b.LiveSeq, a.LiveSeq) })
	out := make([]uint64, len(vs))
	for i, v := range vs {
		out[i] = v.Version
	}
	return out
}

// State is the manager's whole state: the models (persisted) and the
// shards' latest reports (not persisted: they come back from etcd; nil
// until they have, and nothing is placed or committed meanwhile).
type State struct {
	Models map[string]*ModelState
	Shards map[string]topo.ShardInfo
	// Cordoned lists, sorted, the shards an operator cordoned
	// (OpCordon): they are given nothing, and keep serving what they hold
	// until its replicas are loaded elsewhere. Persisted.
	Cordoned []string
	// pending are actions settle decided (the gates to run), which
	// Decide returns.
	pending []Action
	// replicaBytes is budgetTotal as first computed by this Decide (-1:
	// nothing sized; 0: not computed), kept only while deciding (a State
	// Decide returned is shared, and never written).
	replicaBytes int64
	deciding     bool
	// Routers are the routers' latest registrations (not persisted; nil:
	// not tracked, see routersScore).
	Routers map[string]topo.RouterInfo
}

// Policy is the configuration Decide follows.
type Policy struct {
	// Replicas is how many shards hold each partition.
	Replicas int
	// KeepVersions is how many full versions besides the live one stay
	// loaded as standby, with their deltas.
	KeepVersions int
	// KeepDeltas is how many deltas on each kept full version stay
	// standby (the newest).
	KeepDeltas int
	// RouterWait is how long a router that cannot score a staged version
	// holds its commit back once the shards hold it (0: for ever).
	RouterWait time.Duration
	// Now is the decision's time: for RouterWait, and HeldAt.
	Now time.Time
	// StagedGates are the gates run on a staged version once every shard
	// holds it and every router can score it, before it is committed
	// (GateValidator); a version failing one is rejected.
	StagedGates []string
	// Holdout lists the models with a hold-out set (GateHoldout).
	Holdout []string
	// MaxMoves bounds the partitions of a model moving onto one shard at
	// once (0: no bound); see limitMoves.
	MaxMoves int
}

// keepRejected is how many rejected versions a model keeps listed, with
// their reasons (the newest).
const keepRejected = 10

// Event is an input to Decide.
type Event interface{ isEvent() }

// Scanned is a listing of the whole repository: every model's versions.
// A model or version missing from it has left the repository.
type Scanned struct {
	Models map[string][]Found
	// Listed is every version directory of each model, with its
	// fingerprint where one was taken ("" for versions gone from the
	// state, unless a kept chain needs them). Nil: not given (every
	// version is in Models).
	Listed map[string]map[uint64]string
}

// Found is one version directory as scanned.
type Found struct {
	Version uint64
	Kind    string
	Parent  uint64
	Files   string // fingerprint of its manifest and files
	Err     string // the manifest could not be read or is invalid
}

// Started says validation of a version began.
type Started struct {
	Model   string
	Version uint64
}

// Checked is a validation's result: Err, or Info and Bytes.
type Checked struct {
	Model   string
	Version uint64
	Files   string // the fingerprint validated
	Err     string
	Info    *topo.VersionInfo
	Bytes   int64
	Gates   []GateResult // the gates that ran
	Golden  bool         // the version has golden requests
}

// ShardsChanged carries the shards' latest registrations.
type ShardsChanged struct{ Shards map[string]topo.ShardInfo }

// RoutersChanged carries the routers' latest registrations (or comes
// again with the same, when a router's wait runs out).
type RoutersChanged struct{ Routers map[string]topo.RouterInfo }

// GatesChecked carries the outcomes of a staged version's gates
// (RunGates).
type GatesChecked struct {
	Model   string
	Version uint64
	Results []GateResult
}

// Command is an operator's call through the admin API.
type Command struct {
	Op      string // OpRollback, OpPin, OpUnpin, OpRescan, OpPrune, OpAccept, OpCanary, OpCanaryOff, OpPromote, OpCordon, OpUncordon
	Shard   string // cordon, uncordon: the shard
	Model   string
	Version uint64 // rollback: the version to go to (0: the most recent standby); pin: the version
	At      time.Time
	From    string // the caller's address, for the audit log
	// Expect is the live version a rollback, pin or unpin acts on (the
	// admin API requires it): when the model's live version is another,
	// the call is refused (LiveMovedError) rather than undo what another
	// operator just did. Nil: not checked.
	Expect *uint64
	// Prune: Keep is how many removable versions to keep (the newest);
	// Listed is every version of the model in the repository, listed just
	// before; ReadOnly says why the manager cannot write to the
	// repository ("" when it can).
	Keep     int
	Listed   []uint64
	ReadOnly string
	// Reason is the operator's, for an accept (audited).
	Reason string
	// Fraction is a canary's share of the traffic.
	Fraction float64
}

// LiveMovedError refuses a call made against a live version that is no
// longer live. It is an ErrConflict.
type LiveMovedError struct {
	Model          string
	Live, Expected uint64
}

func (e *LiveMovedError) Error() string {
	now := "is live at " + strconv.FormatUint(e.Live, 10)
	if e.Live == 0 {
		now = "has nothing live"
	}
	return fmt.Sprintf("%v: model %s %s, not %s as the call expected: another call changed it; look again (cumulus admin show %s) before acting",
		ErrConflict, e.Model, now, versionName(e.Expected), e.Model)
}

func (e *LiveMovedError) Is(target error) bool { return target == ErrConflict }

// versionName is v, or "none" for 0.
func versionName(v uint64) string {
	if v == 0 {
		return "none"
	}
	return strconv.FormatUint(v, 10)
}

// Command operations.
const (
	OpRollback = "rollback"
	OpPin      = "pin"
	OpUnpin    = "unpin"
	OpRescan   = "rescan"
	OpPrune    = "prune"
	// OpAccept accepts a version the staged gates rejected: it is
	// validated again, and the gates that failed run again but do not
	// reject it.
	OpAccept = "accept"
	// OpCanary gives Version, once staged and gated, Fraction of the
	// model's unpinned requests; OpCanaryOff takes it away; OpPromote
	// makes the serving canary live.
	OpCanary    = "canary"
	OpCanaryOff = "canary-off"
	OpPromote   = "promote"
	// OpCordon gives shard Shard nothing new, and moves what it holds
	// to other shards (make before break); OpUncordon undoes it.
	OpCordon   = "cordon"
	OpUncordon = "uncordon"
)

func (Scanned) isEvent()        {}
func (Started) isEvent()        {}
func (Checked) isEvent()        {}
func (ShardsChanged) isEvent()  {}
func (RoutersChanged) isEvent() {}
func (GatesChecked) isEvent()   {}
func (Command) isEvent()        {}

// Action is an output of Decide for the manager to carry out.
type Action interface{ isAction() }

// Validate asks for a version's files and chain to be checked; the
// result comes back as Checked.
type Validate struct {
	Model   string
	Version uint64
}

// RunGates asks for a staged version's gates to run (off the main loop);
// their outcomes come back as GatesChecked.
type RunGates struct {
	Model   string
	Version uint64
	Live    uint64 // the live version, for gates that compare (0: none)
	Gates   []string
}

// AuditEntry records one operator call and its result.
type AuditEntry struct {
	Time    time.Time `json:"time"`
	Op      string    `json:"op"`
	Model   string    `json:"model,omitempty"`
	Version uint64    `json:"version,omitempty"`
	From    string    `json:"from,omitempty"`
	Shard   string    `json:"shard,omitempty"`
	Reason  string    `json:"reason,omitempty"` // the operator's (accept)
	Result  string    `json:"result"`
}

// Remove asks for version directories to be removed from the repository
// (a prune), once the decision is persisted.
type Remove struct {
	Model    string
	Versions []uint64
}

func (Validate) isAction()   {}
func (Remove) isAction()     {}
func (AuditEntry) isAction() {}
func (RunGates) isAction()   {}

// Errors a Command can be refused with, and ErrUnconfirmed for one whose
// result could not be written.
var (
	ErrNotFound    = errors.New("manager: not found")
	ErrConflict    = errors.New("manager: conflict")
	ErrInvalid     = errors.New("manager: invalid request")
	ErrUnconfirmed = errors.New("manager: not confirmed: the write to etcd failed or did not answer in time, and may still take effect; check show and audit before retrying")
)

// Decide applies one event to the state: a pure, deterministic function
// (no clock, no I/O), so tests replay scenarios event by event. It
// returns the next state (s is not changed), the actions to carry out,
// and for a refused Command the reason (the audit entry is among the
// actions either way).
//
// An event about one model (a validation's progress, an operator's call
// on it) copies and settles that model only: the next state shares every
// other model with s, unchanged, so what an event costs — here and in
// what the manager then writes — does not grow with the other models.
func Decide(s *State, ev Event, p Policy) (*State, []Action, error) {
	n := &State{Models: maps.Clone(s.Models), Shards: s.Shards, Routers: s.Routers, Cordoned: s.Cordoned}
	if n.Models == nil {
		n.Models = map[string]*ModelState{}
	}
	n.deciding = true // n is Decide's own until it returns: budgetTotal may keep its sum in it
	defer func() { n.deciding, n.replicaBytes = false, 0 }()
	touched := slices.Sorted(maps.Keys(s.Models))
	switch ev := ev.(type) {
	case Started:
		touched = []string{ev.Model}
	case Checked:
		touched = []string{ev.Model}
	case GatesChecked:
		touched = []string{ev.Model}
	case Command:
		if ev.Model != "" {
			touched = []string{ev.Model}
		}
	case Scanned:
		for name := range ev.Models {
			if s.Models[name] == nil {
				touched = append(touched, name)
			}
		}
		slices.Sort(touched)
	}
	for _, name := range touched {
		if m := s.Models[name]; m != nil {
			n.Models[name] = m.clone()
		}
	}
	var acts []Action
	var err error
	switch ev := ev.(type) {
	case Scanned:
		acts = n.scanned(ev)
	case Started:
		if v := n.version(ev.Model, ev.Version); v != nil && v.Phase == PhaseDiscovered {
			v.Phase = PhaseValidating
		}
	case Checked:
		n.checked(ev)
	case ShardsChanged:
		n.Shards = ev.Shards
	case RoutersChanged:
		n.Routers = ev.Routers
	case GatesChecked:
		n.gatesChecked(ev)
	case Command:
		acts, err = n.command(ev)
		if err != nil {
			return s, append(acts, audit(ev, err.Error())), err
		}
	default:
		panic(fmt.Sprintf("manager: unknown event %T", ev))
	}
	for _, name := range touched {
		if m := n.Models[name]; m != nil {
			n.settle(m, p)
			m.count(s.Models[name])
		}
	}
	acts = append(acts, n.pending...)
	n.pending = nil
	if c, ok := ev.(Command); ok {
		result := "ok"
		if m := n.Models[c.Model]; c.Op == OpPrune {
			result = "ok: nothing to remove"
			for _, a := range acts {
				if r, ok := a.(Remove); ok {
					result = "ok: removed " + list(r.Versions)
				}
			}
		} else if m != nil {
			result = fmt.Sprintf("ok: live %d", m.Live)
			if m.Live == 0 {
				result = "ok: nothing live yet"
			}
			if m.Staged != 0 {
				result += fmt.Sprintf(", staged %d", m.Staged)
			}
			if c := m.Canary; c != nil {
				result += fmt.Sprintf(", canary %d at %g", c.Version, c.Fraction)
			}
		}
		acts = append(acts, audit(c, result))
	}
	return n, acts, nil
}

func audit(c Command, result string) AuditEntry {
	return AuditEntry{Time: c.At, Op: c.Op, Model: c.Model, Version: c.Version, From: c.From, Shard: c.Shard, Reason: c.Reason, Result: result}
}

func (s *State) version(model string, v uint64) *Version {
	if m := s.Models[model]; m != nil {
		return m.version(v)
	}
	return nil
}

// scanned records what the repository holds now: new versions are queued
// for validation, rejected ones whose files changed are queued again,
// and versions that left the repository are forgotten (a live one stays
// live, marked gone, until another version replaces it).
func (s *State) scanned(ev Scanned) []Action {
	var acts []Action
	for _, name := range slices.Sorted(maps.Keys(ev.Models)) {
		if s.Models[name] == nil {
			s.Models[name] = &ModelState{Schema: ModelStateSchema, Name: name}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Models)) {
		m := s.Models[name]
		found := map[uint64]Found{}
		for _, f := range ev.Models[name] {
			found[f.Version] = f
		}
		kept := m.Versions[:0:0]
		for _, v := range m.Versions {
			if _, ok := found[v.Version]; ok {
				kept = append(kept, v)
				continue
			}
			switch {
			case v.Version == m.Live:
				v.Gone, v.Reason = true, "removed from the repository"
				kept = append(kept, v)
			case v.Version == m.Staged:
				m.Staged = 0
			}
		}
		m.Versions = kept
		if _, listed := ev.Models[name]; !listed && len(m.Versions) == 0 && m.Live == 0 {
			delete(s.Models, name) // its directory left, and nothing of it is served
			continue
		}
		for _, vn := range slices.Sorted(maps.Keys(found)) {
			f := found[vn]
			v := m.version(vn)
			if v == nil && vn <= m.Floor {
				continue // left the state
			}
			if v == nil {
				m.Versions = append(m.Versions, Version{Version: vn, Kind: f.Kind, Parent: f.Parent, Phase: PhaseDiscovered, Files: f.Files})
				slices.SortFunc(m.Versions, func(a, b Version) int { return cmp.Compare(a.Version, b.Version) })
				v = m.version(vn)
			} else if v.Files == f.Files && !v.Phase.pending() {
				if v.Gone {
					v.Gone, v.Reason = false, ""
				}
				continue
			} else if v.Files != f.Files && v.Phase.valid() {
				// Files of a validated version changed under it. Shards
				// serve their own verified copies and refuse content other
				// than validated; check the files again to say what changed.
				v.Files, v.Gone, v.Reason = f.Files, false, "files changed after validation; checking them again (shards keep serving what they verified)"
				acts = append(acts, Validate{Model: name, Version: vn})
				continue
			}
			v.Files, v.Kind, v.Parent, v.Gone = f.Files, f.Kind, f.Parent, false
			if f.Err != "" {
				v.Phase, v.Reason, v.Checked, v.Info = PhaseRejected, f.Err, f.Files, nil
				continue
			}
			if v.Phase != PhaseValidating {
				v.Phase, v.Reason, v.Info = PhaseDiscovered, "", nil
			}
			acts = append(acts, Validate{Model: name, Version: vn})
		}
		if listed := ev.Listed[name]; listed != nil {
			acts = append(acts, m.checkChains(listed)...)
		}
	}
	return acts
}

// breakChains marks Broken the versions whose chains need damaged
// version c (checkChains clears the mark on a scan once c is repaired).
func (m *ModelState) breakChains(c uint64) {
	for i := range m.Versions {
		if v := &m.Versions[i]; v.Version != c && v.Info != nil && slices.Contains(v.Info.Chain, c) {
			v.Broken = fmt.Sprintf("the files of version %d of its chain changed after validation", c)
		}
	}
}

// checkChains marks Broken the validated versions whose chain needs a
// version that listed (the repository, as scanned) no longer holds, or
// holds with other files than validated (a version in the state:
// Damaged); and clears the mark once it is back as it was. A version gone
// from the state whose fingerprint changed is validated again (a touch
// changes a fingerprint, not the content): checked marks what it breaks,
// or takes the new fingerprint.
func (m *ModelState) checkChains(listed map[uint64]string) []Action {
	var acts []Action
	for c, kept := range m.Chained {
		switch got := listed[c]; {
		case got == "" || m.version(c) != nil:
		case got != chainedPrint(kept):
			acts = append(acts, Validate{Model: m.Name, Version: c})
		case strings.HasSuffix(kept, brokenMark):
			m.Chained[c] = strings.TrimSuffix(kept, brokenMark) // back as validated
		}
	}
	slices.SortFunc(acts, func(a, b Action) int { return cmp.Compare(a.(Validate).Version, b.(Validate).Version) })
	for i := range m.Versions {
		v := &m.Versions[i]
		if !v.Phase.valid() || v.Info == nil {
			continue
		}
		v.Broken = ""
		for _, c := range v.Info.Chain {
			if c == v.Version {
				continue
			}
			_, ok := listed[c]
			x := m.version(c)
			switch {
			case !ok:
				v.Broken = fmt.Sprintf("version %d of its chain was removed from the repository", c)
			case x != nil && x.Damaged || x == nil && strings.HasSuffix(m.Chained[c], brokenMark):
				v.Broken = fmt.Sprintf("the files of version %d of its chain changed after validation", c)
			}
			if v.Broken != "" {
				break
			}
		}
	}
	return acts
}

// A Chained entry is "FINGERPRINT IDS" — the files' fingerprint and a
// digest of the partition identities, as validated — with brokenMark
// appended once a validation found the files no longer hold that.
const brokenMark = " broken"

func chainedEntry(files string, ids []string) string {
	return files + " " + idsDigest(ids)
}

func chainedPrint(entry string) string { p, _, _ := strings.Cut(entry, " "); return p }

func idsDigest(ids []string) string {
	h := sha256.New()
	for _, id := range ids {
		io.WriteString(h, id+"\n")
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// checkedChained records a validation of c, a version gone from the
// state that kept chains need: the same content (by identities) under a
// new fingerprint is taken; anything else breaks the versions built on
// it.
func (m *ModelState) checkedChained(ev Checked) {
	entry := m.Chained[ev.Version]
	_, ids, _ := strings.Cut(strings.TrimSuffix(entry, brokenMark), " ")
	if ev.Err == "" && ev.Info != nil && idsDigest(ev.Info.IDs) == ids {
		m.Chained[ev.Version] = ev.Files + " " + ids
		for i := range m.Versions {
			if v := &m.Versions[i]; v.Info != nil && slices.Contains(v.Info.Chain, ev.Version) && strings.Contains(v.Broken, fmt.Sprintf("version %d of", ev.Version)) {
				v.Broken = ""
			}
		}
		return
	}
	m.Chained[ev.Version] = strings.TrimSuffix(entry, brokenMark) + brokenMark
	m.breakChains(ev.Version)
}

// checked records a validation's result, unless the files changed since
// it started (a newer Validate is then on its way).
func (s *State) checked(ev Checked) {
	m := s.Models[ev.Model]
	v := s.version(ev.Model, ev.Version)
	if v == nil && m != nil && m.Chained[ev.Version] != "" {
		m.checkedChained(ev)
		return
	}
	if v == nil || v.Files != ev.Files {
		return
	}
	if v.Phase.valid() { // checked again after its files changed; what is served does not change
		switch {
		case ev.Err != "":
			v.Reason, v.Damaged = "files changed after validation and no longer match their manifest (shards keep serving what they verified): "+ev.Err, true
			m.breakChains(ev.Version)
		case ev.Info == nil || v.Info == nil || !slices.Equal(ev.Info.IDs, v.Info.IDs):
			v.Reason, v.Damaged = "the version's content was replaced after validation; shards serve and load only what was validated; publish new content as a new version", true
			m.breakChains(ev.Version)
		default:
			v.Reason, v.Checked, v.Damaged = "", ev.Files, false
		}
		return
	}
	if !v.Phase.pending() {
		return
	}
	v.Checked, v.Gates, v.Golden = ev.Files, ev.Gates, ev.Golden
	if ev.Err != "" {
		v.Phase, v.Reason, v.Info = PhaseRejected, ev.Err, nil
		return
	}
	if ev.Info == nil {
		v.Phase, v.Reason = PhaseRejected, "validation gave no metadata"
		return
	}
	parts := uint32(len(ev.Info.IDs))
	if m.Partitions != 0 && parts != m.Partitions {
		v.Phase, v.Reason = PhaseRejected, fmt.Sprintf("has %d partitions; model %s has %d (fixed per model)", parts, m.Name, m.Partitions)
		return
	}
	info := *ev.Info
	v.Info, v.Bytes, v.Phase, v.Reason = &info, ev.Bytes, PhaseValidating, ""
}

// command applies an operator's call.
func (s *State) command(c Command) ([]Action, error) {
	switch c.Op {
	case OpCordon, OpUncordon:
		return nil, s.cordon(c)
	}
	if c.Op == OpRescan {
		var acts []Action
		for _, name := range slices.Sorted(maps.Keys(s.Models)) {
			m := s.Models[name]
			for i := range m.Versions {
				if v := &m.Versions[i]; v.Phase == PhaseRejected {
					acts = append(acts, m.rediscover(v))
				}
			}
		}
		return acts, nil
	}
	m := s.Models[c.Model]
	if m == nil {
		return nil, fmt.Errorf("%w: model %q", ErrNotFound, c.Model)
	}
	if c.Expect != nil && *c.Expect != m.Live {
		return nil, &LiveMovedError{Model: m.Name, Live: m.Live, Expected: *c.Expect}
	}
	switch c.Op {
	case OpPrune:
		return m.prune(c)
	case OpAccept:
		return m.accept(c)
	case OpCanary:
		return nil, m.setCanary(c)
	case OpCanaryOff:
		return nil, m.canaryOff()
	case OpPromote:
		return nil, m.promote()
	case OpUnpin:
		m.Pin = 0
	case OpPin:
		v := m.version(c.Version)
		switch {
		case v == nil && c.Version <= m.Floor:
			return nil, fmt.Errorf("%w: model %s version %d is retired: the manager no longer keeps it (see --keep-versions and --keep-deltas); publish its content as a new version to serve it again (versions kept: %s)", ErrConflict, m.Name, c.Version, list(m.numbers()))
		case v == nil:
			return nil, fmt.Errorf("%w: model %s has no version %d in the repository (versions: %s)", ErrConflict, m.Name, c.Version, list(m.numbers()))
		case !v.Phase.valid():
			why := v.Reason
			if why == "" {
				why = "not validated yet"
			}
			return nil, fmt.Errorf("%w: model %s version %d is %s: %s", ErrConflict, m.Name, c.Version, v.Phase, why)
		case v.Gone && c.Version != m.Live:
			return nil, fmt.Errorf("%w: model %s version %d was removed from the repository", ErrConflict, m.Name, c.Version)
		case v.Broken != "" && c.Version != m.Live:
			return nil, fmt.Errorf("%w: model %s version %d cannot be loaded: %s", ErrConflict, m.Name, c.Version, v.Broken)
		}
		m.Pin = c.Version
		m.dropCanary()
	case OpRollback:
		kept := m.Standby()
		to := c.Version
		if to == 0 {
			loadable := slices.DeleteFunc(slices.Clone(kept), func(v uint64) bool { x := m.version(v); return x.Gone || x.Broken != "" })
			if len(loadable) == 0 {
				return nil, fmt.Errorf("%w: model %s has no standby version to roll back to (live %d; standby that cannot be loaded: %s)", ErrConflict, m.Name, m.Live, list(kept))
			}
			to = loadable[0]
		} else if !slices.Contains(kept, to) {
			why := "it is not kept for rollback"
			switch v := m.version(to); {
			case v == nil && to <= m.Floor:
				why = "it is retired (no longer kept; see --keep-versions and --keep-deltas)"
			case v == nil:
				why = "the repository has no such version"
			case v.Phase == PhaseRejected:
				why = "it was rejected: " + v.Reason
			case to == m.Live:
				why = "it is the live version"
			}
			return nil, fmt.Errorf("%w: model %s version %d: %s; standby versions: %s", ErrConflict, m.Name, to, why, list(kept))
		}
		if v := m.version(to); v.Gone || v.Broken != "" {
			why := cmp.Or(v.Broken, "it was removed from the repository")
			return nil, fmt.Errorf("%w: model %s version %d cannot be loaded: %s; standby versions: %s", ErrConflict, m.Name, to, why, list(kept))
		}
		m.Pin = to
		m.dropCanary()
	default:
		return nil, fmt.Errorf("%w: unknown operation %q", ErrInvalid, c.Op)
	}
	return nil, nil
}

// prune decides which version directories to remove: of the versions
// in the repository, every one outside the protected set (live, staged,
// pinned, standby, awaiting validation, ready and newer than the live
// one, and every version their chains need), keeping the c.Keep newest. A version above the floor that the
// state does not list is unknown yet (just published): never removed.
func (m *ModelState) prune(c Command) ([]Action, error) {
	if c.ReadOnly != "" {
		return nil, fmt.Errorf("%w: the manager cannot write to the repository (%s); prune needs write access", ErrConflict, c.ReadOnly)
	}
	if c.Keep < 0 {
		return nil, fmt.Errorf("%w: keep must be ≥ 0", ErrInvalid)
	}
	protected := map[uint64]bool{}
	need := func(v uint64) {
		for v != 0 && !protected[v] {
			protected[v] = true
			x := m.version(v)
			if x == nil {
				return
			}
			if x.Info != nil {
				for _, c := range x.Info.Chain {
					protected[c] = true
				}
				return
			}
			v = x.Parent
		}
	}
	for _, v := range append([]uint64{m.Live, m.Staged, m.Pin, m.canaryVersion()}, m.Standby()...) {
		need(v)
	}
	for _, v := range m.Versions {
		// Pending versions, and ready ones newer than the live one (what
		// the model follows once unpinned), are on their way to be served.
		if v.Phase.pending() || v.Phase == PhaseReady && v.Version > m.Live {
			need(v.Version)
		}
	}
	var removable []uint64
	for _, v := range slices.Sorted(slices.Values(c.Listed)) {
		if protected[v] || m.version(v) == nil && v > m.Floor {
			continue
		}
		removable = append(removable, v)
	}
	if len(removable) <= c.Keep {
		return nil, nil
	}
	return []Action{Remove{Model: m.Name, Versions: removable[:len(removable)-c.Keep]}}, nil
}

// numbers lists the versions m knows, ascending.
func (m *ModelState) numbers() []uint64 {
	out := make([]uint64, len(m.Versions))
	for i, v := range m.Versions {
		out[i] = v.Version
	}
	return out
}

func list(vs []uint64) string {
	if len(vs) == 0 {
		return "none"
	}
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

// settle brings one model to where its state says it should be: versions
// whose chains are resolved become ready or rejected, the target is
// staged and committed once every assigned replica holds it, partitions
// are handed over make-before-break, and standby versions beyond the keep
// policy are retired.
func (s *State) settle(m *ModelState, p Policy) {
	resolve(m)
	if m.Partitions == 0 || s.Shards == nil {
		return // nothing to place yet, or no word from the shards yet: decide nothing on ignorance
	}
	trusted := s.trusted(m)
	h := s.holding(m.Name)
	assign := s.limitMoves(h, m, s.placement(m, trusted, p), trusted, p.Replicas, p.MaxMoves)
	liveServable := true // only a removed live version can stop being so (nobody can load it again)
	if lv := m.version(m.Live); lv != nil && (lv.Gone || lv.Broken != "") {
		liveServable = s.servable(m, m.Live, trusted)
		what := "removed from the repository"
		if !lv.Gone {
			what = lv.Broken
		}
		if liveServable {
			lv.Reason = what + "; still served by the shards that hold it"
		} else {
			lv.Reason = what + "; no longer held whole by the shards: the newest other valid version takes over"
		}
	}
	stage, canary, dropped := m.canaryStage(m.target(liveServable), liveServable)
	if dropped != "" {
		s.pending = append(s.pending, AuditEntry{Time: p.Now, Op: "canary-dropped", Model: m.Name, From: "manager", Result: dropped})
	}
	if m.Staged != 0 && m.Staged != stage {
		if v := m.version(m.Staged); v != nil && v.Phase == PhaseStaging {
			v.unstage()
		}
		m.Staged = 0
	}
	if stage != 0 && stage != m.Live {
		v := m.version(stage)
		m.Staged = stage
		v.Phase = PhaseStaging
		held := s.allHold(h, m, assign, stage)
		switch {
		case !held:
			v.HeldAt = time.Time{}
		case v.HeldAt.IsZero():
			v.HeldAt = p.Now
		}
		routersOK := s.routersScore(m, v, p) // either way: its reason stays current
		switch {
		case !held || !routersOK || !s.gatesPass(m, v, p):
		case canary:
			v.Phase, m.Staged, m.Canary.Serving = PhaseCanary, 0, true
		default:
			m.commit(stage)
		}
	}
	if lv := m.version(m.Live); lv != nil && strings.HasPrefix(lv.Reason, reasonWithoutRouters) && s.routersAllScore(m.Name, m.Live) {
		lv.Reason = "" // the routers it went live without can score it now
	}
	m.Replicas = s.handover(h, m, assign, trusted)
	m.retire(p.KeepVersions, p.KeepDeltas)
	m.forget()
}

// count bumps Seq when m's serving map record differs from old's, and
// notes from which Seq on the placement and each kept version have stood
// unchanged: a shard's report that follows a record at least that recent
// describes what the shard keeps (see holds).
func (m *ModelState) count(old *ModelState) {
	if m.Partitions == 0 {
		return
	}
	var was topo.Assignment
	if old != nil {
		was = old.Assignment()
	}
	now := m.Assignment()
	if old != nil && reflect.DeepEqual(was, now) {
		return
	}
	m.Seq++
	if old == nil || !reflect.DeepEqual(was.Replicas, now.Replicas) {
		m.PlaceSeq = m.Seq
	}
	for _, v := range now.Kept() {
		if !slices.Contains(was.Kept(), v) {
			m.version(v).KeptSince = m.Seq
		}
	}
}

// resolve settles versions whose own files are verified: ready when
// their parent chain is valid, rejected when it is not.
func resolve(m *ModelState) {
	for i := range m.Versions {
		v := &m.Versions[i]
		if v.Phase != PhaseValidating || v.Info == nil {
			continue
		}
		if v.Kind == "delta" {
			pv := m.version(v.Parent)
			switch {
			case pv == nil && m.Chained[v.Parent] != "":
				// gone from the state, validated, and needed by a kept chain
			case pv == nil && v.Parent <= m.Floor:
				v.Phase, v.Reason, v.Info = PhaseRejected, fmt.Sprintf("parent version %d is retired (no longer kept); a delta must build on a version the manager keeps", v.Parent), nil
				continue
			case pv == nil:
				v.Phase, v.Reason, v.Info = PhaseRejected, fmt.Sprintf("parent version %d is not in the repository", v.Parent), nil
				continue
			case pv.Phase == PhaseRejected:
				v.Phase, v.Reason, v.Info = PhaseRejected, parentRejected(v.Parent), nil
				continue
			case !pv.Phase.valid():
				continue // wait for the parent's result
			}
		}
		if m.Partitions == 0 {
			m.Partitions = uint32(len(v.Info.IDs))
		}
		v.Phase = PhaseReady
	}
}

// target is the version that should be live: the pin while it is valid
// and in the repository, else the newest valid version in the repository;
// 0 when none. A live version whose directory was removed stays the
// target while liveServable (shards still hold every partition of it)
// and no newer one is valid: removing files is no way to roll back (that
// is what rollback is for). Once shards no longer hold it whole (one
// died, and none can load it again), the newest other valid version takes
// over rather than leave the model down.
func (m *ModelState) target(liveServable bool) uint64 {
	if m.Pin != 0 {
		if v := m.version(m.Pin); v != nil && v.Phase.valid() && (!v.Gone && v.Broken == "" || v.Version == m.Live && liveServable) {
			return m.Pin
		}
		if lv := m.version(m.Live); lv != nil && (lv.Gone || lv.Broken != "") && !liveServable {
			// The live version can be served no more: the most recently
			// live standby that can be loaded takes over, the pin staying
			// (it applies again once its version can be loaded).
			for _, sv := range m.Standby() {
				if x := m.version(sv); !x.Gone && x.Broken == "" {
					return sv
				}
			}
		}
		return m.Live
	}
	for i := len(m.Versions) - 1; i >= 0; i-- {
		if v := &m.Versions[i]; v.Phase.valid() && (!v.Gone && v.Broken == "" || v.Version == m.Live && liveServable) {
			return v.Version
		}
	}
	return m.Live
}

// servable reports whether every partition of version v has one of the
// trusted shards reporting it with the validated content (any report, however
// old: this asks whether anyone still has it, not whether to hand over).
func (s *State) servable(m *ModelState, v uint64, trusted []string) bool {
	x := m.version(v)
	if x == nil || x.Info == nil {
		return false
	}
	for p, id := range x.Info.IDs {
		if !slices.ContainsFunc(trusted, func(sid string) bool { return s.Shards[sid].Holds(m.Name, v, uint32(p), id) }) {
			return false
		}
	}
	return true
}

// routersScore reports whether every router can score staged version v,
// or has been unable to for p.RouterWait since the shards came to hold
// it (v.HeldAt); v.Reason
// says which routers it waits for, or went live without. Routers not
// tracked (nil: the manager applies no shard report before the routers'
// first) hold nothing back.
//
// Only reasons of its own (reasonWaitingRouters, reasonWithoutRouters)
// are replaced or cleared: another reason (files changed, say) stays.
func (s *State) routersScore(m *ModelState, v *Version, p Policy) bool {
	if s.Routers == nil {
		return true
	}
	setReason := func(r string) {
		if v.Reason == "" || strings.HasPrefix(v.Reason, reasonWaitingRouters) || strings.HasPrefix(v.Reason, reasonWithoutRouters) {
			v.Reason = r
		}
	}
	var waiting, without []string
	for _, id := range slices.Sorted(maps.Keys(s.Routers)) {
		r := s.Routers[id]
		if r.CanScore(m.Name, v.Version) {
			continue
		}
		why := "it has not said it can score this version yet"
		for _, c := range r.Cannot {
			if c.Model == m.Name && c.Version == v.Version {
				why = c.Reason
			}
		}
		note := fmt.Sprintf("%s (%s)", id, why)
		if p.RouterWait > 0 && !p.Now.IsZero() && !v.HeldAt.IsZero() && p.Now.Sub(v.HeldAt) >= p.RouterWait {
			without = append(without, note)
		} else {
			waiting = append(waiting, note)
		}
	}
	switch {
	case len(waiting) > 0:
		setReason(reasonWaitingRouters + strings.Join(waiting, "; "))
		return false
	case len(without) > 0:
		setReason(fmt.Sprintf("%s %v no longer hold it back (they answer 503 for it until they can): %s", reasonWithoutRouters, p.RouterWait, strings.Join(without, "; ")))
	default:
		setReason("")
	}
	return true
}

// The reasons routersScore gives.
const (
	reasonWaitingRouters = "waiting for routers to be able to score it: "
	reasonWithoutRouters = "routers that could not score it within"
)

// routersAllScore reports whether every router tracked can score
// version v of model.
func (s *State) routersAllScore(model string, v uint64) bool {
	for _, r := range s.Routers {
		if !r.CanScore(model, v) {
			return false
		}
	}
	return true
}

// RouterDeadline is the earliest time a router's wait on a staged
// version runs out (zero: none is waited on), when Decide should run
// again: from the state itself (the shards hold the version, some router
// cannot score it), whatever its reason says. It may be past: the
// manager arms its timer only for one to come.
func (s *State) RouterDeadline(p Policy) time.Time {
	var first time.Time
	if p.RouterWait <= 0 {
		return first
	}
	for _, m := range s.Models {
		if v := m.version(m.Staged); v != nil && !v.HeldAt.IsZero() && !s.routersAllScore(m.Name, v.Version) {
			if t := v.HeldAt.Add(p.RouterWait); first.IsZero() || t.Before(first) {
				first = t
			}
		}
	}
	return first
}

// commit makes v live; the previous live version becomes standby (or is
// forgotten, if it left the repository).
// unstage sends a version that is no longer staged (or no longer the
// canary) back to ready, or to standby if it was live before (a rollback
// target: the keep policy decides); a gate run under way is moot.
func (v *Version) unstage() {
	v.Phase, v.Gating = PhaseReady, false
	if v.LiveSeq != 0 {
		v.Phase = PhaseStandby
	}
}

func (m *ModelState) commit(v uint64) {
	if old := m.version(m.Live); old != nil {
		if old.Gone {
			m.Versions = slices.DeleteFunc(m.Versions, func(x Version) bool { return x.Version == m.Live })
		} else {
			old.Phase = PhaseStandby
		}
	}
	m.LiveSeq++
	nv := m.version(v)
	nv.Phase, nv.LiveSeq = PhaseLive, m.LiveSeq
	m.Live, m.Staged = v, 0
}

// retire keeps the standby versions built on the live version's full
// version and on the keep most recently live other full versions, and of
// the deltas on each of those the newest keepDeltas; the rest are
// retired.
func (m *ModelState) retire(keep, keepDeltas int) {
	bases := map[uint64]bool{m.base(m.Live): true}
	standby := m.Standby()
	for _, v := range standby {
		b := m.base(v)
		if !bases[b] && keep > 0 {
			bases[b] = true
			keep--
		}
		if !bases[b] {
			m.version(v).Phase = PhaseRetired
		}
	}
	deltas := map[uint64]int{}
	for _, v := range slices.Backward(slices.Sorted(slices.Values(standby))) {
		x := m.version(v)
		if x.Phase != PhaseStandby || x.Kind != "delta" {
			continue
		}
		if b := m.base(v); deltas[b] < keepDeltas {
			deltas[b]++
		} else {
			x.Phase = PhaseRetired
		}
	}
}

// forget drops from the state what can no longer be served, staged or
// rolled back to, raising Floor so that scans do not find it again:
// retired versions; ready versions older than the live one that no
// pending delta builds on; of the other ready versions, all but the
// newest few (pin targets); and rejected versions beyond the newest
// keepRejected. The live, staged and pinned versions always stay.
func (m *ModelState) forget() {
	parents := map[uint64]bool{}
	for _, v := range m.Versions {
		if v.Phase.pending() && v.Kind == "delta" {
			parents[v.Parent] = true
		}
	}
	ready, rejected := 0, 0
	drop := func(v Version) bool {
		if v.Version == m.Live || v.Version == m.Staged || v.Version == m.Pin || v.Version == m.canaryVersion() || parents[v.Version] {
			return false
		}
		switch v.Phase {
		case PhaseRetired:
			return true
		case PhaseReady:
			ready++
			return v.Version < m.Live || ready > keepReady
		case PhaseRejected:
			rejected++
			return rejected > keepRejected
		}
		return false
	}
	kept := m.Versions[:0:0]
	var dropped []Version
	for _, v := range slices.Backward(m.Versions) {
		if drop(v) {
			m.Floor = max(m.Floor, v.Version)
			dropped = append(dropped, v)
			continue
		}
		kept = append(kept, v)
	}
	if len(kept) != len(m.Versions) {
		slices.Reverse(kept)
		m.Versions = kept
	}
	// Remember, by fingerprint, what kept chains need of what left.
	need := map[uint64]bool{}
	for _, v := range m.Versions {
		if v.Info != nil {
			for _, c := range v.Info.Chain {
				need[c] = true
			}
		}
	}
	for _, v := range dropped {
		if need[v.Version] {
			if m.Chained == nil {
				m.Chained = map[uint64]string{}
			}
			var ids []string
			if v.Info != nil {
				ids = v.Info.IDs
			}
			m.Chained[v.Version] = chainedEntry(cmp.Or(v.Checked, v.Files), ids)
		}
	}
	for c := range m.Chained {
		if !need[c] || m.version(c) != nil {
			delete(m.Chained, c)
		}
	}
	if len(m.Chained) == 0 {
		m.Chained = nil
	}
}

// keepReady is how many ready versions newer than the live one a model
// keeps (the newest): what it would follow, and pin targets.
const keepReady = 10

// base is the full version under v's chain (v itself when unknown).
func (m *ModelState) base(v uint64) uint64 {
	if x := m.version(v); x != nil && x.Info != nil && len(x.Info.Chain) > 0 {
		return x.Info.Chain[len(x.Info.Chain)-1]
	}
	for range len(m.Versions) {
		x := m.version(v)
		if x == nil || x.Kind != "delta" {
			return v
		}
		v = x.Parent
	}
	return v
}

// trusted lists, sorted, the shards partitions of m may be assigned to:
// every live shard except those reporting content for m that differs from
// what the manager validated.
func (s *State) trusted(m *ModelState) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(s.Shards)) {
		if !s.mismatched(m, s.Shards[id]) {
			out = append(out, id)
		}
	}
	return out
}

// mismatched reports whether si holds or found content for m whose
// identity differs from the validated version's.
func (s *State) mismatched(m *ModelState, si topo.ShardInfo) bool {
	for _, l := range slices.Concat(si.Loaded, si.Mismatched) {
		if l.Model != m.Name {
			continue
		}
		v := m.version(l.Version)
		if v == nil || v.Info == nil {
			continue
		}
		for i, p := range l.Have {
			if int(p) >= len(v.Info.IDs) || i >= len(l.IDs) || l.IDs[i] != v.Info.IDs[p] {
				return true
			}
		}
	}
	return false
}

// Mismatches lists, per shard, the versions of model it holds or found
// with content other than the manager validated.
func (s *State) Mismatches(model string) map[string][]uint64 {
	m := s.Models[model]
	out := map[string][]uint64{}
	if m == nil {
		return out
	}
	for id, si := range s.Shards {
		for _, l := range slices.Concat(si.Loaded, si.Mismatched) {
			if l.Model == model && !slices.Contains(out[id], l.Version) && s.mismatched(m, topo.ShardInfo{Loaded: []topo.Loaded{l}}) {
				out[id] = append(out[id], l.Version)
			}
		}
	}
	return out
}

// holds reports whether shard id holds partition p of v with the
// validated content, by a report recent enough to trust: one that
// follows a record from which on neither the placement nor v's being kept
// has changed. An older report may list what the shard has since dropped
// on an intermediate record's word.
func (s *State) holds(m *ModelState, id string, v uint64, p int) bool {
	return s.holdsIn(nil, m, id, v, p)
}

// holding indexes the shards' reports of one model (shard → version →
// report), so that settling a model with many partitions and versions
// kept does not search every report for every pair.
type holding map[string]map[uint64]*topo.Loaded

func (s *State) holding(model string) holding {
	h := holding{}
	for id, si := range s.Shards {
		for i := range si.Loaded {
			l := &si.Loaded[i]
			if l.Model != model {
				continue
			}
			if h[id] == nil {
				h[id] = map[uint64]*topo.Loaded{}
			}
			if h[id][l.Version] == nil { // the first, as ShardInfo.Holds reads
				h[id][l.Version] = l
			}
		}
	}
	return h
}

// holdsIn is holds, reading the reports from h (nil: from s.Shards).
func (s *State) holdsIn(h holding, m *ModelState, id string, v uint64, p int) bool {
	return s.holdsVersion(h, m, id, m.version(v), p)
}

// holdsVersion is holdsIn for version x (nil: unknown).
func (s *State) holdsVersion(h holding, m *ModelState, id string, x *Version, p int) bool {
	if x == nil || x.Info == nil || p >= len(x.Info.IDs) {
		return false
	}
	si, ok := s.Shards[id]
	if !ok || si.Applied[m.Name] < max(m.PlaceSeq, x.KeptSince) {
		return false
	}
	if h == nil {
		return si.Holds(m.Name, x.Version, uint32(p), x.Info.IDs[p])
	}
	l := h[id][x.Version]
	return l != nil && x.Info.IDs[p] != "" && l.Identity(uint32(p)) == x.Info.IDs[p]
}

// allHold reports whether every replica assign names holds its partition
// of v: the moment a rollout may commit. A shard counts only for the
// partitions the map last published gives it: a report of anything else
// may be about to go (the shard drops what an earlier map took from it).
func (s *State) allHold(h holding, m *ModelState, assign [][]string, v uint64) bool {
	if len(m.Replicas) != len(assign) {
		return false
	}
	for p, reps := range assign {
		if len(reps) == 0 {
			return false
		}
		for _, id := range reps {
			if !slices.Contains(m.Replicas[p], id) || !s.holdsIn(h, m, id, v, p) {
				return false
			}
		}
	}
	return true
}

// handover is what to publish on the way from the replicas last
// published to assign: make before break. Until every shard assign names
// for partition p holds every version the map keeps (live, staged and
// standby: a rollback must find its version loaded) by a report
// that follows the newest record (an older report may list what the shard
// has since dropped), the shards last published for p stay assigned too,
// if they are still trusted (registered, reporting nothing false), so a
// partition moved when shards join or leave keeps its serving replicas
// until its new holders have loaded it.
func (s *State) handover(h holding, m *ModelState, assign [][]string, trusted []string) [][]string {
	prev := m.Replicas
	if len(prev) != len(assign) {
		return assign
	}
	var serving []*Version
	for _, v := range m.kept() {
		serving = append(serving, m.version(v))
	}
	out := make([][]string, len(assign))
	for p, reps := range assign {
		out[p] = reps
		ready := !slices.ContainsFunc(reps, func(id string) bool {
			return !slices.Contains(prev[p], id) || slices.ContainsFunc(serving, func(x *Version) bool { return !s.holdsVersion(h, m, id, x, p) })
		})
		if ready {
			continue
		}
		for _, id := range prev[p] {
			if !slices.Contains(out[p], id) && slices.Contains(trusted, id) {
				out[p] = append(slices.Clip(out[p]), id)
			}
		}
	}
	return out
}

// kept lists the versions shards keep loaded (topo.Assignment.Kept).
func (m *ModelState) kept() []uint64 {
	a := topo.Assignment{Live: m.Live, Staged: m.Staged, Standby: m.Standby(), Canary: m.canaryVersion()}
	return a.Kept()
}

// canaryVersion is the canary's version, 0 when none.
func (m *ModelState) canaryVersion() uint64 {
	if m.Canary == nil {
		return 0
	}
	return m.Canary.Version
}

// Assignment is the serving map record of m.
func (m *ModelState) Assignment() topo.Assignment {
	a := topo.Assignment{Schema: topo.AssignmentSchema, Model: m.Name, Seq: m.Seq, Live: m.Live, Staged: m.Staged, Standby: m.Standby(),
		Partitions: m.Partitions, Replicas: m.Replicas}
	if a.Replicas == nil {
		a.Replicas = make([][]string, m.Partitions)
	}
	if m.Canary != nil && m.Canary.Serving {
		a.Canary, a.CanaryFraction = m.Canary.Version, m.Canary.Fraction
	}
	for _, v := range a.Kept() {
		if x := m.version(v); x != nil && x.Info != nil {
			a.Versions = append(a.Versions, *x.Info)
		}
	}
	return a
}
