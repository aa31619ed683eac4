package hedge

import (
	"sync"
	"time"
)

const budgetSlots = 10

// Budget bounds extra calls to a fraction of the calls made over a
// sliding window, kept as budgetSlots slots of window/budgetSlots each.
// The fraction shrinks while extra calls seldom win: hedges that lose are
// pure cost, as when calls are late because the whole machine is busy
// rather than because one shard is slow. While at least half of them
// win (a straggler's hedges nearly all do) the whole fraction may be
// spent; below that, in proportion (see Take). Safe for concurrent use.
type Budget struct {
	ratio float64
	width time.Duration
	mu    sync.Mutex
	slots [budgetSlots]budgetSlot
}

type budgetSlot struct {
	at                  int64 // which slot of time it counts: now/width
	calls, extras, wins int64
}

// NewBudget allows extra calls up to ratio times the calls made over the
// last window. A ratio of 0 allows none.
func NewBudget(ratio float64, window time.Duration) *Budget {
	return &Budget{ratio: ratio, width: max(window/budgetSlots, time.Nanosecond)}
}

// slot is the slot counting now, reset if it last counted an older one.
func (b *Budget) slot(now time.Time) *budgetSlot {
	at := now.UnixNano() / int64(b.width)
	s := &b.slots[at%budgetSlots]
	if s.at != at {
		*s = budgetSlot{at: at}
	}
	return s
}

// Calls records n calls made at now.
func (b *Budget) Calls(now time.Time, n int) {
	b.mu.Lock()
	b.slot(now).calls += int64(n)
	b.mu.Unlock()
}

// Won records n extra calls that answered first, at now.
func (b *Budget) Won(now time.Time, n int) {
	b.mu.Lock()
	b.slot(now).wins += int64(n)
	b.mu.Unlock()
}

// Take spends n extra calls at now if the window's extra calls, these
// included, stay within its allowance; it reports whether it did. The
// allowance is ratio of the window's calls, times 2(wins+1)/(extras+2)
// when that is below 1: the share of extra calls that won, counted
// against one half, with one win in one call assumed so that an idle
// window allows the whole ratio.
func (b *Budget) Take(now time.Time, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.slot(now)
	oldest := cur.at - budgetSlots + 1
	var calls, extras, wins int64
	for i := range b.slots {
		if s := &b.slots[i]; s.at >= oldest && s.at <= cur.at {
			calls += s.calls
			extras += s.extras
			wins += s.wins
		}
	}
	allowed := b.ratio * float64(calls) * min(1, 2*float64(wins+1)/float64(extras+2))
	if float64(extras+int64(n)) > allowed {
		return false
	}
	cur.extras += int64(n)
	return true
}
