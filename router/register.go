package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/model"
)

// A router registers under routers/ID with a lease, saying which of the
// versions the serving map keeps it can score and why not the others
// (topo.RouterInfo), so that the manager commits a version only once
// every router can score it.

// routerSeq numbers the routers of one process after the first, so that
// each has its own default ID.
var routerSeq atomic.Int64

// defaultID is the host name and pid, and a number for a process's
// second router on.
func defaultID() string {
	host, _ := os.Hostname()
	id := fmt.Sprintf("%s-%d", host, os.Getpid())
	if n := routerSeq.Add(1); n > 1 {
		id = fmt.Sprintf("%s-%d", id, n)
	}
	return id
}

// register registers the router, retrying until it is registered or ctx
// ends: a router serves without etcd (503 until it has read the serving
// map), so it does not wait for etcd to start.
func (r *Router) register(ctx context.Context) {
	wait := 500 * time.Millisecond
	for {
		r.regMu.Lock()
		v := r.regValue
		r.regMu.Unlock()
		reg, err := topo.Register(ctx, r.opts.Etcd, r.opts.Cluster.RouterKey(r.opts.ID), v, r.opts.LeaseTTL)
		if err == nil {
			r.regMu.Lock()
			r.reg = reg
			reg.Set(r.regValue) // what changed meanwhile
			r.regMu.Unlock()
			return
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, topo.ErrTaken) {
			slog.Error("router: another live router is registered under this ID; this one takes no part in rollouts until it can register: give each router its own --id", "id", r.opts.ID, "in", wait, "err", err)
		} else {
			slog.Warn("router: registering failed; trying again", "id", r.opts.ID, "in", wait, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// setRegistration updates what the router says of itself.
func (r *Router) setRegistration(v string) {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	r.regValue = r.withMetrics(v)
	if r.reg != nil {
		r.reg.Set(r.regValue)
	}
}

// withMetrics is registration v saying where the router's metrics are
// (SetMetrics), however long ago v was made.
func (r *Router) withMetrics(v string) string {
	u := r.metrics.Load()
	if u == nil {
		return v
	}
	var info topo.RouterInfo
	if err := json.Unmarshal([]byte(v), &info); err != nil || info.Metrics == *u {
		return v
	}
	info.Metrics = *u
	b, _ := json.Marshal(info)
	return string(b)
}

// SetMetrics says, in the router's registration, where its Prometheus
// metrics are served (a URL, "http://HOST:PORT/metrics"): the managers
// read them for the console. A host of 0.0.0.0 or [::] is replaced by
// this machine's first address that is not a loopback one.
func (r *Router) SetMetrics(u string) {
	u = ReachableURL(u)
	// Stored first: a registration made before, and set after, gets it
	// too (setRegistration).
	r.metrics.Store(&u)
	r.regMu.Lock()
	defer r.regMu.Unlock()
	r.regValue = r.withMetrics(r.regValue)
	if r.reg != nil {
		r.reg.Set(r.regValue)
	}
}

// ReachableURL replaces an unspecified host (0.0.0.0, [::]) in URL u
// by this machine's first address that is not a loopback one, so that
// other machines can reach it; u is returned as it is otherwise.
func ReachableURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	host, port, err := net.SplitHostPort(p.Host)
	if err != nil {
		return u
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return u
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			p.Host = net.JoinHostPort(n.IP.String(), port)
			return p.String()
		}
	}
	p.Host = net.JoinHostPort("127.0.0.1", port)
	return p.String()
}

// registration is what the router says of itself given the serving map
// and the dense parts it holds.
func (r *Router) registration(assigns map[string]topo.Assignment, dense *denseCache) string {
	info := topo.RouterInfo{Schema: topo.RouterInfoSchema, ID: r.opts.ID, Addr: r.opts.Advertise, Build: r.opts.Build,
		Scores: map[string][]uint64{}, Seen: map[string]uint64{}}
	held := dense.held()
	for _, name := range slices.Sorted(maps.Keys(assigns)) {
		a := assigns[name]
		info.Seen[name] = a.Seq
		for _, v := range slices.Sorted(slices.Values(a.Kept())) {
			vi := a.Info(v)
			if vi == nil {
				continue
			}
			if why := cannotScore(vi, held, dense); why != "" {
				info.Cannot = append(info.Cannot, topo.Unscorable{Model: name, Version: v, Reason: why})
				continue
			}
			info.Scores[name] = append(info.Scores[name], v)
		}
	}
	b, _ := json.Marshal(info)
	return string(b)
}

// cannotScore says why this router cannot score version vi, or "".
func cannotScore(vi *topo.VersionInfo, held map[string]*model.Dense, dense *denseCache) string {
	if vi.Dense != "" && held[vi.Dense] == nil {
		return dense.reason(vi.Dense)
	}
	if err := vi.Shape.Validate(); err != nil {
		return "this router's build cannot score it: " + err.Error()
	}
	return ""
}
