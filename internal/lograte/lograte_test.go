package lograte

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// logAt logs msg at level and time t through h.
func logAt(h slog.Handler, level slog.Level, msg string, t time.Time) {
	r := slog.NewRecord(t, level, msg, 0)
	h.Handle(context.Background(), r)
}

func count(buf *bytes.Buffer, s string) int { return strings.Count(buf.String(), s) }

// TestRepeatedWarnings: a warning repeated 100 times in a second is
// logged Burst times; the next one Every later says how many were left
// out. Another message, and info lines, are not held back by it.
func TestRepeatedWarnings(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 100 {
		logAt(h, slog.LevelWarn, "admin call refused", t0.Add(time.Duration(i)*10*time.Millisecond))
		logAt(h, slog.LevelInfo, "loaded partition", t0.Add(time.Duration(i)*10*time.Millisecond))
	}
	if n := count(&buf, "admin call refused"); n != Burst {
		t.Fatalf("%d lines of a warning repeated 100 times in a second, want %d", n, Burst)
	}
	if n := count(&buf, "loaded partition"); n != 100 {
		t.Fatalf("%d of 100 info lines", n)
	}
	logAt(h, slog.LevelError, "another message", t0.Add(time.Second))
	if n := count(&buf, "another message"); n != 1 {
		t.Fatalf("another message held back: %d lines", n)
	}
	buf.Reset()
	logAt(h, slog.LevelWarn, "admin call refused", t0.Add(time.Second+Every))
	if !strings.Contains(buf.String(), "repeats_not_logged=90") {
		t.Fatalf("the next line after the burst: %q, want repeats_not_logged=90", buf.String())
	}
}

// TestSharedAcrossWith: loggers made With attributes share the counts.
func TestSharedAcrossWith(t *testing.T) {
	var buf bytes.Buffer
	base := slog.New(New(slog.NewTextHandler(&buf, nil)))
	for i := range 3 * Burst {
		base.With("shard", i).Warn("shard name taken")
	}
	if n := count(&buf, "shard name taken"); n != Burst {
		t.Fatalf("%d lines through loggers With attributes, want %d", n, Burst)
	}
}

// TestBounded: past maxMessages distinct messages the counts start
// again rather than grow.
func TestBounded(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, nil)).(handler)
	t0 := time.Now()
	for i := range maxMessages + 10 {
		logAt(h, slog.LevelWarn, "m"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+time.Duration(i).String(), t0)
	}
	if n := len(h.st.seen); n > maxMessages {
		t.Fatalf("%d messages followed, bound %d", n, maxMessages)
	}
}
