// Package raftstore is the managers' raft log and stable store
// (hashicorp/raft's LogStore and StableStore) on pebble.
//
// Every write is synced before it returns: raft acknowledges an entry,
// or a vote, only once its store has returned, so an entry acknowledged
// and then lost to a crash could undo a committed change. Log entries
// live under one key prefix, indexed big-endian so that pebble's order
// is the log's: the first and last index are one seek each, and a
// truncation is one range deletion. Stable values live under another.
//
// Why here and not a public store: the design card picks pebble, and the
// pebble stores one can read each get something wrong that raft relies
// on (one writes without syncing; one scans the whole keyspace for its
// first index). The entries' encoding is our own, small and fuzzed: the
// store's directory is input like any other, and a damaged entry is an
// error naming its index, never a panic.
package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
)

// ErrKeyNotFound is what Get and GetUint64 return for a key never set.
// Its text is "not found" because hashicorp/raft recognises a fresh
// store by that text alone (not by errors.Is); any other error stops a
// node from starting.
var ErrKeyNotFound = errors.New("not found")

// Key prefixes: log entries, then stable values.
const (
	logPrefix    = 0x01
	stablePrefix = 0x02
)

// Store is a raft.LogStore and raft.StableStore. It is safe for
// concurrent use, as pebble is.
type Store struct {
	db *pebble.DB
	// mu keeps Close from pulling pebble from under a call (pebble
	// panics on a closed DB; raft may still call after Shutdown).
	mu     sync.RWMutex
	closed bool
}

// ErrClosed is returned by calls on a closed Store.
var ErrClosed = errors.New("raftstore: closed")

// open takes the store for a call: false if it is closed. The caller
// calls s.mu.RUnlock when done.
func (s *Store) open() bool {
	s.mu.RLock()
	return !s.closed
}

var (
	_ raft.LogStore    = (*Store)(nil)
	_ raft.StableStore = (*Store)(nil)
)

// Open opens the store in dir, creating it if need be.
func Open(dir string) (*Store, error) {
	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLog{}})
	if err != nil {
		return nil, fmt.Errorf("raftstore: opening %s: %w", dir, err)
	}
	return &Store{db: db}, nil
}

// Close closes the store; it must not be used after. Closing it again
// does nothing.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.db.Close()
}

// logKey is the key of log entry i.
func logKey(i uint64) []byte {
	k := make([]byte, 9)
	k[0] = logPrefix
	binary.BigEndian.PutUint64(k[1:], i)
	return k
}

// FirstIndex is the first index in the log, 0 if it is empty.
func (s *Store) FirstIndex() (uint64, error) { return s.edge(true) }

// LastIndex is the last index in the log, 0 if it is empty.
func (s *Store) LastIndex() (uint64, error) { return s.edge(false) }

// edge is the first or last index: one seek.
func (s *Store) edge(first bool) (uint64, error) {
	if !s.open() {
		s.mu.RUnlock()
		return 0, ErrClosed
	}
	defer s.mu.RUnlock()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{logPrefix}, UpperBound: []byte{logPrefix + 1}})
	if err != nil {
		return 0, fmt.Errorf("raftstore: %w", err)
	}
	defer it.Close()
	var ok bool
	if first {
		ok = it.First()
	} else {
		ok = it.Last()
	}
	if !ok {
		if err := it.Error(); err != nil {
			return 0, fmt.Errorf("raftstore: %w", err)
		}
		return 0, nil
	}
	k := it.Key()
	if len(k) != 9 {
		return 0, fmt.Errorf("raftstore: a log key of %d bytes, want 9: the store is damaged", len(k))
	}
	return binary.BigEndian.Uint64(k[1:]), nil
}

// GetLog reads entry index into log; raft.ErrLogNotFound if there is
// none.
func (s *Store) GetLog(index uint64, log *raft.Log) error {
	if !s.open() {
		s.mu.RUnlock()
		return ErrClosed
	}
	defer s.mu.RUnlock()
	v, closer, err := s.db.Get(logKey(index))
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("raftstore: reading log entry %d: %w", index, err)
	}
	defer closer.Close()
	if err := decodeLog(v, log); err != nil {
		return fmt.Errorf("raftstore: log entry %d: %w", index, err)
	}
	log.Index = index
	return nil
}

// StoreLog stores one entry.
func (s *Store) StoreLog(log *raft.Log) error { return s.StoreLogs([]*raft.Log{log}) }

// StoreLogs stores entries in one synced batch: all or none.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if !s.open() {
		s.mu.RUnlock()
		return ErrClosed
	}
	defer s.mu.RUnlock()
	b := s.db.NewBatch()
	defer b.Close()
	var buf []byte
	for _, l := range logs {
		buf = appendLog(buf[:0], l)
		if err := b.Set(logKey(l.Index), buf, nil); err != nil {
			return fmt.Errorf("raftstore: %w", err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: storing %d log entries: %w", len(logs), err)
	}
	return nil
}

// DeleteRange deletes entries min to max, both included, synced.
func (s *Store) DeleteRange(min, max uint64) error {
	if !s.open() {
		s.mu.RUnlock()
		return ErrClosed
	}
	defer s.mu.RUnlock()
	if min > max {
		return nil
	}
	end := []byte{logPrefix + 1}
	if max < math.MaxUint64 {
		end = logKey(max + 1)
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.DeleteRange(logKey(min), end, nil); err != nil {
		return fmt.Errorf("raftstore: %w", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: deleting log entries %d to %d: %w", min, max, err)
	}
	return nil
}

// stableKey is the key of stable value k.
func stableKey(k []byte) []byte { return append([]byte{stablePrefix}, k...) }

// Set stores val under key, synced.
func (s *Store) Set(key, val []byte) error {
	if !s.open() {
		s.mu.RUnlock()
		return ErrClosed
	}
	defer s.mu.RUnlock()
	if err := s.db.Set(stableKey(key), val, pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: setting %q: %w", key, err)
	}
	return nil
}

// Get is the value under key; ErrKeyNotFound if none was set.
func (s *Store) Get(key []byte) ([]byte, error) {
	if !s.open() {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	defer s.mu.RUnlock()
	v, closer, err := s.db.Get(stableKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("raftstore: reading %q: %w", key, err)
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

// SetUint64 stores val under key, synced.
func (s *Store) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 is the number under key; ErrKeyNotFound if none was set.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("raftstore: %q holds %d bytes, not a number (8): the store is damaged", key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// pebbleLog sends pebble's messages to slog.
type pebbleLog struct{}

func (pebbleLog) Infof(format string, args ...any) {
	slog.Debug("raftstore: " + fmt.Sprintf(format, args...))
}

func (pebbleLog) Errorf(format string, args ...any) {
	slog.Error("raftstore: " + fmt.Sprintf(format, args...))
}

// Fatalf is pebble finding its files unusable: it cannot go on.
func (pebbleLog) Fatalf(format string, args ...any) {
	msg := "raftstore: " + fmt.Sprintf(format, args...)
	slog.Error(msg)
	panic(msg)
}
