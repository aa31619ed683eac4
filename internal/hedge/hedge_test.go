package hedge

import (
	"testing"
	"time"
)

func TestLatencyP95(t *testing.T) {
	var l Latency
	for i := range minSamples - 1 {
		l.Observe(time.Duration(i+1) * time.Millisecond)
	}
	if p := l.P95(); p != 0 {
		t.Fatalf("p95 of %d samples = %v, want 0 (too few)", minSamples-1, p)
	}
	// 100 calls: 1ms..100ms; the p95 of the ring's newest 100 is 95ms.
	var m Latency
	for i := range 96 {
		m.Observe(time.Duration(i+1) * time.Millisecond)
	}
	if p := m.P95(); p != 92*time.Millisecond { // recomputed at 96: ceil(96*.95)=92nd
		t.Fatalf("p95 of 1..96ms = %v, want 92ms", p)
	}
	// The ring forgets: after 256 fast calls, an old slow spell is gone.
	for range 1000 {
		m.Observe(500 * time.Millisecond)
	}
	for range ringSize {
		m.Observe(time.Millisecond)
	}
	if p := m.P95(); p != time.Millisecond {
		t.Fatalf("p95 after %d calls of 1ms = %v, want 1ms", ringSize, p)
	}
	// Fewer than 5% slow calls (1 in 25) do not move the p95.
	var s Latency
	for i := range ringSize {
		d := time.Millisecond
		if i%25 == 0 {
			d = time.Second
		}
		s.Observe(d)
	}
	if p := s.P95(); p != time.Millisecond {
		t.Fatalf("p95 with 1 call in 25 slow = %v, want 1ms", p)
	}
}

