package loader

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
)

// Lookup returns the records of ids in the version whose chain (newest
// first) is given, decoded (Width values each): each id's newest record,
// none for an id the chain lacks or deletes. It reads and verifies each
// partition file the ids fall in, in each version of the chain, until
// every id of the partition is found: a tool's lookup of a few thousand
// ids (golden requests), not a server's.
func (r Repo) Lookup(chain []*codec.Manifest, ids []uint64) (map[uint64][]float32, error) {
	top := chain[0]
	if top.Hash != partition.HashName {
		return nil, fmt.Errorf("loader: %s version %d: unknown partition hash %q", top.Name, top.Version, top.Hash)
	}
	byPart := map[uint32][]uint64{}
	seen := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			p := partition.Of(id, top.Partitions)
			byPart[p] = append(byPart[p], id)
		}
	}
	out := map[uint64][]float32{}
	for _, p := range slices.Sorted(maps.Keys(byPart)) {
		want := byPart[p]
		for _, m := range codec.Layers(chain, p) { // the versions with a file for p
			if len(want) == 0 {
				break
			}
			pt, err := r.ReadPartition(m, p)
			if err != nil {
				return nil, err
			}
			want = slices.DeleteFunc(want, func(id uint64) bool {
				h := codec.KeyHash(id)
				i := sort.Search(pt.Count, func(i int) bool { return pt.Hash(i) >= h })
				if i == pt.Count || pt.Hash(i) != h {
					return false
				}
				v := make([]float32, pt.Width)
				pt.Values(i, v)
				if !codec.IsTombstone(v[0]) {
					out[id] = v
				}
				return true
			})
			freePartition(pt)
		}
	}
	return out, nil
}
