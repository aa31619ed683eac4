// Package topo is the cluster's shared view in etcd: the key layout, the
// records stored under it, a watcher that turns a key prefix into a
// stream of whole snapshots, and lease-backed registration.
//
// Layout (all values JSON, every record carrying "schema"), under one
// cluster name so that clusters sharing an etcd never see each other:
//
//	/cumulus/CLUSTER/shards/ID     ShardInfo, under the shard's lease: who
//	                               is alive, where; under it, its reports of
//	                               what it holds (shardreports.go)
//	/cumulus/CLUSTER/models/NAME   the serving map of one model, written by
//	                               the manager only: a head, and under it
//	                               its placement and versions (maprecords.go)
//	/cumulus/CLUSTER/manager/...   the manager's own persisted state
//
// The manager alone decides what is served; shards load what the map
// names and report the content identity of each partition they verified;
// routers route a partition only to shards that the map assigns it to and
// that report the identity the map expects. Records evolve by one rule
// (see Schema): a record names the oldest reader that may act on it, and
// a reader refuses a record newer than itself, never half-reads it.
package topo

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"

	"github.com/cumulus-serving/cumulus/model"
)

// Schema is the newest record layout this build reads.
//
// The rule every record under /cumulus/ follows: its "schema" names the
// oldest reader that may act on it. A reader acts on a record whose
// schema is at most its own Schema and refuses (never half-reads) a newer
// one. A writer adds fields that older readers may safely ignore without
// changing a record's schema (unknown fields are ignored on reading); a
// change an older reader would misread — a field it must not ignore, a
// field whose meaning changes, a field it needs that is gone — raises the
// record's schema to the first Schema that reads it. Each record type
// has its own schema, below; Schema is at least the largest of them.
// Readers are upgraded before writers: shards and routers, then managers.
const Schema = 5

// The schema each record is written with: the oldest reader that may act
// on it.
const (
	// ShardInfoSchema: shard registrations. 4: what a shard holds is in
	// its reports under the registration (shardreports.go), written once
	// the map it follows is of AssignmentSchema 4; until then a shard
	// writes schema 1 (Applied and Loaded in the registration), which
	// managers and routers still read.
	ShardInfoSchema       = 4
	ShardInfoLegacySchema = 1
	// AssignmentSchema: serving map records. 2: identities as digests and
	// chains as runs (VersionInfo's JSON form), so a record stays small.
	// 4 (3 was skipped: Schema was already 3, so readers of schema 3
	// must refuse these): a model's map is a head, a placement and a
	// record per version (maprecords.go); schema 2's single record is
	// still read.
	AssignmentSchema = 4
	// RouterInfoSchema: router registrations.
	RouterInfoSchema = 1
	// (5: the head of a model's state as a manager without raft keeps it
	// in etcd, in records of their own: manager/storerecords.go. Only
	// managers read it.)
)

// Cluster is a cluster's name: every key sits under /cumulus/NAME/.
type Cluster string

// DefaultCluster is the name used when none is given.
const DefaultCluster Cluster = "default"

var clusterPattern = regexp.MustCompile(`^[A-Za-z0-9-]{1,63}$`)

// Validate checks the name: 1–63 letters, digits or '-'.
func (c Cluster) Validate() error {
	if !clusterPattern.MatchString(string(c)) {
		return fmt.Errorf("topo: cluster name %q: use 1 to 63 letters, digits or '-'", string(c))
	}
	return nil
}

// OrDefault is c, or DefaultCluster when c is empty.
func (c Cluster) OrDefault() Cluster {
	if c == "" {
		return DefaultCluster
	}
	return c
}

// Prefix is the prefix of every key of the cluster.
func (c Cluster) Prefix() string { return "/cumulus/" + string(c.OrDefault()) + "/" }

func (c Cluster) root() string { return c.Prefix() }

// ShardsPrefix is the prefix of shard registrations.
func (c Cluster) ShardsPrefix() string { return c.root() + "shards/" }

// ModelsPrefix is the prefix of the serving map's records.
func (c Cluster) ModelsPrefix() string { return c.root() + "models/" }

// ManagerPrefix is the prefix of the manager's persisted state.
func (c Cluster) ManagerPrefix() string { return c.root() + "manager/" }

// RoutersPrefix is the prefix of router registrations.
func (c Cluster) RoutersPrefix() string { return c.root() + "routers/" }

// RouterKey is the registration key of a router.
func (c Cluster) RouterKey(id string) string { return c.RoutersPrefix() + id }

