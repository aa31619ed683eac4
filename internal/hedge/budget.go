package hedge

import (
	"sync"
	"time"
)

const budgetSlots = 10

// Budget bounds extra calls to a fraction of the calls made over a
// sliding window, kept as budgetSlots slots of window/budgetSlots each.
// Safe for concurrent use.
type Budget struct {
	ratio float64
	width time.Duration
	mu    sync.Mutex
	slots [budgetSlots]budgetSlot
}

type budgetSlot struct {
	at            int64 // which slot of time it counts: now/width
	calls, extras int64
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

// Take spends n extra calls at now if the window's extra calls, these
// included, stay within ratio of its calls; it reports whether it did.
func (b *Budget) Take(now time.Time, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.slot(now)
	oldest := cur.at - budgetSlots + 1
	var calls, extras int64
	for i := range b.slots {
		if s := &b.slots[i]; s.at >= oldest && s.at <= cur.at {
			calls += s.calls
			extras += s.extras
		}
	}
	if float64(extras+int64(n)) > b.ratio*float64(calls) {
		return false
	}
	cur.extras += int64(n)
	return true
}
