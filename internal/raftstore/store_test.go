package raftstore

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
)

// open opens a store in dir, closed when the test ends unless closed
// before.
func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// reopen closes s and opens its directory again.
func reopen(t *testing.T, s *Store, dir string) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return open(t, dir)
}

// entry is a log entry whose fields all derive from its index.
func entry(i uint64) *raft.Log {
	l := &raft.Log{Index: i, Term: i/10 + 1, Type: raft.LogType(i % 6), Data: bytes.Repeat([]byte{byte(i)}, int(i%300))}
	if i%3 == 0 {
		l.Extensions = []byte{byte(i >> 8), byte(i)}
	}
	if i%2 == 0 {
		l.AppendedAt = time.Unix(1_700_000_000+int64(i), int64(i)%1e9)
	}
	return l
}

func entries(lo, hi uint64) []*raft.Log {
	var ls []*raft.Log
	for i := lo; i <= hi; i++ {
		ls = append(ls, entry(i))
	}
	return ls
}

// edges is the store's first and last index.
func edges(t *testing.T, s *Store) (first, last uint64) {
	t.Helper()
	first, err := s.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err = s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	return first, last
}

func checkEdges(t *testing.T, s *Store, first, last uint64) {
	t.Helper()
	if f, l := edges(t, s); f != first || l != last {
		t.Fatalf("first, last index %d, %d; want %d, %d", f, l, first, last)
	}
}

// checkLog checks that entry i is stored, with the fields entry(i) gave
// it.
func checkLog(t *testing.T, s *Store, i uint64) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(i, &got); err != nil {
		t.Fatalf("entry %d: %v", i, err)
	}
	if want := entry(i); !sameLog(&got, want) {
		t.Fatalf("entry %d: got %+v, want %+v", i, got, *want)
	}
}

// sameLog compares two entries, times by instant, nil and empty bytes
// alike.
func sameLog(a, b *raft.Log) bool {
	return a.Index == b.Index && a.Term == b.Term && a.Type == b.Type && bytes.Equal(a.Data, b.Data) &&
		bytes.Equal(a.Extensions, b.Extensions) && a.AppendedAt.Equal(b.AppendedAt)
}

func checkMissing(t *testing.T, s *Store, i uint64) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(i, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("entry %d: got error %v, want raft.ErrLogNotFound", i, err)
	}
}

