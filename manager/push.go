// Pushes (Online updates): the window and the producers' sequences, a
// pure part the push server (pushserver.go) drives with its clock.

package manager

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/loader"
)

// A trainer pushes the absolute values of the rows it changed, in
// batches numbered per producer. The leader gathers a model's batches in
// an open window; every PushLimits.Window (or sooner, when the window
// grows past PushLimits.WindowBytes) the window is sealed into one delta
// on the model's newest version, last value winning per id. A batch is
// answered once the delta holding it is published: the delta's manifest
// names each producer's highest sequence in it (codec.Manifest.Pushed),
// so that a leader taking over knows what was sealed from the state and
// the repository alone. Per producer:
//
//	sequence ≤ sealed               a duplicate: answered, not applied again
//	sealed < sequence ≤ accepted    a duplicate of a batch in a window not yet
//	                                answered: answered with that window
//	sequence = accepted + 1         applied to the open window
//	any other                       refused, naming accepted + 1
//
// A window that cannot be published fails, and so does every window
// after it: each producer starts again from its sealed mark.

// PushBatch is one producer's batch for one model, decoded.
type PushBatch struct {
	Model    string
	Producer string
	Sequence uint64
	// IDs are the rows upserted; Values their values, Width per row.
	IDs     []uint64
	Values  []float32
	Deletes []uint64
	// parts are the rows' partitions of partsOf (partitions), when the
	// server found them before taking its lock.
	parts   []uint32
	partsOf uint32
}

// Size is what the batch weighs in a window of width values per row,
// in bytes (each row's id and values, and a deletion's row too): what a
// window and a producer's in-flight bound count. It can be far more than
// the batch's encoding: a deletion of a small id is a byte or two of
// protobuf.
func (b *PushBatch) Size(width int) int64 {
	return int64(len(b.IDs)+len(b.Deletes))*rowWeight(width) + int64(len(b.Producer)) + 64
}

// Check refuses a batch that cannot be applied to a model of width
// values per row: a bad producer ID or sequence, values not width per
// id, a value NaN or infinite (the finite gate would reject the delta),
// an id both upserted and deleted.
func (b *PushBatch) Check(width int) error {
	switch {
	case !codec.ValidProducer(b.Producer):
		return fmt.Errorf("%w: producer %.40q (%d bytes): give 1 to 128 of [A-Za-z0-9._:-]", ErrInvalid, b.Producer, len(b.Producer))
	case b.Sequence == 0:
		return fmt.Errorf("%w: sequence 0: a producer numbers its batches from 1", ErrInvalid)
	case len(b.Values) != len(b.IDs)*width:
		return fmt.Errorf("%w: %d values for %d ids: model %s takes %d values per id", ErrInvalid, len(b.Values), len(b.IDs), b.Model, width)
	}
	for i, v := range b.Values {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: id %d has value %v at %d: values must be finite", ErrInvalid, b.IDs[i/width], v, i%width)
		}
	}
	if len(b.Deletes) > 0 {
		up := make(map[uint64]struct{}, len(b.IDs))
		for _, id := range b.IDs {
			up[id] = struct{}{}
		}
		for _, id := range b.Deletes {
			if _, ok := up[id]; ok {
				return fmt.Errorf("%w: id %d is both upserted and deleted in one batch", ErrInvalid, id)
			}
		}
	}
	return nil
}

// PushLimits bound one model's pushes on the leader.
type PushLimits struct {
	// Window is how long a window gathers batches before it is sealed.
	Window time.Duration
	// WindowBytes: a window that grows past it is sealed at once.
	WindowBytes int64
	// InFlight bounds a producer's bytes in windows not yet answered.
	InFlight int64
	// ProducerTTL: a producer idle this long is forgotten (its sealed
	// mark too: it numbers from 1 again).
	ProducerTTL time.Duration
	// MaxProducers bounds the producers a model keeps.
	MaxProducers int
}

// ErrSequence is a batch's sequence that is neither a duplicate nor the
// next one.
var ErrSequence = errors.New("manager: sequence out of order")

// SequenceError is a batch refused for its sequence.
type SequenceError struct {
	Producer      string
	Got, Expected uint64
}

