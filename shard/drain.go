package shard

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cumulus-serving/cumulus/internal/topo"
)

// Drain stops the shard for a rolling restart without failing a lookup.
// It reports NOT_SERVING on gRPC health; leaves etcd, so routers rebuild
// their tables without it and the manager hands its partitions over;
// stops following the serving map (what it holds stays as it is); keeps
// answering the lookups that still come, from routers that have not yet
// seen it go, until none has come for Options.DrainQuiet; then stops,
// letting the calls under way finish. If ctx ends first, it stops at
// once, failing what is under way, and says so in its error. The shard
// is closed either way.
func (s *Shard) Drain(ctx context.Context) error {
	t0 := time.Now()
	begun := s.begun.Load()
	slog.Info("shard: draining", "shard", s.opts.ID, "in_flight", s.inflight.Load())
	s.health.Shutdown() // NOT_SERVING from now on, whatever the loader finds
	// Stop following the map before leaving etcd: the map the manager
	// writes once the shard has gone assigns it nothing, and applying it
	// would drop what the lookups still coming need. (The registration
	// follows the same context: cancelling starts the leaving too.)
	s.cancel()
	if s.reg != nil {
		s.reg.Close()
	}
	err := s.quiesce(ctx)
	if err == nil {
		close(s.quiet) // routers' lookup streams end once idle; GracefulStop waits for them
		stopped := make(chan struct{})
		go func() { s.srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	left := s.inflight.Load()
	s.halt(false)
	took := time.Since(t0).Round(time.Millisecond)
	if err != nil {
		slog.Warn("shard: drain timed out; stopped, failing the lookups under way", "shard", s.opts.ID, "in_flight", left, "took", took)
		return fmt.Errorf("shard %s: drain: %w with %d lookups under way; they were failed", s.opts.ID, err, left)
	}
	slog.Info("shard: drained", "shard", s.opts.ID, "lookups_answered", s.begun.Load()-begun, "took", took)
	return nil
}

// quiesce waits until no lookup is under way and none has begun for
// Options.DrainQuiet, or ctx ends.
func (s *Shard) quiesce(ctx context.Context) error {
	tick := time.NewTicker(max(s.opts.DrainQuiet/10, time.Millisecond))
	defer tick.Stop()
	last, since := s.begun.Load(), time.Now()
	for {
		if n := s.begun.Load(); n != last {
			last, since = n, time.Now()
		} else if s.inflight.Load() == 0 && time.Since(since) >= s.opts.DrainQuiet {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// setReady sets gRPC health from as, the serving map the loader follows
// (nil until it has read one): SERVING while the shard serves what the
// map gives it (servesAssigned) and its registration in etcd says so.
// A rolling restart waits for it before stopping the next shard.
//
// While a newer registration is being written (after every load), the
// one etcd holds is the last written: the shard stays ready if that one
// served what was assigned, so readiness does not flap around each write
// of a version staged beside the live one. Once the lease is lost, no
// registration is in etcd: not ready until one is written again. Loader
// goroutine only.
func (s *Shard) setReady(as map[string]topo.Assignment) {
	serves := as != nil && s.servesAssigned(as)
	switch {
	case s.reg.Current():
		s.servedWritten = serves
	case !s.reg.Held():
		s.servedWritten = false
	}
	ready := serves && s.servedWritten
	if ready == s.ready {
		return
	}
	s.ready = ready
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st) // ignored once draining
	slog.Info("shard: readiness changed", "shard", s.opts.ID, "ready", ready)
}

// servesAssigned reports whether the shard holds every partition of
// each live version the map assigns it, and is assigned some when any
// model is live. A shard restarted a moment ago, that the manager has
// not yet placed anything on, is not ready: nothing would be served if
// the next shard of a rolling restart stopped now. (A shard the map
// keeps idle, with more shards than partitions × replicas, stays not
// ready.)
func (s *Shard) servesAssigned(as map[string]topo.Assignment) bool {
	snap := s.snap.Load()
	anyLive, assigned := false, false
	for name, a := range as {
		if a.Live == 0 {
			continue
		}
		anyLive = true
		v := snap.get(name, a.Live)
		for p, reps := range a.Replicas {
			if !slices.Contains(reps, s.opts.ID) {
				continue
			}
			assigned = true
			if v == nil || p >= len(v.layers) || v.layers[p] == nil {
				return false
			}
		}
	}
	return assigned || !anyLive
}