// TestFresh: an empty store has no entries and no stable keys, and says
// so the way raft recognises ("not found"), so a new node can start.
func TestFresh(t *testing.T) {
	s := open(t, t.TempDir())
	checkEdges(t, s, 0, 0)
	checkMissing(t, s, 1)
	if _, err := s.Get([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("Get of a key never set: %v, want \"not found\"", err)
	}
	if _, err := s.GetUint64([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("GetUint64 of a key never set: %v, want \"not found\"", err)
	}
}

// TestLogs: entries stored one at a time and in batches read back with
// every field, also after the store is reopened.
func TestLogs(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.StoreLog(entry(1)); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs(entries(2, 500)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		checkEdges(t, s, 1, 500)
		for i := uint64(1); i <= 500; i++ {
			checkLog(t, s, i)
		}
		checkMissing(t, s, 0)
		checkMissing(t, s, 501)
		s = reopen(t, s, dir)
	}
	// A stored entry is replaced whole (raft rewrites a conflicting
	// suffix after truncating it, and may store an index again).
	l := &raft.Log{Index: 7, Term: 99, Type: raft.LogCommand, Data: []byte("again")}
	if err := s.StoreLog(l); err != nil {
		t.Fatal(err)
	}
	var got raft.Log
	if err := s.GetLog(7, &got); err != nil || !sameLog(&got, l) {
		t.Fatalf("entry 7 after storing it again: %+v, %v", got, err)
	}
	// An empty batch stores nothing and fails nothing.
	if err := s.StoreLogs(nil); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 1, 500)
}

// TestGetLogCopies: what GetLog returns stays valid after later writes,
// reads and a reopen.
func TestGetLogCopies(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.StoreLogs(entries(1, 20)); err != nil {
		t.Fatal(err)
	}
	var a raft.Log
	if err := s.GetLog(12, &a); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs(entries(21, 2000)); err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 2000; i += 7 {
		var b raft.Log
		if err := s.GetLog(i, &b); err != nil {
			t.Fatal(err)
		}
	}
	if !sameLog(&a, entry(12)) {
		t.Fatalf("entry 12 changed after later reads: %+v", a)
	}
}

// TestDeleteRange: ranges are inclusive at both ends, an inverted range
// deletes nothing, and max = MaxUint64 deletes to the end.
func TestDeleteRange(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.StoreLogs(entries(1, 100)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRange(1, 10); err != nil { // compaction behind a snapshot
		t.Fatal(err)
	}
	checkEdges(t, s, 11, 100)
	checkMissing(t, s, 10)
	checkLog(t, s, 11)
	if err := s.DeleteRange(91, 100); err != nil { // a conflicting suffix
		t.Fatal(err)
	}
	checkEdges(t, s, 11, 90)
	checkMissing(t, s, 91)
	if err := s.DeleteRange(50, 40); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 11, 90)
	if err := s.DeleteRange(50, 50); err != nil {
		t.Fatal(err)
	}
	checkMissing(t, s, 50)
	checkLog(t, s, 49)
	checkLog(t, s, 51)
	s = reopen(t, s, dir)
	checkEdges(t, s, 11, 90)
	checkMissing(t, s, 50)
	if err := s.DeleteRange(80, math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 11, 79)
	if err := s.DeleteRange(0, math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 0, 0)
	// The stable values are not in the log's range.
	if err := s.SetUint64([]byte("k"), 5); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRange(0, math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("k")); err != nil || v != 5 {
		t.Fatalf("a stable value after deleting the whole log: %d, %v", v, err)
	}
}

// TestGaps: the store takes entries after a gap, as raft writes them
// after a snapshot is restored, so it is not a MonotonicLogStore, and
// raft's log cache over it says so too (raft then relies on the gap
// rather than deleting the whole log; the analogue of raft's
// TestRaft_LogStoreIsMonotonic for this store).
func TestGaps(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.StoreLogs(entries(1, 10)); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs(entries(50, 55)); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 1, 55)
	checkMissing(t, s, 11)
	checkMissing(t, s, 49)
	checkLog(t, s, 50)
	if err := s.DeleteRange(1, 49); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 50, 55)

	var ls raft.LogStore = s
	if _, ok := ls.(raft.MonotonicLogStore); ok {
		t.Fatal("the store claims to be a MonotonicLogStore; it takes gaps")
	}
	cache, err := raft.NewLogCache(16, s)
	if err != nil {
		t.Fatal(err)
	}
	if cache.IsMonotonic() {
		t.Fatal("raft's log cache over the store says it is monotonic")
	}
}

// TestStable: values set read back, replaced, and survive a reopen; a
// value not 8 bytes is not a number.
func TestStable(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Set([]byte("LastVoteCand"), []byte("node-2")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	if err := s.Set([]byte("empty"), nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-2" {
			t.Fatalf("Get: %q, %v", v, err)
		}
		if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != math.MaxUint64 {
			t.Fatalf("GetUint64: %d, %v", v, err)
		}
		if v, err := s.Get([]byte("empty")); err != nil || len(v) != 0 {
			t.Fatalf("Get of an empty value: %q, %v", v, err)
		}
		if _, err := s.GetUint64([]byte("LastVoteCand")); err == nil || err.Error() == "not found" {
			t.Fatalf("GetUint64 of a 6-byte value: %v, want an error that is not \"not found\"", err)
		}
		s = reopen(t, s, dir)
	}
	// Log and stable keys do not meet: a stable key that looks like a log
	// key is not an entry.
	if err := s.Set(logKey(3)[1:], []byte("x")); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 0, 0)
}