func (e *SequenceError) Error() string {
	return fmt.Sprintf("manager: producer %s sent sequence %d; expected %d (send the batches from %d in order)", e.Producer, e.Got, e.Expected, e.Expected)
}

func (e *SequenceError) Is(target error) bool { return target == ErrSequence }

// ErrBusy is a push refused for a bound: the producer's bytes in flight,
// the model's producers, a pending delta's bytes.
var ErrBusy = errors.New("manager: over a push bound")

// pushLog is one model's pushes on the leader: its producers and its
// open window. Not safe for concurrent use.
type pushLog struct {
	lim        PushLimits
	width      int
	partitions uint32
	producers  map[string]*pushProducer
	open       *pushWindow
	// lastRows sizes a new window as the last one ended.
	lastRows int
	// held is what the windows sealed while a pin or a canary held the
	// model merged into (nil: none): each such window is published as
	// one delta on base holding all of them, replacing the last (version).
	held *heldPushes
}

// heldPushes are a held model's pushes: one pending delta.
type heldPushes struct {
	hold          string // what holds the model ("pin 7", "canary 9")
	base, version uint64
	rows          *pushWindow // merged, as last published
}

type pushProducer struct {
	sealed   uint64      // highest sequence in a published delta
	accepted uint64      // highest applied to a window (≥ sealed)
	last     *pushWindow // the window holding accepted, until it is answered
	inFlight int64       // bytes in windows not yet answered
	seen     time.Time
}

// pushWindow is a window of one model's batches, then its answer.
type pushWindow struct {
	opened time.Time
	width  int
	// ids and values are the rows as they came, in order (values width
	// per row); a deletion is a row whose deleted bit is set. The seal
	// merges them, last row winning per id: appending is what a batch
	// costs, and the window pays a split by partition and a merge of
	// each when sealed (split, last).
	ids     []uint64
	values  []float32
	deleted []uint64 // bit i: row i deletes its id
	// parts are the rows' partitions (of the model's partitions), found
	// as batches come: the seal splits the rows by them at once.
	parts      []uint32
	partitions uint32
	bytes      int64
	// marks are the highest sequence of each producer in the window;
	// charges what each producer's batches weigh.
	marks   map[string]uint64
	charges map[string]int64
	// done is closed once version or err is set.
	done    chan struct{}
	version uint64
	err     error
}

func newPushLog(lim PushLimits, width int, partitions uint32) *pushLog {
	return &pushLog{lim: lim, width: width, partitions: partitions, producers: map[string]*pushProducer{}}
}

// offer applies b (checked) to the open window, given the producer's
// sealed mark as the state knows it, and returns the window whose answer
// is b's; dup says b was already applied (w nil: already sealed).
func (l *pushLog) offer(b *PushBatch, sealed uint64, now time.Time) (w *pushWindow, dup bool, err error) {
	p := l.producers[b.Producer]
	known := p != nil
	if !known {
		p = &pushProducer{} // kept once a batch of it is applied: refusals and duplicates hold no place
	}
	p.seen = now
	p.sealed = max(p.sealed, sealed)
	p.accepted = max(p.accepted, p.sealed)
	switch {
	case b.Sequence <= p.sealed:
		return nil, true, nil
	case b.Sequence <= p.accepted:
		return p.last, true, nil
	case b.Sequence != p.accepted+1:
		return nil, false, &SequenceError{Producer: b.Producer, Got: b.Sequence, Expected: p.accepted + 1}
	}
	if !known && len(l.producers) >= l.lim.MaxProducers {
		l.forget(now)
		if len(l.producers) >= l.lim.MaxProducers {
			return nil, false, fmt.Errorf("%w: model %s has %d producers with batches in flight, the most it keeps (--max-push-producers): wait for answers", ErrBusy, b.Model, len(l.producers))
		}
	}
	size := b.Size(l.width)
	if p.inFlight+size > l.lim.InFlight {
		return nil, false, fmt.Errorf("%w: producer %s has %d bytes in windows not yet answered, and the batch's %d would pass the bound of %d: wait for answers, or send smaller batches", ErrBusy, b.Producer, p.inFlight, size, l.lim.InFlight)
	}
	if l.open != nil && l.open.bytes+size > 2*l.lim.WindowBytes {
		return nil, false, fmt.Errorf("%w: model %s's open window holds %d bytes, twice what is sealed at once: wait for answers", ErrBusy, b.Model, l.open.bytes)
	}
	if l.open == nil {
		l.open = &pushWindow{opened: now, width: l.width, partitions: l.partitions, ids: make([]uint64, 0, l.lastRows),
			values: make([]float32, 0, l.lastRows*l.width), parts: make([]uint32, 0, l.lastRows),
			marks: map[string]uint64{}, charges: map[string]int64{}, done: make(chan struct{})}
	}
	w = l.open
	l.producers[b.Producer] = p
	w.apply(b)
	w.marks[b.Producer] = b.Sequence
	w.charges[b.Producer] += size
	p.accepted, p.last, p.inFlight = b.Sequence, w, p.inFlight+size
	return w, false, nil
}

