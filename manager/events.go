// The events Decide takes and the actions it hands back.

package manager

import (
	"errors"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

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
	// Pushed are the push producers' marks its manifest holds.
	Pushed map[string]codec.PushMark
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
	Created time.Time    // its manifest's publication time (zero: none)
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

func (Scanned) isEvent() {}

func (Started) isEvent() {}

func (Checked) isEvent() {}

func (ShardsChanged) isEvent() {}

func (RoutersChanged) isEvent() {}

func (GatesChecked) isEvent() {}

func (Command) isEvent() {}

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

func (Validate) isAction() {}

func (Remove) isAction() {}

func (AuditEntry) isAction() {}

func (RunGates) isAction() {}

// Errors a Command can be refused with, and ErrUnconfirmed for one whose
// result could not be written.
var (
	ErrNotFound    = errors.New("manager: not found")
	ErrConflict    = errors.New("manager: conflict")
	ErrInvalid     = errors.New("manager: invalid request")
	ErrUnconfirmed = errors.New("manager: not confirmed: the write to etcd failed or did not answer in time, and may still take effect; check show and audit before retrying")
)
