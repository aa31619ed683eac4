package manager

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
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
// the next change needs: the base of each version's identities.
type stored struct {
	bases map[uint64]uint64
	// strays are versions with records the head does not list, to remove.
	strays []uint64
}

func (st *store) modelKey(name string) string { return st.modelsPrefix() + name }
func (st *store) subKey(name, kind string, v uint64) string {
	return st.modelsPrefix() + name + "/" + kind + "/" + strconv.FormatUint(v, 10)
}

// stateOps are the writes that bring the records of the models c changed
// from prev's states to next's, and done, to call once they are written.
// A model not yet stored in this form (read from a record of the older
// form, or new) is written whole.
func (st *store) stateOps(c change, prev, next *State) (ops txnOps, done func(), err error) {
	after := map[string]*stored{}
	for _, name := range slices.Sorted(maps.Keys(c.patches)) {
		nm := next.Models[name]
		if nm == nil {
			continue
		}
		om := prev.Models[name]
		was := st.layout[name]
		if was == nil {
			om = nil // nothing of it in this form: write it all
		}
		end := ops.together()
		now, err := st.modelOps(&ops, name, om, nm, was)
		end()
		if err != nil {
			return txnOps{}, nil, err
		}
		after[name] = now
	}
	if st.layout == nil {
		st.layout = map[string]*stored{}
	}
	return ops, func() {
		maps.Copy(st.layout, after)
		for _, name := range c.gone {
			delete(st.layout, name)
		}
	}, nil
}

// modelOps adds the writes from om's records (nil: none) to nm's.
func (st *store) modelOps(ops *txnOps, name string, om, nm *ModelState, was *stored) (*stored, error) {
	now := &stored{bases: map[uint64]uint64{}}
	if was != nil {
		maps.Copy(now.bases, was.bases)
	}
	rewritten := map[uint64]bool{} // versions whose identities are written here
	var heads []uint64
	for _, v := range nm.Versions {
		heads = append(heads, v.Version)
	}
	if om == nil || !sameReplicas(om.Replicas, nm.Replicas) {
		b, _ := json.Marshal(topo.NewPlacement(name, 0, nm.Replicas))
		if err := ops.put(st.modelKey(name)+"/replicas", b); err != nil {
			return nil, err
		}
	}
	for i := range nm.Versions {
		v := &nm.Versions[i]
		var ov *Version
		if om != nil {
			ov = om.version(v.Version)
		}
		// Identities based on a version that left the state, or whose
		// own changed, are written again.
		base := now.bases[v.Version]
		rebase := base != 0 && (nm.version(base) == nil || rewritten[base])
		if ov != nil && sameVersion(ov, v) && !rebase {
			continue
		}
		rec := storedVersion{Schema: recordSchema, Version: *v, HasInfo: v.Info != nil}
		rec.Info = nil
		b, _ := json.Marshal(rec)
		if err := ops.put(st.subKey(name, "versions", v.Version), b); err != nil {
			return nil, err
		}
		sameInfo := ov != nil && ov.Info != nil && v.Info != nil && (ov.Info == v.Info || reflect.DeepEqual(*ov.Info, *v.Info))
		switch {
		case v.Info == nil:
			if ov != nil && ov.Info != nil {
				ops.delete(st.subKey(name, "ids", v.Version))
			}
			delete(now.bases, v.Version)
		case !sameInfo || rebase:
			ids := storedIDs{Schema: recordSchema}
			ids.Base, ids.Changed, ids.Info = relativeIDs(nm, v)
			b, _ := json.Marshal(ids)
			if err := ops.put(st.subKey(name, "ids", v.Version), b); err != nil {
				return nil, err
			}
			now.bases[v.Version] = ids.Base
			rewritten[v.Version] = true
		}
	}
	bare := *nm
	bare.Versions, bare.Replicas = nil, nil
	state, _ := json.Marshal(bare)
	b, _ := json.Marshal(stateHead{Schema: headSchema, State: state, Listed: heads})
	if err := ops.put(st.modelKey(name), b); err != nil {
		return nil, err
	}
	if was != nil {
		for _, v := range was.strays {
			if nm.version(v) == nil {
				ops.delete(st.subKey(name, "versions", v))
				ops.delete(st.subKey(name, "ids", v))
			}
		}
	}
	if om != nil {
		for _, v := range om.Versions {
			if nm.version(v.Version) == nil {
				ops.delete(st.subKey(name, "versions", v.Version))
				ops.delete(st.subKey(name, "ids", v.Version))
				delete(now.bases, v.Version)
			}
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
		models[name] = m
		if how != nil {
			layout[name] = how
		}
	}
	return models, layout, nil
}

// assemble is the model's state its records hold, and how they hold it
// (nil: as one record of the older form).
func (st *store) assemble(name string, r *modelRecords) (*ModelState, *stored, error) {
	if r.head == nil {
		return nil, nil, fmt.Errorf("manager: model %s has records of its state but no head (%s)", name, st.modelKey(name))
	}
	head, err := topo.Decode[stateHead](r.headKey, r.head)
	if err != nil {
		return nil, nil, fmt.Errorf("manager: %w", err)
	}
	whole := head.Schema < headSchema // one record of the older form: rewritten in this build's at its next change
	if whole && (r.replicas != nil || len(r.versions) > 0 || len(r.ids) > 0) {
		return nil, nil, fmt.Errorf("manager: %s is a whole state (schema %d), beside records of a state in parts", r.headKey, head.Schema)
	}
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
		return &m, nil, nil
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
			info, base, err := st.readIDs(name, r, v, resolved, 0)
			if err != nil {
				return nil, nil, err
			}
			x.Info = info
			s.bases[v] = base
		}
		m.Versions = append(m.Versions, x)
	}
	for v := range r.versions {
		if !slices.Contains(head.Listed, v) {
			s.strays = append(s.strays, v)
		}
	}
	for v := range r.ids {
		if m.version(v) == nil && !slices.Contains(s.strays, v) {
			s.strays = append(s.strays, v)
		}
	}
	slices.Sort(s.strays)
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
func (st *store) readIDs(name string, r *modelRecords, v uint64, resolved map[uint64]*topo.VersionInfo, depth int) (*topo.VersionInfo, uint64, error) {
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
			if base, _, err = st.readIDs(name, r, ids.Base, resolved, depth+1); err != nil {
				return nil, 0, err
			}
		}
		all, err := topo.ChangedIDs(base.IDs, ids.Changed, ids.Info.IDs)
		if err != nil {
			return nil, 0, fmt.Errorf("manager: %s: %w", key, err)
		}
		ids.Info.IDs = all
	}
	resolved[v] = ids.Info
	return ids.Info, ids.Base, nil
}
