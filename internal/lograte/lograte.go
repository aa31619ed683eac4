// Package lograte keeps repeated warnings from flooding a process's log:
// anyone who can reach a port can make a server refuse them, and a
// condition that persists (a shard name already taken, etcd out of
// reach) is retried every fraction of a second.
//
// A line repeats another when its level, message and attributes are the
// same, but for where it came from (the attribute "from": a peer's
// address, a new port each time). Each such line may be logged Burst
// times at once, then once every Every; what is left out is counted on
// the next one logged (repeats_not_logged=N). Distinct events (a
// rejection of version 11, then of version 12) are not repeats. Past
// those, all warnings and errors together are held to Total a second
// (TotalBurst at once), so that lines made to differ (an attacker's
// paths) cannot flood the log either; the next line says how many were
// dropped (lines_not_logged=N). Info and debug lines, the process's
// record of what it did, pass unchanged.
package lograte

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Ten repeats of a line at once, then one every six seconds (ten a
// minute); and 50 warnings and errors a second in all, 200 at once.
const (
	Burst      = 10
	Every      = 6 * time.Second
	Total      = 50
	TotalBurst = 200
)

// maxLines bounds the distinct lines followed at once; past it, they are
// all forgotten (each may then log Burst lines again; Total still holds).
const maxLines = 4096

// New wraps next.
func New(next slog.Handler) slog.Handler {
	return handler{next: next, st: &state{seen: map[string]*seen{}, total: rate.NewLimiter(Total, TotalBurst)}}
}

type handler struct {
	next slog.Handler
	st   *state
}

type state struct {
	mu      sync.Mutex
	seen    map[string]*seen
	total   *rate.Limiter
	dropped int // by total, since the last line logged
}

type seen struct {
	lim     *rate.Limiter
	skipped int
}

// allow reports whether a line of key at t is logged, how many repeats
// of it were left out before it, and how many lines the total bound
// dropped.
func (s *state) allow(key string, t time.Time) (skipped, dropped int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.seen[key]
	if m == nil {
		if len(s.seen) >= maxLines {
			clear(s.seen)
		}
		m = &seen{lim: rate.NewLimiter(rate.Every(Every), Burst)}
		s.seen[key] = m
	}
	if !m.lim.AllowN(t, 1) {
		m.skipped++
		return 0, 0, false
	}
	if !s.total.AllowN(t, 1) {
		s.dropped++
		m.skipped++
		return 0, 0, false
	}
	skipped, m.skipped = m.skipped, 0
	dropped, s.dropped = s.dropped, 0
	return skipped, dropped, true
}

// key is what makes two lines repeats: level, message, and attributes
// but "from".
func key(r slog.Record) string {
	var b strings.Builder
	b.WriteString(r.Level.String())
	b.WriteByte(' ')
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "from" {
			b.WriteByte(' ')
			b.WriteString(a.String())
		}
		return true
	})
	return b.String()
}

func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	t := r.Time
	if t.IsZero() {
		t = time.Now()
	}
	skipped, dropped, ok := h.st.allow(key(r), t)
	if !ok {
		return nil
	}
	if skipped > 0 || dropped > 0 {
		r = r.Clone()
		if skipped > 0 {
			r.AddAttrs(slog.Int("repeats_not_logged", skipped))
		}
		if dropped > 0 {
			r.AddAttrs(slog.Int("lines_not_logged", dropped))
		}
	}
	return h.next.Handle(ctx, r)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	return handler{next: h.next.WithAttrs(as), st: h.st}
}

func (h handler) WithGroup(name string) slog.Handler {
	return handler{next: h.next.WithGroup(name), st: h.st}
}
