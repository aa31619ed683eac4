package topo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The serving map of one model in records that each change with what
// changed (AssignmentSchema 4), so that what a delta costs to write and
// to read does not grow with the partition count or the versions kept:
//
//	/cumulus/CLUSTER/models/NAME                  ModelHead: the versions
//	                                              live, staged, standby,
//	                                              canary; rewritten per change
//	/cumulus/CLUSTER/models/NAME/placement        Placement: partition →
//	                                              replicas; rewritten when
//	                                              placement changes
//	/cumulus/CLUSTER/models/NAME/versions/V       VersionRecord: version V's
//	                                              scoring metadata and
//	                                              identities; written once
//
// A version record names its identities relative to another version's
// record (Base), listing only the partitions whose identity differs: a
// delta's record is as big as the partitions it touched. The manager
// keeps every record a kept version's Base chain needs, writes a
// version's record before (or with) the head that names it, and deletes
// records nothing kept needs. Readers assemble the same Assignment as
// the single record of schema 2 gave (which they still read).

// ModelHead is a model's head record.
type ModelHead struct {
	Schema         int      `json:"schema"`
	Model          string   `json:"model"`
	Seq            uint64   `json:"seq"`
	Live           uint64   `json:"live,omitempty"`
	Staged         uint64   `json:"staged,omitempty"`
	Standby        []uint64 `json:"standby,omitempty"`
	Canary         uint64   `json:"canary,omitempty"`
	CanaryFraction float64  `json:"canary_fraction,omitempty"`
	Partitions     uint32   `json:"partitions"`
	// PlaceSeq is the Seq of the placement written with this head (a
	// reader may see a newer placement beside an older head while a
	// publication spans transactions: both are of replicas that hold, or
	// are kept until others do).
	PlaceSeq uint64 `json:"place_seq"`
	// KeptSince: see Assignment.
	KeptSince map[uint64]uint64 `json:"kept_since,omitempty"`
}

// Placement is a model's placement record: Replicas[p] lists indexes
// into Shards.
type Placement struct {
	Schema   int        `json:"schema"`
	Model    string     `json:"model"`
	Seq      uint64     `json:"seq"`
	Shards   []string   `json:"shards"`
	Replicas [][]uint32 `json:"replicas"`
}

// VersionRecord is one version's record. With Base 0, Info.IDs lists
// every partition's identity; else Info.IDs lists the identities of the
// partitions in Changed (ascending), and every other partition's is
// Base's.
type VersionRecord struct {
	Schema  int         `json:"schema"`
	Model   string      `json:"model"`
	Info    VersionInfo `json:"info"`
	Base    uint64      `json:"base,omitempty"`
	Changed []uint32    `json:"changed,omitempty"`
}

// PlacementKey and VersionKey are a model's placement and version
// records' keys; VersionsPrefix is the prefix of its version records.
func (c Cluster) PlacementKey(model string) string { return c.ModelKey(model) + "/placement" }
func (c Cluster) VersionsPrefix(model string) string {
	return c.ModelKey(model) + "/versions/"
}
func (c Cluster) VersionKey(model string, v uint64) string {
	return c.VersionsPrefix(model) + strconv.FormatUint(v, 10)
}

// NewPlacement encodes replicas as a placement record.
func NewPlacement(model string, seq uint64, replicas [][]string) Placement {
	pl := Placement{Schema: AssignmentSchema, Model: model, Seq: seq, Shards: []string{}, Replicas: make([][]uint32, len(replicas))}
	index := map[string]uint32{}
	for p, reps := range replicas {
		pl.Replicas[p] = make([]uint32, len(reps))
		for i, id := range reps {
			n, ok := index[id]
			if !ok {
				n = uint32(len(pl.Shards))
				index[id] = n
				pl.Shards = append(pl.Shards, id)
			}
			pl.Replicas[p][i] = n
		}
	}
	return pl
}

// Names is the placement as shard IDs, the inverse of NewPlacement.
func (pl Placement) Names() ([][]string, error) {
	out := make([][]string, len(pl.Replicas))
	for p, reps := range pl.Replicas {
		out[p] = make([]string, len(reps))
		for i, n := range reps {
			if int(n) >= len(pl.Shards) {
				return nil, fmt.Errorf("topo: model %s: placement names shard %d of %d", pl.Model, n, len(pl.Shards))
			}
			out[p][i] = pl.Shards[n]
		}
	}
	return out, nil
}

