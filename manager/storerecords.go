package manager

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// A manager without raft keeps each model's state in etcd as records
// that change with what changed, as the serving map's do:
//
//	MANAGER/models/NAME              stateHead: the state but for its versions and replicas
//	MANAGER/models/NAME/replicas     topo.Placement: the replicas, as the serving map's placement record has them
//	MANAGER/models/NAME/versions/V   storedVersion: version V but for its identities
//	MANAGER/models/NAME/ids/V        storedIDs: V's identities, relative to an older version of the state
//
// A delta's phase moving rewrites its version record and the head, a few
// hundred bytes each; its identities are written once, listing only the
// partitions it changed. A model's state as one record (ModelState
// schema 2, which this build still reads and rewrites in this form at its
// first change) grows with every version kept: 1.7 MB at 4,096
// partitions with nine versions, past what etcd takes in one request.
//
// The head's schema is headSchema, above what earlier builds read, so
// they refuse the state rather than read a model without its versions.
// The head lists the versions; a version record it does not list (left
// by a change written in several transactions of which a later one
// failed) is ignored, and identities are based only on listed versions.

// headSchema is the schema of a model's head record.
const headSchema = 5

// stateHead is a model's head record.
type stateHead struct {
	Schema int             `json:"schema"` // headSchema
	State  json.RawMessage `json:"state"`  // ModelState, its versions and replicas left out
	Listed []uint64        `json:"listed"` // its versions, ascending
}

// storedVersion is a version's record: Info is nil, and HasInfo says
// whether its ids record holds one.
type storedVersion struct {
	Schema int `json:"schema"`
	Version
	HasInfo bool `json:"has_info,omitempty"`
}

// storedIDs is a version's Info, its identities listing only the
// partitions of Changed when Base is set (the others are Base's).
type storedIDs struct {
	Schema  int               `json:"schema"`
	Info    *topo.VersionInfo `json:"info"`
	Base    uint64            `json:"ids_base,omitempty"`
	Changed []uint32          `json:"ids_changed,omitempty"`
}

// stored is what the etcd records of one model hold, as far as writing
// the next change needs.
type stored struct {
	// whole: the state is one record of the older form; headless: there
	// are records of the model but no head (its first write was cut
	// short). Either way the next change writes it all.
	whole, headless bool
	bases           map[uint64]uint64 // each version's identities' base (0: none), for those with identities
	strays          []uint64          // versions with records the head does not list, to remove
}

func (st *store) modelKey(name string) string { return st.modelsPrefix() + name }
func (st *store) subKey(name, kind string, v uint64) string {
	return st.modelsPrefix() + name + "/" + kind + "/" + strconv.FormatUint(v, 10)
}

// stateOps are the writes that bring the records of the models c changed
// from prev's states to next's, and done, to call once they are written.
// A model not stored in records of its own yet (read from a record of the
// older form, or new) is written whole; records no head owns go.
func (st *store) stateOps(c change, prev, next *State) (ops txnOps, done func(), err error) {
	after := map[string]*stored{}
	for _, name := range slices.Sorted(maps.Keys(st.layout)) {
		if was := st.layout[name]; was.headless && next.Models[name] == nil {
			ops.DeletePrefix(st.modelKey(name) + "/")
			after[name] = nil
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.patches)) {
		nm := next.Models[name]
		if nm == nil {
			continue
		}
		om, p, was := prev.Models[name], c.patches[name], st.layout[name]
		if was == nil || was.whole || was.headless {
			om = nil // nothing of it in this form: write it all
			p, _ = patchOf(nil, nm)
		}
		end := ops.Together()
		now, err := st.modelOps(&ops, name, om, nm, p, was)
		end()
		if err != nil {
			return txnOps{}, nil, err
		}
		after[name] = now
	}
	return ops, func() {
		if st.layout == nil {
			st.layout = map[string]*stored{}
		}
		for name, s := range after {
			if s == nil {
				delete(st.layout, name)
			} else {
				st.layout[name] = s
			}
		}
		for _, name := range c.gone {
			delete(st.layout, name)
		}
	}, nil
}