// TestDamagedEntry: an entry whose bytes are damaged is an error naming
// its index, and the entries beside it still read.
func TestDamagedEntry(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.StoreLogs(entries(1, 3)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{nil, {9}, {entryVersion}, {entryVersion, 1, 0, 0, 200, 1}, append(appendLog(nil, entry(2)), 0)} {
		if err := s.db.Set(logKey(2), bad, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		var l raft.Log
		err := s.GetLog(2, &l)
		if err == nil || errors.Is(err, raft.ErrLogNotFound) || !bytes.Contains([]byte(err.Error()), []byte("log entry 2")) {
			t.Fatalf("entry 2 stored as %x: %v", bad, err)
		}
	}
	checkLog(t, s, 1)
	checkLog(t, s, 3)
}

// FuzzDecodeLog: any bytes decode to an entry or an error, never a
// panic, and an entry decoded encodes back to the same bytes.
func FuzzDecodeLog(f *testing.F) {
	for _, i := range []uint64{1, 2, 3, 6, 299} {
		f.Add(appendLog(nil, entry(i)))
	}
	f.Add([]byte{entryVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if err := decodeLog(b, &l); err != nil {
			return
		}
		if again := appendLog(nil, &l); !bytes.Equal(again, b) {
			// Varints have one shortest form; a longer one decodes but
			// is not what appendLog writes. Decoding it again must give
			// the same entry.
			var l2 raft.Log
			if err := decodeLog(again, &l2); err != nil || !reflect.DeepEqual(l, l2) {
				t.Fatalf("%x decoded to %+v, which encodes to %x, which decodes to %+v (%v)", b, l, again, l2, err)
			}
		}
	})
}

// BenchmarkStoreLog: one synced entry of 200 bytes a call, as raft
// stores an admin change on an idle group.
func BenchmarkStoreLog(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	l := &raft.Log{Term: 1, Data: make([]byte, 200), AppendedAt: time.Now()}
	for i := 0; b.Loop(); i++ {
		l.Index = uint64(i + 1)
		if err := s.StoreLog(l); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreLogs64: batches of 64 synced entries of 200 bytes, as
// raft stores them under load; reported per entry.
func BenchmarkStoreLogs64(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	batch := make([]*raft.Log, 64)
	next := uint64(1)
	for b.Loop() {
		for i := range batch {
			batch[i] = &raft.Log{Index: next, Term: 1, Data: make([]byte, 200)}
			next++
		}
		if err := s.StoreLogs(batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(next-1), "ns/entry")
}

// BenchmarkGetLog: reading one stored entry back.
func BenchmarkGetLog(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.StoreLogs(entries(1, 10_000)); err != nil {
		b.Fatal(err)
	}
	var l raft.Log
	for i := 0; b.Loop(); i++ {
		if err := s.GetLog(uint64(i%10_000+1), &l); err != nil {
			b.Fatal(err)
		}
	}
}

// TestClosed: calls after Close fail with ErrClosed rather than panic
// (raft may call after its Shutdown).
func TestClosed(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.StoreLogs(entries(1, 3)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	if _, err := s.FirstIndex(); !errors.Is(err, ErrClosed) {
		t.Fatalf("FirstIndex after Close: %v", err)
	}
	if err := s.GetLog(1, &l); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetLog after Close: %v", err)
	}
	if err := s.StoreLog(entry(4)); !errors.Is(err, ErrClosed) {
		t.Fatalf("StoreLog after Close: %v", err)
	}
	if _, err := s.GetUint64([]byte("k")); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetUint64 after Close: %v", err)
	}
}

// TestAppendedAt: times round-trip to the nanosecond, the zero time and
// the Unix epoch included, and times past UnixNano's range.
func TestAppendedAt(t *testing.T) {
	for _, at := range []time.Time{{}, time.Unix(0, 0), time.Unix(0, 1), time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC),
		time.Date(2300, 1, 1, 0, 0, 0, 999_999_999, time.UTC), time.Date(1600, 6, 1, 0, 0, 0, 5, time.UTC)} {
		var got raft.Log
		if err := decodeLog(appendLog(nil, &raft.Log{Term: 1, AppendedAt: at}), &got); err != nil {
			t.Fatalf("%v: %v", at, err)
		}
		if !got.AppendedAt.Equal(at) || got.AppendedAt.IsZero() != at.IsZero() {
			t.Errorf("%v came back as %v", at, got.AppendedAt)
		}
	}
}
