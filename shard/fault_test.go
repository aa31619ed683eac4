package shard

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestParseFaults(t *testing.T) {
	f, err := ParseFaults(" delay=50ms,fraction=0.01; error=resource_exhausted ,fraction=0.5;stall,fraction=1;diskdelay=5ms,fraction=0.25")
	if err != nil {
		t.Fatal(err)
	}
	want := []fault{{kind: "delay", delay: 50 * time.Millisecond, fraction: 0.01}, {kind: "error", code: codes.ResourceExhausted, fraction: 0.5}, {kind: "stall", fraction: 1},
		{kind: "diskdelay", delay: 5 * time.Millisecond, fraction: 0.25}}
	if len(f.faults) != len(want) {
		t.Fatalf("%d faults, want %d", len(f.faults), len(want))
	}
	for i := range want {
		if f.faults[i] != want[i] {
			t.Errorf("fault %d = %+v, want %+v", i, f.faults[i], want[i])
		}
	}
	if r := f.diskReads(nil, nil); r == nil || r.delay != 5*time.Millisecond || r.fraction != 0.25 {
		t.Errorf("diskdelay: reads %+v", r)
	}
	if f, err := ParseFaults("  "); f != nil || err != nil || f.String() != "" {
		t.Errorf("empty spec: %v, %v", f, err)
	}
	if c := codeNames["deadline_exceeded"]; c != codes.DeadlineExceeded {
		t.Errorf("deadline_exceeded = %v", c)
	}
	for _, bad := range []string{
		"delay", "delay=", "delay=-1s", "delay=0s", "delay=fast", "error", "error=Unavailable", "error=ok", "stall=1s",
		"slow", "delay=1ms,fraction=0", "delay=1ms,fraction=1.5", "delay=1ms,fraction=NaN", "delay=1ms,fraction=x",
		"delay=1ms,fraction=0.5,fraction=0.5", "delay=1ms,every=2", "delay=1ms;", ";", "diskdelay", "diskdelay=0s", strings.Repeat("stall;", 200),
	} {
		if _, err := ParseFaults(bad); err == nil {
			t.Errorf("ParseFaults(%q) accepted", bad)
		}
	}
}

func TestFaultsApply(t *testing.T) {
	drawn := map[string]int{}
	count := func(k string) { drawn[k]++ }
	f, _ := ParseFaults("error=unavailable")
	if err := f.apply(context.Background(), count); status.Code(err) != codes.Unavailable {
		t.Errorf("error=unavailable: %v", err)
	}
	// A stall ends when the caller gives up, with its error.
	f, _ = ParseFaults("stall")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.apply(ctx, count); status.Code(err) != codes.Canceled {
		t.Errorf("stall, caller gone: %v", err)
	}
	// So does a delay.
	f, _ = ParseFaults("delay=1h")
	if err := f.apply(ctx, count); status.Code(err) != codes.Canceled {
		t.Errorf("delay, caller gone: %v", err)
	}
	// A delay alone answers late, not wrong.
	f, _ = ParseFaults("delay=1ms")
	if err := f.apply(context.Background(), count); err != nil {
		t.Errorf("delay=1ms: %v", err)
	}
	// Each fault is drawn on its own: at 0.5, about half the lookups.
	f, _ = ParseFaults("delay=1ns,fraction=0.5")
	for range 2000 {
		f.apply(context.Background(), count)
	}
	if n := drawn["delay"] - 2; n < 850 || n > 1150 {
		t.Errorf("delay at fraction 0.5 drawn %d times in 2000", n)
	}
	if err := (*Faults)(nil).apply(ctx, count); err != nil {
		t.Errorf("no faults: %v", err)
	}
}

func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{"delay=50ms,fraction=0.01", "error=unavailable;stall,fraction=0.001", "stall", ";,=", "delay=1ms,fraction=1e-300"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fs, err := ParseFaults(s)
		if err != nil {
			return
		}
		if fs == nil {
			if strings.TrimSpace(s) != "" {
				t.Fatalf("%q: no faults and no error", s)
			}
			return
		}
		again, err := ParseFaults(fs.String())
		if err != nil || len(again.faults) != len(fs.faults) {
			t.Fatalf("%q does not parse again: %v", fs, err)
		}
		for _, ft := range fs.faults {
			if !(ft.fraction > 0 && ft.fraction <= 1) || (ft.kind == "delay" && ft.delay <= 0) {
				t.Fatalf("%q: accepted %+v", s, ft)
			}
		}
	})
}