// modelOps adds the writes of p, the change from om (nil: none) to nm,
// to the records was describes. Version and identity records are those
// p puts (its identities, relative to a version of nm, as raft entries
// carry them); besides, identities based on a version that left the
// state, lost its identities or had them changed are written again on
// another base.
func (st *store) modelOps(ops *txnOps, name string, om, nm *ModelState, p modelPatch, was *stored) (*stored, error) {
	now := &stored{bases: map[uint64]uint64{}}
	if om != nil {
		maps.Copy(now.bases, was.bases)
	}
	if p.Replicas != nil {
		b, _ := json.Marshal(topo.NewPlacement(name, 0, *p.Replicas))
		if err := ops.Put(st.modelKey(name)+"/replicas", b); err != nil {
			return nil, err
		}
	}
	putIDs := func(v uint64, ids storedIDs) error {
		ids.Schema = recordSchema
		b, _ := json.Marshal(ids)
		now.bases[v] = ids.Base
		return ops.Put(st.subKey(name, "ids", v), b)
	}
	changed := map[uint64]bool{} // versions whose identities this change sets or removes
	for _, pv := range p.Put {
		v := nm.version(pv.Version.Version)
		rec := storedVersion{Schema: recordSchema, Version: *v, HasInfo: v.Info != nil}
		rec.Info = nil
		b, _ := json.Marshal(rec)
		if err := ops.Put(st.subKey(name, "versions", v.Version), b); err != nil {
			return nil, err
		}
		switch _, had := now.bases[v.Version]; {
		case v.Info == nil:
			if had {
				ops.Delete(st.subKey(name, "ids", v.Version))
				delete(now.bases, v.Version)
				changed[v.Version] = true
			}
		case pv.SameInfo && had:
		default:
			ids := storedIDs{Info: pv.Info, Base: pv.Base, Changed: pv.Changed}
			if pv.SameInfo { // unchanged, but with no record yet
				ids.Base, ids.Changed, ids.Info = relativeIDs(nm, v)
			}
			if err := putIDs(v.Version, ids); err != nil {
				return nil, err
			}
			changed[v.Version] = !pv.SameInfo
		}
	}
	for i := range nm.Versions {
		v := &nm.Versions[i]
		base := now.bases[v.Version]
		if v.Info == nil || changed[v.Version] || base == 0 {
			continue
		}
		if bv := nm.version(base); bv != nil && bv.Info != nil && !changed[base] {
			continue
		}
		var ids storedIDs
		ids.Base, ids.Changed, ids.Info = relativeIDs(nm, v)
		if err := putIDs(v.Version, ids); err != nil {
			return nil, err
		}
	}
	var listed []uint64
	for _, v := range nm.Versions {
		listed = append(listed, v.Version)
	}
	bare := *nm
	bare.Versions, bare.Replicas = nil, nil
	state, _ := json.Marshal(bare)
	b, _ := json.Marshal(stateHead{Schema: headSchema, State: state, Listed: listed})
	if err := ops.Put(st.modelKey(name), b); err != nil {
		return nil, err
	}
	gone := slices.Clone(p.Drop)
	if was != nil {
		gone = append(gone, was.strays...)
	}
	for _, v := range gone {
		if nm.version(v) == nil {
			ops.Delete(st.subKey(name, "versions", v))
			ops.Delete(st.subKey(name, "ids", v))
			delete(now.bases, v)
		}
	}
	return now, nil
}

// modelRecords gathers one model's records as load reads them.
type modelRecords struct {
	head     []byte
	headKey  string
	replicas []byte
	versions map[uint64][]byte
	ids      map[uint64][]byte
}

// addRecord files a record under models/ by the model it belongs to.
func addRecord(recs map[string]*modelRecords, rest string, key string, value []byte) error {
	name, sub, _ := strings.Cut(rest, "/")
	r := recs[name]
	if r == nil {
		r = &modelRecords{versions: map[uint64][]byte{}, ids: map[uint64][]byte{}}
		recs[name] = r
	}
	if sub == "" {
		r.head, r.headKey = value, key
		return nil
	}
	if sub == "replicas" {
		r.replicas = value
		return nil
	}
	kind, vs, _ := strings.Cut(sub, "/")
	v, err := strconv.ParseUint(vs, 10, 64)
	if err != nil || v == 0 {
		return fmt.Errorf("manager: %s is no record of a model's state", key)
	}
	switch kind {
	case "versions":
		r.versions[v] = value
	case "ids":
		r.ids[v] = value
	default:
		return fmt.Errorf("manager: %s is no record of a model's state", key)
	}
	return nil
}

// assembleAll is the models' states their records hold, and how they
// hold them (see assemble).
func (st *store) assembleAll(recs map[string]*modelRecords) (map[string]*ModelState, map[string]*stored, error) {
	models, layout := map[string]*ModelState{}, map[string]*stored{}
	for _, name := range slices.Sorted(maps.Keys(recs)) {
		m, how, err := st.assemble(name, recs[name])
		if err != nil {
			return nil, nil, err
		}
		if m != nil {
			models[name] = m
		}
		layout[name] = how
	}
	return models, layout, nil
}

