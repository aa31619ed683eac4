package testenv

import (
	"encoding/json"
	"io"
	"slices"
	"sync"

	"github.com/hashicorp/raft"
)

// ListFSM is a raft state machine for tests of the log and the group:
// each entry appended to a list, the list its snapshot.
type ListFSM struct {
	mu   sync.Mutex
	list []string
}

// Apply appends the entry and answers the list's length.
func (f *ListFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, string(l.Data))
	return len(f.list)
}

func (f *ListFSM) Snapshot() (raft.FSMSnapshot, error) { return listSnapshot(f.Get()), nil }

func (f *ListFSM) Restore(r io.ReadCloser) error {
	defer r.Close()
	var list []string
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = list
	return nil
}

// Get is the list now.
func (f *ListFSM) Get() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.list)
}

type listSnapshot []string

func (s listSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode([]string(s)); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (listSnapshot) Release() {}