func TestDelay(t *testing.T) {
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, Floor},
		{[]time.Duration{0, 0}, Floor},
		{[]time.Duration{time.Millisecond}, Floor},
		{[]time.Duration{3 * time.Millisecond, 7 * time.Millisecond, 0}, 7 * time.Millisecond},
	} {
		if got := Delay(c.in...); got != c.want {
			t.Errorf("Delay(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestPick(t *testing.T) {
	loads := []int64{3, 1, 1}
	load := func(i int) int64 { return loads[i] }
	for start, want := range []int{1, 1, 2, 1} { // ties go to the first from start
		if got := Pick(LeastLoaded, 3, start, 0, load); got != want {
			t.Errorf("LeastLoaded from %d = %d, want %d", start, got, want)
		}
	}
	for start, want := range []int{0, 1, 2, 0} {
		if got := Pick(Rotation, 3, start, 0, load); got != want {
			t.Errorf("Rotation from %d = %d, want %d", start, got, want)
		}
	}
	if got := Pick(LeastLoaded, 3, 0, 1<<1, load); got != 2 {
		t.Errorf("LeastLoaded excluding 1 = %d, want 2", got)
	}
	if got := Pick(Rotation, 3, 1, 1<<1, load); got != 2 {
		t.Errorf("Rotation from 1 excluding 1 = %d, want 2", got)
	}
	if got := Pick(LeastLoaded, 3, 0, 7, load); got != -1 {
		t.Errorf("every replica excluded: %d, want -1", got)
	}
	if got := Pick(Rotation, 3, -4, 0, load); got != 2 {
		t.Errorf("Rotation from -4 = %d, want 2", got)
	}
	if got := Pick(Rotation, 0, 0, 0, load); got != -1 {
		t.Errorf("no replicas: %d, want -1", got)
	}
	if got := Pick(Rotation, 70, 65, 0, func(int) int64 { return 0 }); got != 1 {
		t.Errorf("Rotation over 70 replicas from 65 = %d, want 1 (only 64 are asked)", got)
	}
}

func TestParseChoice(t *testing.T) {
	for _, c := range []Choice{LeastLoaded, Rotation} {
		if got, ok := ParseChoice(c.String()); !ok || got != c {
			t.Errorf("ParseChoice(%q) = %v, %v", c, got, ok)
		}
	}
	if _, ok := ParseChoice("random"); ok {
		t.Error("ParseChoice accepted random")
	}
}

// take takes n extra calls from b and, if it may, counts them as won:
// the budget's ratio alone.
func take(b *Budget, now time.Time, n int) bool {
	if !b.Take(now, n) {
		return false
	}
	b.Won(now, n)
	return true
}

func TestBudget(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := NewBudget(0.05, 10*time.Second)
	if take(b, t0, 1) {
		t.Fatal("an extra call allowed before any call")
	}
	b.Calls(t0, 100)
	for i := range 5 {
		if !take(b, t0.Add(time.Duration(i)*time.Second), 1) {
			t.Fatalf("extra call %d of 5 refused after 100 calls", i+1)
		}
	}
	if take(b, t0.Add(5*time.Second), 1) {
		t.Fatal("a sixth extra call allowed after 100 calls at 5%")
	}
	// More calls make room.
	b.Calls(t0.Add(9*time.Second), 20)
	if !take(b, t0.Add(9*time.Second), 1) {
		t.Fatal("extra call refused after 120 calls and 5 extras")
	}
	if take(b, t0.Add(9*time.Second), 1) {
		t.Fatal("extra call allowed past 5% of 120")
	}
	// The window slides: at t0+10s the first slot (100 calls, 1 extra)
	// has left; 20 calls and 5 extras remain, over budget.
	if take(b, t0.Add(10*time.Second), 1) {
		t.Fatal("extra call allowed after the 100 calls left the window")
	}
	// Long after, everything has left.
	later := t0.Add(time.Hour)
	b.Calls(later, 20)
	if !take(b, later, 1) || take(b, later, 1) {
		t.Fatal("a fresh window of 20 calls should allow exactly one extra")
	}
	// Several at once count as several.
	b2 := NewBudget(0.1, time.Second)
	b2.Calls(t0, 30)
	if take(b2, t0, 4) || !take(b2, t0, 3) {
		t.Fatal("of 30 calls at 10%, 4 extras at once must be refused and 3 allowed")
	}
	if !take(NewBudget(0, time.Second), t0, 0) || take(NewBudget(0, time.Second), t0, 1) {
		t.Fatal("a zero budget allows nothing but nothing")
	}
}

func TestStraggling(t *testing.T) {
	for _, c := range []struct {
		out, first int
		want       bool
	}{
		{1, 1, true}, {1, 2, true}, {2, 2, false}, {2, 4, true}, {3, 4, false}, {2, 3, true}, {3, 3, false}, {4, 8, true}, {5, 8, false},
		{0, 4, true},
	} {
		if got := Straggling(c.out, c.first); got != c.want {
			t.Errorf("Straggling(%d out of %d) = %v, want %v", c.out, c.first, got, c.want)
		}
	}
}

// Hedges that seldom win shrink the budget; hedges that win keep it.
func TestBudgetFollowsWins(t *testing.T) {
	t0 := time.Unix(2000, 0)
	spend := func(b *Budget, winEvery int) int {
		sent := 0
		for i := range 1000 {
			now := t0.Add(time.Duration(i) * time.Millisecond)
			b.Calls(now, 10)
			if b.Take(now, 1) {
				sent++
				if winEvery > 0 && sent%winEvery == 0 {
					b.Won(now, 1)
				}
			}
		}
		return sent
	}
	// 10,000 calls at 5%: 500 extra calls if they all win.
	if got := spend(NewBudget(0.05, 10*time.Second), 1); got != 500 {
		t.Errorf("every hedge winning: %d sent, want 500", got)
	}
	if got := spend(NewBudget(0.05, 10*time.Second), 2); got < 490 || got > 500 {
		t.Errorf("half the hedges winning: %d sent, want about 500", got)
	}
	// A quarter winning: about half the budget.
	if got := spend(NewBudget(0.05, 10*time.Second), 4); got < 230 || got > 270 {
		t.Errorf("a quarter of the hedges winning: %d sent, want about 250", got)
	}
	// None winning: a trickle (about the square root of the calls it would
	// allow), enough to notice when they start to win.
	if got := spend(NewBudget(0.05, 10*time.Second), 0); got > 40 {
		t.Errorf("no hedge winning: %d sent, want few", got)
	}
}
