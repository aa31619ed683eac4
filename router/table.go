package router

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/hedge"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/shard"
)

// backend is one shard as the router sees it. It outlives table
// rebuilds, and with it what the router has learned of the shard.
type backend struct {
	id       string
	addr     string
	svc      shard.Service
	slot     int          // its number, dense among live backends
	inflight atomic.Int64 // calls outstanding
	failedAt atomic.Int64 // when a call last failed (not cancelled), Unix ns
	latency  hedge.Latency
	scale    hedge.Scale // its calls' hedge delay, times the base
	delay    prometheus.Gauge
	calls    struct{ ok, failed, cancelled prometheus.Observer }
	// stored: bit e set if the shard sends records of encoding e as
	// stored (its registration's Encodings, as last read).
	stored atomic.Uint32
}

// offer records the encodings si says its records are sent as stored in.
func (b *backend) offer(si topo.ShardInfo) {
	var bits uint32
	for _, name := range si.Encodings {
		if e, ok := codec.Encodings[name]; ok {
			bits |= 1 << e
		}
	}
	b.stored.Store(bits)
}

// offers reports whether b sends records of encoding e as stored.
func (b *backend) offers(e codec.Encoding) bool { return b.stored.Load()>>e&1 == 1 }

// failedLoad is what a recent failure weighs in a replica's load: a
// replica that fails at once has no calls outstanding, and would
// otherwise be chosen first, failing every call it is given.
const (
	failedLoad   = 1 << 20
	failedWindow = int64(time.Second)
)

// load is what choosing b weighs at now (Unix ns): its calls outstanding,
// and failedLoad for a failure within the last failedWindow.
func (b *backend) load(now int64) int64 {
	l := b.inflight.Load()
	if now-b.failedAt.Load() < failedWindow {
		l += failedLoad
	}
	return l
}

// versionRoute is one complete model version: every partition has at
// least one shard that reports holding it.
type versionRoute struct {
	model      string
	version    uint64
	shape      model.Shape
	enc        codec.Encoding // how its factors are stored: shards that offer it send them so
	scorer     model.Scorer   // built once per routing table
	partitions uint32
	replicas   [][]*backend // partition → shards holding it
	asks       int          // replicas of all partitions: most calls a request can make
}

func (v *versionRoute) width() int { return v.shape.Width() }

// modelRoute is everything servable of one assigned model.
type modelRoute struct {
	name     string
	live     *versionRoute            // nil: no complete version yet
	versions map[uint64]*versionRoute // every complete version
	why      string                   // why live is nil, when the map names one
	// canary answers the unpinned requests whose draw is below
	// threshold (see canary.go); nil: none.
	canary    *versionRoute
	threshold uint64
	// The tracks' metrics (tracks.label).
	stableObs, canaryObs *trackMetrics
}

// table is an immutable routing snapshot; requests read it through an
// atomic pointer and never lock.
type table struct {
	models   map[string]*modelRoute
	replaced chan struct{} // closed once a newer table is in place
	rev      int64         // the etcd revision it reflects
}

// buildTable routes each model as the serving map says: unpinned
// requests to its Live version (and a share to its Canary), requests
// pinned to a version to Live, Canary or a Standby version; never a
// Staged one, but for the manager's gate router
// (staged), which routes pinned requests to it. A partition goes only to shards
// the map assigns it to that are registered (alive under their lease) and
// report exactly the content identity the map expects, so a shard loaded
// from another repository, or a stale report, gets no traffic. A version
// some partition of which has no such replica is not servable: requests
// for it fail at once rather than go elsewhere.
//
// A version of a type with a dense part is routed only once the router
// holds it (dense, by SHA-256; see dense.go).
func buildTable(shards map[string]topo.ShardInfo, assigns map[string]topo.Assignment, backends map[string]*backend, dense *denseCache, staged bool) *table {
	t := &table{models: map[string]*modelRoute{}, replaced: make(chan struct{})}
	held := dense.held()
	for name, a := range assigns {
		mr := &modelRoute{name: name, versions: map[uint64]*versionRoute{}}
		t.models[name] = mr
		versions := append([]uint64{a.Live, a.Canary}, a.Standby...)
		if staged && a.Staged != 0 {
			versions = append(versions, a.Staged)
		}
		for _, v := range versions {
			if vr := route(a, v, shards, backends, held); vr != nil {
				mr.versions[v] = vr
			}
		}
		mr.live = mr.versions[a.Live]
		if mr.canary = mr.versions[a.Canary]; mr.canary != nil {
			mr.threshold = threshold(a.CanaryFraction)
		}
		if info := a.Info(a.Live); mr.live == nil && info != nil && info.Dense != "" && held[info.Dense] == nil {
			mr.why = fmt.Sprintf("model %q version %d cannot be scored yet: %s", name, a.Live, dense.reason(info.Dense))
		}
	}
	return t
}

// route is version v of a's model with every partition's trusted
// replicas, or nil when some partition has none, or the router cannot
// score it (a type this build does not know, a dense part it does not
// hold).
func route(a topo.Assignment, v uint64, shards map[string]topo.ShardInfo, backends map[string]*backend, dense map[string]*model.Dense) *versionRoute {
	info := a.Info(v)
	if v == 0 || info == nil {
		return nil
	}
	var d *model.Dense
	if info.Dense != "" {
		if d = dense[info.Dense]; d == nil {
			return nil
		}
	}
	scorer, err := info.Shape.Scorer(info.Bias, d)
	if err != nil {
		return nil
	}
	vr := &versionRoute{model: a.Model, version: v, shape: info.Shape, scorer: scorer, enc: codec.Encodings[info.Encoding],
		partitions: a.Partitions, replicas: make([][]*backend, a.Partitions)}
	for p, ids := range a.Replicas {
		for _, id := range ids {
			si, ok := shards[id]
			if b := backends[si.Addr]; ok && b != nil && si.HoldsIn(&a, v, uint32(p)) {
				vr.replicas[p] = append(vr.replicas[p], b)
			}
		}
		if len(vr.replicas[p]) == 0 {
			return nil
		}
		vr.asks += min(len(vr.replicas[p]), 64)
	}
	return vr
}
