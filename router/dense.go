package router

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/model"
)

// Dense parts. A version of a type with one (model.Shape.HasDense) is
// scored with its dense part, which the serving map names by SHA-256
// and shards serve (shard.Service.Extra). When such a version first
// appears in the map — staged, standby or live — the router fetches its
// dense part from a replica that holds the version, checks the SHA-256
// and the layers, and keeps it as long as the map keeps a version that
// uses it: a rollback loads nothing. Until it holds it, the version is
// not routed: a request is never scored with one version's sparse values
// and another's dense part.
//
// The cache belongs to the watch goroutine; fetches run on their own and
// report back to it.

// denseEntry is one dense part, held or being fetched.
type denseEntry struct {
	d        *model.Dense
	fetching bool
	err      error     // the last fetch's failure
	fails    int       // fetches failed in a row
	retryAt  time.Time // when to fetch again after a failure
}

type denseResult struct {
	sum string
	d   *model.Dense
	err error
}

// denseFetchTimeout bounds one attempt at one shard.
const denseFetchTimeout = 30 * time.Second

// A failed fetch is tried again after denseRetry, doubling with each
// failure in a row up to denseRetryMax: a part no shard serves right
// costs a fetch (and a logged warning per shard) every 30s, not every
// second, for as long as the map keeps it.
const (
	denseRetry    = time.Second
	denseRetryMax = 30 * time.Second
)

// denseCache is the watch goroutine's record of dense parts.
type denseCache struct {
	entries map[string]*denseEntry
	results chan denseResult
}

func newDenseCache() *denseCache {
	return &denseCache{entries: map[string]*denseEntry{}, results: make(chan denseResult, 16)}
}

// held is the dense parts held, by SHA-256, for buildTable.
func (c *denseCache) held() map[string]*model.Dense {
	out := map[string]*model.Dense{}
	for sum, e := range c.entries {
		if e.d != nil {
			out[sum] = e.d
		}
	}
	return out
}

// update starts fetches for the dense parts the map's kept versions use
// that are neither held nor being fetched (nor waiting to be tried
// again), and forgets those no kept version uses. It returns when the
// next failed fetch is due again (zero: none).
func (c *denseCache) update(ctx context.Context, r *Router, shards map[string]topo.ShardInfo, assigns map[string]topo.Assignment, backends map[string]*backend) time.Time {
	used := map[string]bool{}
	var next time.Time
	for _, a := range assigns {
		for _, v := range a.Kept() {
			info := a.Info(v)
			if info == nil || info.Dense == "" {
				continue
			}
			used[info.Dense] = true
			e := c.entries[info.Dense]
			if e == nil {
				e = &denseEntry{}
				c.entries[info.Dense] = e
			}
			if e.d != nil || e.fetching {
				continue
			}
			if now := time.Now(); now.Before(e.retryAt) {
				if next.IsZero() || e.retryAt.Before(next) {
					next = e.retryAt
				}
				continue
			}
			from := holders(a, v, info, shards, backends)
			if len(from) == 0 {
				e.err = fmt.Errorf("no shard holds model %q version %d yet", a.Model, v)
				continue // the shards' next report brings a rebuild
			}
			e.fetching = true
			go func() {
				res := r.fetchDense(ctx, a.Model, v, info, from)
				select {
				case c.results <- res:
				case <-ctx.Done():
				}
			}()
		}
	}
	for sum := range c.entries {
		if !used[sum] {
			delete(c.entries, sum)
		}
	}
	return next
}

// done records a fetch's result.
func (c *denseCache) done(res denseResult) {
	e := c.entries[res.sum]
	if e == nil {
		return // no longer used
	}
	e.fetching, e.d, e.err = false, res.d, res.err
	if res.err != nil {
		e.retryAt = time.Now().Add(min(denseRetry<<min(e.fails, 5), denseRetryMax))
		e.fails++
	}
}

// reason says why the dense part sum is not held.
func (c *denseCache) reason(sum string) string {
	if e := c.entries[sum]; e != nil && e.err != nil {
		return "its dense part could not be fetched: " + e.err.Error()
	}
	return "its dense part is being fetched"
}

// holders are the backends of shards that report holding some
// partition of version v with the identity the map expects, in random
// order.
func holders(a topo.Assignment, v uint64, info *topo.VersionInfo, shards map[string]topo.ShardInfo, backends map[string]*backend) []*backend {
	seen := map[*backend]bool{}
	var out []*backend
	for p, ids := range a.Replicas {
		for _, id := range ids {
			si, ok := shards[id]
			if b := backends[si.Addr]; ok && b != nil && !seen[b] && p < len(info.IDs) && si.HoldsIn(&a, v, uint32(p)) {
				seen[b] = true
				out = append(out, b)
			}
		}
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// fetchDense asks each of from in turn for version v's dense part until
// one answers with bytes of the SHA-256 the map names, holding layers
// that fit the version's shape. Nothing a shard sends is trusted.
func (r *Router) fetchDense(ctx context.Context, name string, v uint64, info *topo.VersionInfo, from []*backend) denseResult {
	res := denseResult{sum: info.Dense}
	for _, b := range from {
		cctx, cancel := context.WithTimeout(ctx, denseFetchTimeout)
		raw, err := b.svc.Extra(cctx, name, v, codec.RoleDense)
		cancel()
		if err == nil {
			if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != info.Dense {
				err = fmt.Errorf("shard %s sent a dense part whose SHA-256 is not the serving map's", b.id)
			}
		}
		var d *model.Dense
		if err == nil {
			if d, err = info.Shape.ReadDense(raw); err != nil {
				err = fmt.Errorf("shard %s sent a dense part that does not fit %s: %w", b.id, info.Shape, err)
			}
		}
		if err == nil {
			slog.Info("router: fetched a dense part", "model", name, "version", v, "from", b.id, "bytes", len(raw))
			res.d, res.err = d, nil
			return res
		}
		slog.Warn("router: fetching a dense part failed", "model", name, "version", v, "from", b.id, "err", err)
		res.err = err
		if ctx.Err() != nil {
			break
		}
	}
	return res
}