// RouterInfo is a live router's registration: which of the versions the
// serving map keeps it can score, and why it cannot score the others (a
// dense part it has not fetched, a type its build does not know). The
// manager commits a version only once every router can score it (or
// has failed to for --router-wait).
type RouterInfo struct {
	Schema int    `json:"schema"`
	ID     string `json:"id"`
	Addr   string `json:"addr,omitempty"` // the front it serves, if any
	Build  string `json:"build,omitempty"`
	// Scores lists, per model, the kept versions it can score.
	Scores map[string][]uint64 `json:"scores,omitempty"`
	// Cannot lists the kept versions it cannot score, with the reason.
	Cannot []Unscorable `json:"cannot,omitempty"`
	// Seen is, per model, the Seq of the serving map record it has read.
	Seen map[string]uint64 `json:"seen,omitempty"`
	// Metrics is the URL of its Prometheus metrics (GET), which the
	// managers read for the console's traffic figures; "" if it serves
	// none. (Added without raising the schema: older readers ignore it.)
	Metrics string `json:"metrics,omitempty"`
}

// Unscorable is a version a router cannot score, and why.
type Unscorable struct {
	Model   string `json:"model"`
	Version uint64 `json:"version"`
	Reason  string `json:"reason"`
}

// CanScore reports whether the router says it can score version v of
// model.
func (r RouterInfo) CanScore(model string, v uint64) bool {
	return slices.Contains(r.Scores[model], v)
}

// ShardKey is the registration key of a shard.
func (c Cluster) ShardKey(id string) string { return c.ShardsPrefix() + id }

// ModelKey is the serving-map key of a model.
func (c Cluster) ModelKey(name string) string { return c.ModelsPrefix() + name }

// ShardInfo is a live shard's registration.
type ShardInfo struct {
	Schema int    `json:"schema"`
	ID     string `json:"id"`
	Addr   string `json:"addr"`            // gRPC host:port
	Build  string `json:"build,omitempty"` // the shard binary's version
	// Applied is, per model, the Seq of the serving map record this
	// report follows: what it lists beyond that record may be about to go.
	Applied map[string]uint64 `json:"applied,omitempty"`
	Loaded  []Loaded          `json:"loaded,omitempty"`
	// Mismatched lists partitions this shard refused because the content
	// its repository holds is not what the serving map expects (Have
	// and IDs say what it found).
	Mismatched []Loaded `json:"mismatched,omitempty"`
	// Errors lists loads this shard refused (damaged or missing files),
	// newest first; the versions it already held keep serving.
	Errors []string `json:"errors,omitempty"`
	// Weight is the shard's share of the partitions (its memory budget
	// in GiB, or an operator's --weight); 0: 1. Zone, if set, is its
	// failure domain: replicas of a partition go to distinct zones. An
	// older manager ignores both and spreads evenly: no schema change.
	Weight float64 `json:"weight,omitempty"`
	Zone   string  `json:"zone,omitempty"`
	// Budget is the shard's resident table budget in bytes (0: none): the
	// manager places no more on it than fits while another shard has
	// room. A new field: an older manager ignores it.
	Budget int64 `json:"budget,omitempty"`
	// Encodings lists the factor encodings (fp16, int8) whose records the
	// shard sends as stored when a lookup asks (codec.FlagStored); a
	// router asks only shards that list the version's. A new field: an
	// older router ignores it, an older shard lists none and is sent
	// format 1 requests.
	Encodings []string `json:"encodings,omitempty"`
	// Held is, per model, what the shard holds, from its reports under
	// its registration (shardreports.go; schema 4). A schema 1 shard
	// lists Applied and Loaded instead.
	Held map[string]*Held `json:"-"`
}

// Loaded is one model version a shard holds: the partitions, ascending,
// and the content identity of each (codec.PartitionIdentity) as the shard
// verified it. Scoring metadata comes from the serving map, never from a
// shard.
type Loaded struct {
	Model   string   `json:"model"`
	Version uint64   `json:"version"`
	Have    []uint32 `json:"have"`
	IDs     []string `json:"ids"` // IDs[i] is the identity of partition Have[i]
}

// Identity returns the identity the shard reports for partition p, or "".
func (l Loaded) Identity(p uint32) string {
	if i, ok := slices.BinarySearch(l.Have, p); ok && i < len(l.IDs) {
		return l.IDs[i]
	}
	return ""
}

// Holds reports whether si reports partition p of model at version with
// exactly the identity id. (Routers route on it; the manager also checks
// the report follows its newest record: see Applied.)
func (si ShardInfo) Holds(model string, version uint64, p uint32, id string) bool {
	if id == "" {
		return false
	}
	for _, l := range si.Loaded {
		if l.Model == model && l.Version == version {
			return l.Identity(p) == id
		}
	}
	return false
}