// NewVersionRecord is info's record, relative to base's identities
// (baseIDs; base 0: none). It lists every identity when more than half
// differ: a reader then resolves it without base.
func NewVersionRecord(model string, info VersionInfo, base uint64, baseIDs []string) VersionRecord {
	r := VersionRecord{Schema: AssignmentSchema, Model: model, Info: info}
	if base == 0 || len(baseIDs) != len(info.IDs) {
		return r
	}
	var changed []uint32
	var ids []string
	for p, id := range info.IDs {
		if id != baseIDs[p] {
			changed, ids = append(changed, uint32(p)), append(ids, id)
			if 2*len(changed) > len(info.IDs) {
				return r
			}
		}
	}
	r.Base, r.Changed, r.Info.IDs = base, changed, ids
	if r.Changed == nil {
		r.Changed, r.Info.IDs = []uint32{}, []string{}
	}
	return r
}

// ChangedIDs is the inverse of NewVersionRecord's relative form: base's
// identities with those of the partitions changed (ascending) replaced
// by ids, in order. base is not changed.
func ChangedIDs(base []string, changed []uint32, ids []string) ([]string, error) {
	if len(changed) != len(ids) {
		return nil, fmt.Errorf("%d changed partitions and %d identities", len(changed), len(ids))
	}
	out := slices.Clone(base)
	for i, p := range changed {
		if int(p) >= len(out) || i > 0 && p <= changed[i-1] {
			return nil, fmt.Errorf("changed partitions must ascend below %d", len(out))
		}
		out[p] = ids[i]
	}
	return out, nil
}

// MapReader assembles the serving map from a snapshot of its records
// (key → value under ModelsPrefix), as a watch hands them over. It
// decodes and resolves only the records that changed since its last
// call: a delta costs a reader its own record and the head, not the
// map. Not safe for concurrent use.
type MapReader struct {
	cluster Cluster
	cache   recordCache // ModelHead, Placement, *resolved, Assignment (schema ≤ 2), or error
}

// resolved is a version record with its identities resolved (nil until
// they are).
type resolved struct {
	rec VersionRecord
	ids []string
}

// NewMapReader returns a reader of cluster c's serving map.
func NewMapReader(c Cluster) *MapReader {
	return &MapReader{cluster: c, cache: recordCache{}}
}

// Assignments decodes a snapshot of the serving map: every model whose
// records are complete and consistent. Records that are not are logged
// and left out.
func Assignments(kv map[string][]byte, c Cluster) map[string]Assignment {
	return NewMapReader(c).Assignments(kv)
}

