package manager

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
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
	// PushedAt, on a delta sealed from pushes (push.go), is when it was
	// sealed (its newest mark's time; zero: not a push).
	PushedAt time.Time `json:"pushed_at,omitzero"`
	// Created is when it was published, as its manifest says (shown by
	// the console; zero: unknown). LiveAt is when it last went live.
	Created time.Time `json:"created,omitzero"`
	LiveAt  time.Time `json:"live_at,omitzero"`
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
	// Pushed are the push producers' sealed marks, from the manifests of
	// the deltas sealed from pushes (push.go), bounded by
	// Policy.PushProducerTTL and MaxPushProducers.
	Pushed map[string]codec.PushMark `json:"pushed,omitempty"`
	// placed is the last placement made, for placement to give again
	// while its inputs stand (not persisted).
	placed *placeMemo
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
	n.Pushed = maps.Clone(m.Pushed)
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

// RollbackTarget is the version a rollback that names none goes to: the
// most recently live standby version that can be loaded (0: none).
func (m *ModelState) RollbackTarget() uint64 {
	for _, v := range m.Standby() {
		if x := m.version(v); !x.Gone && x.Broken == "" {
			return v
		}
	}
	return 0
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
	// PushProducerTTL and MaxPushProducers bound ModelState.Pushed: a
	// producer whose newest mark is this much older than the model's
	// newest is forgotten (0: never), and at most this many are kept, the
	// newest (0: codec.MaxPushProducers).
	PushProducerTTL  time.Duration
	MaxPushProducers int
}

// keepRejected is how many rejected versions a model keeps listed, with
// their reasons (the newest).
const keepRejected = 10

func (s *State) version(model string, v uint64) *Version {
	if m := s.Models[model]; m != nil {
		return m.version(v)
	}
	return nil
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
		Partitions: m.Partitions, Replicas: m.Replicas, PlaceSeq: m.PlaceSeq}
	if a.Replicas == nil {
		a.Replicas = make([][]string, m.Partitions)
	}
	if m.Canary != nil && m.Canary.Serving {
		a.Canary, a.CanaryFraction = m.Canary.Version, m.Canary.Fraction
	}
	for _, v := range a.Kept() {
		if x := m.version(v); x != nil && x.Info != nil {
			a.Versions = append(a.Versions, *x.Info)
			if x.KeptSince != 0 {
				if a.KeptSince == nil {
					a.KeptSince = map[uint64]uint64{}
				}
				a.KeptSince[v] = x.KeptSince
			}
		}
	}
	return a
}