// Assignment is the serving map of one model, written by the manager
// alone. Routers answer unpinned requests from Live (and a share of them
// from Canary), and requests pinned to a version from Live, Canary or a
// Standby version; Staged is loaded beside Live and is never served to
// users before the manager commits it. Shards load Live, Canary, Staged
// and Standby for the partitions assigned to them, and drop everything
// else.
type Assignment struct {
	Schema int    `json:"schema"`
	Model  string `json:"model"`
	// Seq counts the record's changes; shards report the Seq they follow.
	Seq     uint64   `json:"seq"`
	Live    uint64   `json:"live,omitempty"`    // 0: nothing committed yet
	Staged  uint64   `json:"staged,omitempty"`  // 0: no rollout under way
	Standby []uint64 `json:"standby,omitempty"` // kept loaded for rollback, newest-live first
	// Canary, when set, is served beside Live to CanaryFraction of the
	// unpinned requests (by their key's hash: see router). No schema
	// change: an older router ignores it and serves Live to all, and an
	// older shard leaves the canary unloaded, so routers see it
	// incomplete and serve Live to all: safe, if not a canary.
	Canary         uint64     `json:"canary,omitempty"`
	CanaryFraction float64    `json:"canary_fraction,omitempty"`
	Partitions     uint32     `json:"partitions"`
	Replicas       [][]string `json:"replicas"` // partition → shard IDs
	// PlaceSeq is the Seq since which Replicas have not changed (0: not
	// known, in a schema 2 record).
	PlaceSeq uint64 `json:"place_seq,omitempty"`
	// KeptSince is, per kept version, the Seq since which the map has
	// kept it without a break: a shard's report (Held) that follows it
	// speaks of the version.
	KeptSince map[uint64]uint64 `json:"kept_since,omitempty"`
	// Versions has the scoring metadata and the expected content of
	// every version named above.
	Versions []VersionInfo `json:"versions"`
}

// VersionInfo is what routers need to score one version and what
// everyone checks shards' reports against.
type VersionInfo struct {
	Version uint64 `json:"version"`
	// The type and its parameters; new types' fields are added without a
	// schema change: a reader that does not know them does not know the
	// type either, and serves none of the version.
	model.Shape
	Bias float64 `json:"bias"`
	// Dense is the SHA-256 of the version's dense part (a type with one,
	// model.Shape.HasDense): routers fetch it from shards and check it.
	Dense    string `json:"dense,omitempty"`
	Encoding string `json:"encoding,omitempty"`
	// Hash is the partition function's name (internal/partition).
	Hash string `json:"hash"`
	// IDs is the expected content identity of each partition.
	IDs []string `json:"-"`
	// Chain lists the versions whose files make this one, newest first
	// (a full version: itself only).
	Chain []uint64 `json:"-"`
}

// Info returns the metadata of version v, or nil.
func (a *Assignment) Info(v uint64) *VersionInfo {
	for i := range a.Versions {
		if a.Versions[i].Version == v {
			return &a.Versions[i]
		}
	}
	return nil
}

// Kept lists the versions shards keep loaded: Live, Canary, Staged and
// Standby, without zeros or repeats.
func (a *Assignment) Kept() []uint64 {
	var out []uint64
	for _, v := range append([]uint64{a.Live, a.Canary, a.Staged}, a.Standby...) {
		if v != 0 && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// Check refuses an assignment that cannot be followed safely: its
// partition lists and version metadata must agree with its partition
// count.
func (a *Assignment) Check() error {
	if len(a.Replicas) != int(a.Partitions) {
		return fmt.Errorf("topo: model %s: %d replica lists for %d partitions", a.Model, len(a.Replicas), a.Partitions)
	}
	for _, v := range a.Kept() {
		info := a.Info(v)
		if info == nil {
			return fmt.Errorf("topo: model %s: no metadata for version %d", a.Model, v)
		}
		if len(info.IDs) != int(a.Partitions) {
			return fmt.Errorf("topo: model %s version %d: %d identities for %d partitions", a.Model, v, len(info.IDs), a.Partitions)
		}
	}
	return nil
}

// ErrSchema is wrapped when a record's schema is not one this build reads.
var ErrSchema = errors.New("topo: unknown record schema")

// Decode parses a record, naming the key on error, and refuses one whose
// schema is newer than Schema (or missing).
func Decode[T any](key string, value []byte) (T, error) {
	var v T
	var head struct {
		Schema int `json:"schema"`
	}
	if err := json.Unmarshal(value, &head); err != nil {
		return v, fmt.Errorf("topo: %s: %w", key, err)
	}
	if head.Schema < 1 || head.Schema > Schema {
		return v, fmt.Errorf("%w: %s has schema %d, this build reads 1 to %d (upgrade it)", ErrSchema, key, head.Schema, Schema)
	}
	if err := json.Unmarshal(value, &v); err != nil {
		return v, fmt.Errorf("topo: %s: %w", key, err)
	}
	return v, nil
}

// DecodeAll decodes every value of a snapshot of prefix, keyed by what
// follows the prefix. A value that does not decode is logged and left
// out: one bad record must not hide the rest.
func DecodeAll[T any](kv map[string][]byte, prefix string) map[string]T {
	out := make(map[string]T, len(kv))
	for k, v := range kv {
		t, err := Decode[T](k, v)
		if err != nil {
			slog.Warn("topo: ignoring record", "err", err)
			continue
		}
		out[Suffix(k, prefix)] = t
	}
	return out
}

// Suffix returns key without prefix.
func Suffix(key, prefix string) string { return strings.TrimPrefix(key, prefix) }