// Assignments assembles the models of kv (see MapReader).
func (r *MapReader) Assignments(kv map[string][]byte) map[string]Assignment {
	prefix := r.cluster.ModelsPrefix()
	heads := map[string]ModelHead{}
	places := map[string]Placement{}
	versions := map[string]map[uint64]*resolved{}
	out := map[string]Assignment{}
	for key, value := range kv {
		name, rest, sub := strings.Cut(Suffix(key, prefix), "/")
		switch v := r.decode(key, value, sub, rest).(type) {
		case error:
			slog.Warn("topo: ignoring serving map record", "err", v)
		case Assignment:
			if err := v.Check(); err != nil || v.Model != name {
				slog.Warn("topo: ignoring serving map record", "key", key, "err", cmpErr(err, fmt.Errorf("topo: record for model %q is filed under %q", v.Model, name)))
				continue
			}
			out[name] = v
		case ModelHead:
			heads[name] = v
		case Placement:
			places[name] = v
		case *resolved:
			if v.rec.Model != name {
				slog.Warn("topo: ignoring serving map record", "key", key, "err", fmt.Sprintf("a record of model %q", v.rec.Model))
				continue
			}
			if versions[name] == nil {
				versions[name] = map[uint64]*resolved{}
			}
			versions[name][v.rec.Info.Version] = v
		}
	}
	for name, h := range heads {
		a, err := assemble(h, places[name], versions[name])
		if err == nil && (h.Model != name || places[name].Model != name) {
			err = fmt.Errorf("topo: records of model %q filed under %q", h.Model, name)
		}
		if err != nil {
			slog.Warn("topo: ignoring serving map record", "model", name, "err", err)
			continue
		}
		out[name] = a
	}
	r.cache.sweep(kv)
	return out
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// decode is the record at key, from the cache when value is the one
// last decoded there.
func (r *MapReader) decode(key string, value []byte, sub bool, rest string) any {
	return r.cache.get(key, value, func() any { return decodeMapRecord(key, value, sub, rest) })
}

// decodeMapRecord reads one record of the serving map (decode).
func decodeMapRecord(key string, value []byte, sub bool, rest string) any {
	var val any
	var err error
	switch {
	case !sub:
		val, err = decodeHead(key, value)
	case rest == "placement":
		var pl Placement
		pl, err = Decode[Placement](key, value)
		val = pl
	case strings.HasPrefix(rest, "versions/"):
		var vr VersionRecord
		if vr, err = Decode[VersionRecord](key, value); err == nil {
			if strconv.FormatUint(vr.Info.Version, 10) != strings.TrimPrefix(rest, "versions/") {
				err = fmt.Errorf("topo: %s holds version %d", key, vr.Info.Version)
			}
			val = &resolved{rec: vr}
		}
	default:
		err = fmt.Errorf("topo: %s: not a serving map record", key)
	}
	if err != nil {
		return err
	}
	return val
}

// decodeHead reads a model's record: a head, or a whole Assignment of
// schema 1 or 2.
func decodeHead(key string, value []byte) (any, error) {
	var s struct {
		Schema int `json:"schema"`
	}
	if err := json.Unmarshal(value, &s); err != nil {
		return nil, fmt.Errorf("topo: %s: %w", key, err)
	}
	if s.Schema > 0 && s.Schema < AssignmentSchema {
		return Decode[Assignment](key, value)
	}
	return Decode[ModelHead](key, value)
}

// assemble builds h's Assignment from its placement and version records,
// checking that they describe what h names.
func assemble(h ModelHead, pl Placement, versions map[uint64]*resolved) (Assignment, error) {
	a := Assignment{Schema: h.Schema, Model: h.Model, Seq: h.Seq, Live: h.Live, Staged: h.Staged, Standby: h.Standby,
		Canary: h.Canary, CanaryFraction: h.CanaryFraction, Partitions: h.Partitions, PlaceSeq: h.PlaceSeq, KeptSince: h.KeptSince}
	if pl.Schema == 0 {
		return a, fmt.Errorf("topo: model %s has no placement record", h.Model)
	}
	if len(pl.Replicas) != int(h.Partitions) {
		return a, fmt.Errorf("topo: model %s: placement of %d partitions, the head says %d", h.Model, len(pl.Replicas), h.Partitions)
	}
	var err error
	if a.Replicas, err = pl.Names(); err != nil {
		return a, err
	}
	for _, v := range a.Kept() {
		ids, err := resolve(versions, v, h.Partitions)
		if err != nil {
			return a, fmt.Errorf("topo: model %s version %d: %w", h.Model, v, err)
		}
		info := versions[v].rec.Info
		info.IDs = ids
		a.Versions = append(a.Versions, info)
	}
	return a, a.Check()
}

// maxBaseChain bounds the records a version's identities may be based
// through (a repository refuses chains of more than 1,000 deltas).
const maxBaseChain = 1024

// resolve returns version v's identities, resolving the records its
// Base chain passes through (each once: what resolve finds is kept with
// the record).
func resolve(versions map[uint64]*resolved, v uint64, parts uint32) ([]string, error) {
	var chain []*resolved
	for x := v; ; {
		r := versions[x]
		switch {
		case r == nil:
			return nil, fmt.Errorf("no record of version %d", x)
		case len(chain) > maxBaseChain:
			return nil, errors.New("identities based on too long a chain")
		}
		if r.ids != nil {
			break
		}
		chain = append(chain, r)
		if r.rec.Base == 0 {
			break
		}
		if r.rec.Base >= x {
			return nil, fmt.Errorf("version %d's identities are based on a later version, %d", x, r.rec.Base)
		}
		x = r.rec.Base
	}
	for i := len(chain) - 1; i >= 0; i-- {
		r := chain[i]
		if r.rec.Base == 0 {
			if len(r.rec.Info.IDs) != int(parts) {
				return nil, fmt.Errorf("version %d has %d identities for %d partitions", r.rec.Info.Version, len(r.rec.Info.IDs), parts)
			}
			r.ids = r.rec.Info.IDs
			continue
		}
		base := versions[r.rec.Base].ids
		if len(base) != int(parts) {
			return nil, fmt.Errorf("version %d's base %d has %d identities for %d partitions", r.rec.Info.Version, r.rec.Base, len(base), parts)
		}
		ids, err := ChangedIDs(base, r.rec.Changed, r.rec.Info.IDs)
		if err != nil {
			return nil, fmt.Errorf("version %d: %w", r.rec.Info.Version, err)
		}
		r.ids = ids
	}
	return versions[v].ids, nil
}

// ReadAssignment reads model name's serving map from etcd; ok is false
// when it has none (or none complete).
func ReadAssignment(ctx context.Context, cli *clientv3.Client, c Cluster, name string) (a Assignment, ok bool, err error) {
	key := c.ModelKey(name)
	resp, err := cli.Get(ctx, key, clientv3.WithPrefix())
	if err != nil {
		return a, false, err
	}
	kv := map[string][]byte{}
	for _, x := range resp.Kvs {
		if k := string(x.Key); k == key || strings.HasPrefix(k, key+"/") {
			kv[k] = x.Value
		}
	}
	a, ok = Assignments(kv, c)[name]
	return a, ok, nil
}
