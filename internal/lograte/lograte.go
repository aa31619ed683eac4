// Package lograte keeps repeated warnings from flooding a process's log:
// anyone who can reach a port can make a server refuse them, and a
// condition that persists (a shard name already taken, etcd out of
// reach) is retried every fraction of a second. Each warning or error
// message may be logged Burst times at once, then once every Every; what
// is left out is counted on the next line of that message
// (repeats_not_logged=N). Info and debug lines, the process's record of
// what it did, pass unchanged.
package lograte

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Ten lines of one message at once, then one every six seconds (ten a
// minute).
const (
	Burst = 10
	Every = 6 * time.Second
)

// maxMessages bounds the messages followed at once; past it, they are
// all forgotten (each may then log Burst lines again).
const maxMessages = 4096

// New wraps next.
func New(next slog.Handler) slog.Handler {
	return handler{next: next, st: &state{seen: map[string]*seen{}}}
}

type handler struct {
	next slog.Handler
	st   *state
}

type state struct {
	mu   sync.Mutex
	seen map[string]*seen
}

type seen struct {
	lim     *rate.Limiter
	skipped int
}

// allow reports whether a line of message key at t is logged, and how
// many were left out before it.
func (s *state) allow(key string, t time.Time) (skipped int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.seen[key]
	if m == nil {
		if len(s.seen) >= maxMessages {
			clear(s.seen)
		}
		m = &seen{lim: rate.NewLimiter(rate.Every(Every), Burst)}
		s.seen[key] = m
	}
	if !m.lim.AllowN(t, 1) {
		m.skipped++
		return 0, false
	}
	skipped, m.skipped = m.skipped, 0
	return skipped, true
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
	skipped, ok := h.st.allow(r.Level.String()+" "+r.Message, t)
	if !ok {
		return nil
	}
	if skipped > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("repeats_not_logged", skipped))
	}
	return h.next.Handle(ctx, r)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	return handler{next: h.next.WithAttrs(as), st: h.st}
}

func (h handler) WithGroup(name string) slog.Handler {
	return handler{next: h.next.WithGroup(name), st: h.st}
}