// rowBytes is what a row costs a window besides its values: its id and
// its partition, then in the seal its id and deletion mark again (split)
// and up to four slots of the set that merges its partition (last:
// ids a pusher chose to share one partition put the whole window in one
// set).
const rowBytes = 8 + 4 + 9 + 36

// rowWeight is what a row of width values weighs in a window: rowBytes,
// and its values twice (the window's, and the seal's split of them).
func rowWeight(width int) int64 { return int64(rowBytes + 8*width) }

// partitions are b's rows' partitions, of n: its upserts', then its
// deletions', as a window appends them.
func (b *PushBatch) partitions(n uint32) []uint32 {
	parts := make([]uint32, 0, len(b.IDs)+len(b.Deletes))
	for _, id := range b.IDs {
		parts = append(parts, partition.Of(id, n))
	}
	for _, id := range b.Deletes {
		parts = append(parts, partition.Of(id, n))
	}
	return parts
}

// apply appends b's rows to w, with their partitions (b.parts, found
// before the server's lock is taken, or found here).
func (w *pushWindow) apply(b *PushBatch) {
	parts := b.parts
	if len(parts) != len(b.IDs)+len(b.Deletes) || b.partsOf != w.partitions {
		parts = b.partitions(w.partitions)
	}
	w.parts = append(w.parts, parts...)
	w.ids = append(w.ids, b.IDs...)
	w.values = append(w.values, b.Values...)
	for _, id := range b.Deletes {
		i := len(w.ids)
		w.ids = append(w.ids, id)
		for len(w.deleted) <= i/64 {
			w.deleted = append(w.deleted, 0)
		}
		w.deleted[i/64] |= 1 << (i % 64)
		w.values = append(w.values, make([]float32, w.width)...)
	}
	w.bytes += int64(len(b.IDs)+len(b.Deletes)) * rowWeight(w.width)
}

func (w *pushWindow) isDeleted(i int) bool {
	return i/64 < len(w.deleted) && w.deleted[i/64]&(1<<(i%64)) != 0
}

// due says whether the open window is to be sealed now.
func (l *pushLog) due(now time.Time) bool {
	return l.open != nil && (now.Sub(l.open.opened) >= l.lim.Window || l.open.bytes >= l.lim.WindowBytes)
}

// wait is how long until the open window is due (0: none open).
func (l *pushLog) wait(now time.Time) time.Duration {
	if l.open == nil {
		return 0
	}
	return max(l.open.opened.Add(l.lim.Window).Sub(now), 0)
}

// take closes the open window to batches and returns it for sealing
// (nil if none is open).
func (l *pushLog) take() *pushWindow {
	w := l.open
	l.open = nil
	if w != nil {
		l.lastRows = len(w.ids)
	}
	return w
}

// splitRows are a window's rows grouped by partition, each partition's
// in the order they came: touched are the partitions with rows,
// ascending, and partition touched[i]'s rows are bounds[i] to
// bounds[i+1].
type splitRows struct {
	touched []uint32
	bounds  []int
	width   int
	ids     []uint64
	values  []float32
	deleted []bool
	// mul hashes ids into last's set: odd, and random, so that no pusher
	// can choose ids that crowd it (multiply-shift hashing).
	mul uint64
}

