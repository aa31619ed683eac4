package loader

import (
	"os"
	"slices"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/partition"
)

// TestSpillRuns: ids spilled in several runs come back per partition in
// the order added, from the file and the buffer alike, and the file
// goes with the spill.
func TestSpillRuns(t *testing.T) {
	const parts = 7
	dir := t.TempDir()
	sp := newSpill(dir, parts, 100)
	want := make([][]uint64, parts)
	for rank := range uint64(1234) {
		id := splitmix64(rank)
		p := partition.Of(id, parts)
		want[p] = append(want[p], id)
		if err := sp.add(p, id); err != nil {
			t.Fatal(err)
		}
	}
	if sp.f == nil || len(sp.extents[0]) < 2 {
		t.Fatalf("1234 ids with a budget of 100 made no runs: file %v, extents %v", sp.f, sp.extents[0])
	}
	for p := range uint32(parts) {
		got, err := sp.ids(p)
		if err != nil || !slices.Equal(got, want[p]) {
			t.Fatalf("partition %d: %d ids (%v), want %d in order", p, len(got), err, len(want[p]))
		}
	}
	sp.close()
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the spill left %d files", len(left))
	}
}