// assemble is the model's state its records hold, and how they hold it
// (nil: as one record of the older form).
func (st *store) assemble(name string, r *modelRecords) (*ModelState, *stored, error) {
	parts := map[uint64]bool{} // versions with records of their own
	for v := range r.versions {
		parts[v] = true
	}
	for v := range r.ids {
		parts[v] = true
	}
	strays := func(listed []uint64) []uint64 {
		for _, v := range listed {
			delete(parts, v)
		}
		return slices.Sorted(maps.Keys(parts))
	}
	if r.head == nil {
		// The first write of a new model, cut short: nothing to read.
		return nil, &stored{headless: true, strays: strays(nil)}, nil
	}
	head, err := topo.Decode[stateHead](r.headKey, r.head)
	if err != nil {
		return nil, nil, fmt.Errorf("manager: %w", err)
	}
	// One record of the older form (and records of a rewrite in parts
	// that was cut short beside it): rewritten whole at its next change.
	whole := head.Schema < headSchema
	state := head.State
	switch {
	case whole:
		state = r.head
	case len(state) == 0:
		return nil, nil, fmt.Errorf("manager: %s holds no state", r.headKey)
	}
	m, err := topo.Decode[ModelState](r.headKey, state)
	if err != nil {
		return nil, nil, fmt.Errorf("manager: %w", err)
	}
	if m.Name != name {
		return nil, nil, fmt.Errorf("manager: %s holds the state of model %q", r.headKey, m.Name)
	}
	m.Schema = ModelStateSchema
	if whole {
		return &m, &stored{whole: true, strays: strays(nil)}, nil
	}
	m.Versions, m.Replicas = nil, nil
	if r.replicas != nil {
		pl, err := topo.Decode[topo.Placement](st.modelKey(name)+"/replicas", r.replicas)
		if err == nil {
			m.Replicas, err = pl.Names()
		}
		if err != nil {
			return nil, nil, fmt.Errorf("manager: %w", err)
		}
	}
	s := &stored{bases: map[uint64]uint64{}}
	resolved := map[uint64]*topo.VersionInfo{}
	for i, v := range head.Listed {
		if i > 0 && v <= head.Listed[i-1] {
			return nil, nil, fmt.Errorf("manager: %s lists its versions out of order", r.headKey)
		}
		key := st.subKey(name, "versions", v)
		b, ok := r.versions[v]
		if !ok {
			return nil, nil, fmt.Errorf("manager: %s lists version %d, which has no record (%s)", r.headKey, v, key)
		}
		sv, err := topo.Decode[storedVersion](key, b)
		if err != nil {
			return nil, nil, fmt.Errorf("manager: %w", err)
		}
		x := sv.Version
		if x.Version != v {
			return nil, nil, fmt.Errorf("manager: %s holds version %d", key, x.Version)
		}
		x.Info = nil
		if sv.HasInfo {
			info, base, err := st.readIDs(name, r, v, m.Partitions, resolved, 0)
			if err != nil {
				return nil, nil, err
			}
			x.Info = info
			s.bases[v] = base
		}
		m.Versions = append(m.Versions, x)
	}
	s.strays = strays(head.Listed)
	return &m, s, nil
}

// maxIDsDepth bounds how many records a version's identities are read
// through (a chain holds at most 1,000 deltas).
const maxIDsDepth = 1024

// readIDs is version v's Info from its ids record, with every identity:
// those of its base read first, from the base's record whether the head
// lists it or not (a change written in several transactions writes a
// base's identities before those based on it, and removes no record
// before the head that stops listing it).
func (st *store) readIDs(name string, r *modelRecords, v uint64, partitions uint32, resolved map[uint64]*topo.VersionInfo, depth int) (*topo.VersionInfo, uint64, error) {
	key := st.subKey(name, "ids", v)
	if depth > maxIDsDepth {
		return nil, 0, fmt.Errorf("manager: %s: identities based on more than %d others", key, maxIDsDepth)
	}
	b, ok := r.ids[v]
	if !ok {
		return nil, 0, fmt.Errorf("manager: version %d of model %s has identities, but no record of them (%s)", v, name, key)
	}
	ids, err := topo.Decode[storedIDs](key, b)
	if err != nil {
		return nil, 0, fmt.Errorf("manager: %w", err)
	}
	if ids.Info == nil {
		return nil, 0, fmt.Errorf("manager: %s holds no identities", key)
	}
	if ids.Base != 0 {
		if ids.Base >= v {
			return nil, 0, fmt.Errorf("manager: %s is based on version %d, not an older one", key, ids.Base)
		}
		base := resolved[ids.Base]
		if base == nil {
			if base, _, err = st.readIDs(name, r, ids.Base, partitions, resolved, depth+1); err != nil {
				return nil, 0, err
			}
		}
		all, err := topo.ChangedIDs(base.IDs, ids.Changed, ids.Info.IDs)
		if err != nil {
			return nil, 0, fmt.Errorf("manager: %s: %w", key, err)
		}
		ids.Info.IDs = all
	}
	if partitions != 0 && len(ids.Info.IDs) != int(partitions) {
		return nil, 0, fmt.Errorf("manager: %s: identities of %d partitions, the model has %d", key, len(ids.Info.IDs), partitions)
	}
	resolved[v] = ids.Info
	return ids.Info, ids.Base, nil
}
