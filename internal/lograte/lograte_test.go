package lograte

import (
	"bytes"
	"context"
	"fmt"
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

// TestBounded: past maxLines distinct lines the counts start again
// rather than grow.
func TestBounded(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, nil)).(handler)
	t0 := time.Now()
	for i := range maxLines + 10 {
		logAt(h, slog.LevelWarn, "m"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+time.Duration(i).String(), t0)
	}
	if n := len(h.st.seen); n > maxLines {
		t.Fatalf("%d messages followed, bound %d", n, maxLines)
	}
}

// TestDistinctEventsAndPeers: lines that differ in an attribute are
// distinct events, all logged; lines that differ only in "from" (a
// peer's address) are repeats.
func TestDistinctEventsAndPeers(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewTextHandler(&buf, nil)))
	for v := range 12 {
		log.Warn("version rejected", "version", v)
	}
	if n := count(&buf, "version rejected"); n != 12 {
		t.Fatalf("%d of 12 distinct rejections logged", n)
	}
	for p := range 100 {
		log.Warn("refused a connection", "from", fmt.Sprintf("10.0.0.1:%d", 40000+p), "reason", "no certificate")
	}
	if n := count(&buf, "refused a connection"); n != Burst {
		t.Fatalf("%d lines for 100 refusals differing only in the peer's port, want %d", n, Burst)
	}
}

// TestTotal: lines made to differ (an attacker's paths) are held to
// TotalBurst at once, and the next line logged says how many were
// dropped.
func TestTotal(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, nil))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 1000 {
		r := slog.NewRecord(t0, slog.LevelWarn, "admin call refused", 0)
		r.AddAttrs(slog.String("path", fmt.Sprintf("/admin/v1/%d", i)))
		h.Handle(context.Background(), r)
	}
	if n := count(&buf, "admin call refused"); n != TotalBurst {
		t.Fatalf("%d of 1000 distinct lines in one instant, want %d", n, TotalBurst)
	}
	buf.Reset()
	logAt(h, slog.LevelError, "later", t0.Add(time.Second))
	if !strings.Contains(buf.String(), "lines_not_logged=800") {
		t.Fatalf("the next line: %q, want lines_not_logged=800", buf.String())
	}
}