// split groups w's rows by partition: a counting sort, its second pass
// moving the rows themselves, so that each partition's are read in one
// run as they are merged (not one cache line a row). The partitions were
// found as the batches came: the seal pays two passes over the rows, not
// a sort of their ids.
func (w *pushWindow) split() *splitRows {
	n := len(w.ids)
	s := &splitRows{width: w.width, ids: make([]uint64, n), values: make([]float32, len(w.values)), deleted: make([]bool, n), mul: rand.Uint64() | 1}
	next := make([]int, w.partitions+1) // first the count of each partition, then where its next row goes
	for _, p := range w.parts {
		next[p+1]++
	}
	for p := range w.partitions {
		if next[p+1] > 0 {
			s.touched = append(s.touched, p)
			s.bounds = append(s.bounds, next[p])
		}
		next[p+1] += next[p]
	}
	s.bounds = append(s.bounds, n)
	for i, p := range w.parts {
		j := next[p]
		next[p]++
		s.ids[j], s.deleted[j] = w.ids[i], w.isDeleted(i)
		if w.width == 1 {
			s.values[j] = w.values[i] // LR: no copy call per row
		} else {
			copy(s.values[j*w.width:(j+1)*w.width], w.values[i*w.width:(i+1)*w.width])
		}
	}
	return s
}

// last is what partition touched[t]'s rows hold, the last row of each
// id winning: the upserted ids with their values, and the deleted ids.
// Safe for concurrent use.
//
// The ids seen are an open-addressed set sized for the rows, not a map:
// at a million rows a second, map inserts were the seal's largest cost.
func (s *splitRows) last(t int) (ids []uint64, values []float32, deletes []uint64) {
	lo, hi := s.bounds[t], s.bounds[t+1]
	shift := 64 - bits.Len(uint(2*(hi-lo)))
	seen, used := make([]uint64, 1<<(64-shift)), make([]bool, 1<<(64-shift))
	ids = make([]uint64, 0, hi-lo)
	values = make([]float32, 0, (hi-lo)*s.width)
rows:
	for i := hi - 1; i >= lo; i-- {
		id := s.ids[i]
		h := id * s.mul >> shift
		for ; used[h]; h = (h + 1) & uint64(len(seen)-1) {
			if seen[h] == id {
				continue rows // a later row has it
			}
		}
		seen[h], used[h] = id, true
		switch {
		case s.deleted[i]:
			deletes = append(deletes, id)
		case s.width == 1:
			ids, values = append(ids, id), append(values, s.values[i])
		default:
			ids, values = append(ids, id), append(values, s.values[i*s.width:(i+1)*s.width]...)
		}
	}
	return ids, values, deletes
}

// delta is w's rows as a delta's, split by partition: each partition's
// rows are merged (last) as the loader writes it, on all cores.
func (w *pushWindow) delta() *loader.Split {
	s := w.split()
	return &loader.Split{Touched: s.touched, Rows: func(p uint32) ([]uint64, []float32, []uint64) {
		t, _ := slices.BinarySearch(s.touched, p) // the loader asks only for partitions in touched
		return s.last(t)
	}}
}

// heldBytes is what a held model's pushes weigh: the pending delta's
// rows and the open window's.
func (l *pushLog) heldBytes() int64 {
	var n int64
	if l.held != nil && l.held.rows != nil {
		n += l.held.rows.bytes
	}
	if l.open != nil {
		n += l.open.bytes
	}
	return n
}

// merged is a window holding a's rows, then b's (so b's win), with both
// windows' marks; a is not changed. Its done and charges are b's.
func merged(a, b *pushWindow) *pushWindow {
	m := &pushWindow{opened: b.opened, width: b.width, marks: maps.Clone(a.marks), charges: b.charges, done: b.done,
		ids: slices.Concat(a.ids, b.ids), values: slices.Concat(a.values, b.values), parts: slices.Concat(a.parts, b.parts),
		partitions: b.partitions, bytes: a.bytes + b.bytes}
	for p, s := range b.marks {
		m.marks[p] = max(m.marks[p], s)
	}
	m.deleted = slices.Clone(a.deleted)
	for i := range b.ids {
		if b.isDeleted(i) {
			j := len(a.ids) + i
			for len(m.deleted) <= j/64 {
				m.deleted = append(m.deleted, 0)
			}
			m.deleted[j/64] |= 1 << (j % 64)
		}
	}
	return m
}

