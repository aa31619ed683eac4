package router

import (
	"maps"
	"slices"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/shard"
)

// backend is one shard as the router sees it.
type backend struct {
	id   string
	addr string
	svc  shard.Service
}

// versionRoute is one complete model version: every partition has at
// least one shard that reports holding it.
type versionRoute struct {
	model      string
	version    uint64
	typ        string
	dim        int
	bias       float64
	partitions uint32
	replicas   [][]*backend // partition → shards holding it
}

func (v *versionRoute) width() int { return 1 + v.dim }

// modelRoute is everything servable of one assigned model.
type modelRoute struct {
	name     string
	live     *versionRoute            // nil: no complete version yet
	versions map[uint64]*versionRoute // every complete version
}

// table is an immutable routing snapshot; requests read it through an
// atomic pointer and never lock.
type table struct {
	models   map[string]*modelRoute
	replaced chan struct{} // closed once a newer table is in place
}

// buildTable routes each assigned model to its committed (Live) version
// while some set of shards holds all of it, otherwise to the newest
// complete version. A staged version is not served before the manager
// commits it, and after a shard refuses a damaged file the previous
// version keeps serving.
func buildTable(shards map[string]topo.ShardInfo, assigns map[string]topo.Assignment, backends map[string]*backend) *table {
	t := &table{models: map[string]*modelRoute{}, replaced: make(chan struct{})}
	for name, a := range assigns {
		mr := &modelRoute{name: name, versions: map[uint64]*versionRoute{}}
		t.models[name] = mr
		for _, id := range slices.Sorted(maps.Keys(shards)) {
			si := shards[id]
			b := backends[si.Addr]
			if b == nil {
				continue
			}
			for _, l := range si.Loaded {
				if l.Model != name || l.Partitions == 0 || l.Dim < 0 || (l.Type != codec.TypeLR && l.Type != codec.TypeFM) {
					continue
				}
				vr := mr.versions[l.Version]
				if vr == nil {
					vr = &versionRoute{model: name, version: l.Version, typ: l.Type, dim: l.Dim, bias: l.Bias,
						partitions: l.Partitions, replicas: make([][]*backend, l.Partitions)}
					mr.versions[l.Version] = vr
				}
				if vr.partitions != l.Partitions || vr.typ != l.Type || vr.dim != l.Dim {
					continue // disagrees with another shard about this version: ignore it
				}
				for _, p := range l.Have {
					if p < vr.partitions {
						vr.replicas[p] = append(vr.replicas[p], b)
					}
				}
			}
		}
		for v, vr := range mr.versions {
			if slices.ContainsFunc(vr.replicas, func(r []*backend) bool { return len(r) == 0 }) {
				delete(mr.versions, v)
			}
		}
		// The committed version while it is complete; otherwise (before the
		// first commit, or after losing every replica of a partition) the
		// newest complete one.
		if vr := mr.versions[a.Live]; vr != nil {
			mr.live = vr
		} else if len(mr.versions) > 0 {
			mr.live = mr.versions[slices.Max(slices.Collect(maps.Keys(mr.versions)))]
		}
	}
	return t
}