// compacted is w's contents as a window of their own (one row per id),
// with w's marks: what a held window keeps between seals.
func (w *pushWindow) compacted() *pushWindow {
	s := w.split()
	c := &pushWindow{width: w.width, partitions: w.partitions, marks: w.marks}
	for t, p := range s.touched {
		ids, values, deletes := s.last(t)
		c.apply(&PushBatch{IDs: ids, Values: values, Deletes: deletes, parts: slices.Repeat([]uint32{p}, len(ids)+len(deletes)), partsOf: w.partitions})
	}
	return c
}

// pushMarks are w's marks as a manifest records them.
func (w *pushWindow) pushMarks(at time.Time) map[string]codec.PushMark {
	out := make(map[string]codec.PushMark, len(w.marks))
	for p, s := range w.marks {
		out[p] = codec.PushMark{Seq: s, At: at.UTC()}
	}
	return out
}

// sealed answers w, taken from l: published as version, or failed with
// err, which fails the open window too (its batches follow w's), every
// producer starting again from its sealed mark.
func (l *pushLog) sealed(w *pushWindow, version uint64, err error) {
	l.release(w)
	if err == nil {
		for name, s := range w.marks {
			if p := l.producers[name]; p != nil {
				p.sealed = max(p.sealed, s)
			}
		}
		w.finish(version, nil)
		return
	}
	w.finish(0, err)
	if o := l.take(); o != nil {
		l.release(o)
		o.finish(0, fmt.Errorf("an earlier window of the model could not be published (%w): send again from your first unanswered batch", err))
	}
	for _, p := range l.producers {
		p.accepted = p.sealed
	}
}

// release returns w's charges to its producers.
func (l *pushLog) release(w *pushWindow) {
	for name, c := range w.charges {
		if p := l.producers[name]; p != nil {
			p.inFlight -= c
			if p.last == w {
				p.last = nil
			}
		}
	}
}

func (w *pushWindow) finish(version uint64, err error) {
	w.version, w.err = version, err
	w.ids, w.values, w.deleted = nil, nil, nil
	close(w.done)
}

// fail answers every window not yet answered with err (leadership lost:
// the log is then dropped).
func (l *pushLog) fail(err error) {
	if o := l.take(); o != nil {
		l.release(o)
		o.finish(0, err)
	}
}

// forget drops the producers idle for ProducerTTL with nothing in
// flight, and if the log is still full, the one idle the longest: a log
// full of producers that came once (a CLI run each) must not lock new
// ones out for a day. A producer dropped here still has its sealed mark
// in the model's state (bounded alike, by trimMarks), which it resumes
// from.
func (l *pushLog) forget(now time.Time) {
	var oldest string
	for name, p := range l.producers {
		switch {
		case p.inFlight != 0:
		case now.Sub(p.seen) >= l.lim.ProducerTTL:
			delete(l.producers, name)
		case oldest == "" || p.seen.Before(l.producers[oldest].seen):
			oldest = name
		}
	}
	if len(l.producers) >= l.lim.MaxProducers && oldest != "" {
		delete(l.producers, oldest)
	}
}

// trimMarks bounds a model's sealed marks: none idle for ttl before the
// newest, at most max (the newest kept).
func trimMarks(marks map[string]codec.PushMark, ttl time.Duration, most int) {
	var newest time.Time
	for _, mk := range marks {
		if mk.At.After(newest) {
			newest = mk.At
		}
	}
	for p, mk := range marks {
		if ttl > 0 && newest.Sub(mk.At) >= ttl {
			delete(marks, p)
		}
	}
	if len(marks) <= most {
		return
	}
	names := slices.SortedFunc(maps.Keys(marks), func(a, b string) int {
		return cmp.Or(marks[a].At.Compare(marks[b].At), cmp.Compare(a, b))
	})
	for _, p := range names[:len(names)-most] {
		delete(marks, p)
	}
}
