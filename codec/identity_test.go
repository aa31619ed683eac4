package codec

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestIdentityCache: over random chains — deltas touching random
// partitions, branches from older versions, and chains rebuilt from
// copies of their manifests — the cache's identities equal Identities'.
func TestIdentityCache(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const parts = 16
	sum := func() string { return fmt.Sprintf("%064x", rng.Uint64()) }
	full := &Manifest{Version: 1, Kind: KindFull, Partitions: parts}
	for p := range uint32(parts) {
		full.Files = append(full.Files, File{Partition: p, SHA256: sum()})
	}
	chains := [][]*Manifest{{full}}
	var c IdentityCache
	for v := uint64(2); v < 300; v++ {
		parent := chains[len(chains)-1]
		switch rng.IntN(10) {
		case 0: // a branch from an older chain
			parent = chains[rng.IntN(len(chains))]
		case 1: // the same chain, parsed again: other manifests, the same content
			parent = make([]*Manifest, len(parent))
			for i, m := range chains[len(chains)-1] {
				cp := *m
				parent[i] = &cp
			}
		}
		d := &Manifest{Version: v, Kind: KindDelta, Parent: parent[0].Version, Partitions: parts}
		for p := range uint32(parts) {
			if rng.IntN(3) == 0 {
				d.Files = append(d.Files, File{Partition: p, SHA256: sum()})
			}
		}
		chain := append([]*Manifest{d}, parent...)
		chains = append(chains, chain)
		if rng.IntN(4) == 0 {
			continue // not identified here: the next is a link further up (as when two validators run)
		}
		if got, want := c.Identities(chain), Identities(chain); !slices.Equal(got, want) {
			t.Fatalf("version %d (chain of %d): identities differ\n got %v\nwant %v", v, len(chain), got, want)
		}
	}
	if got, want := c.Identities(chains[0]), Identities(chains[0]); !slices.Equal(got, want) {
		t.Fatalf("a full version: %v, want %v", got, want)
	}
	if c.Identities(nil) != nil {
		t.Fatal("no chain has identities")
	}
}

// BenchmarkIdentities identifies a delta touching every partition of
// 1,024 on a chain of 200: afresh (Identities), through the cache when it
// misses, and extending the parent's or the grandparent's hashes.
//
//	go test -run '^$' -bench Identities ./codec
func BenchmarkIdentities(b *testing.B) {
	const parts = 1024
	var chain []*Manifest
	for v := uint64(1); v <= 201; v++ {
		m := &Manifest{Version: v, Kind: KindDelta, Parent: v - 1, Partitions: parts}
		if v == 1 {
			m.Kind, m.Parent = KindFull, 0
		}
		for p := range uint32(parts) {
			m.Files = append(m.Files, File{Partition: p, SHA256: fmt.Sprintf("%064x", uint64(p)<<32|v)})
		}
		chain = append([]*Manifest{m}, chain...)
	}
	b.Run("afresh", func(b *testing.B) {
		for b.Loop() {
			Identities(chain)
		}
	})
	b.Run("missed", func(b *testing.B) {
		var c IdentityCache
		for b.Loop() {
			c.kept = nil // nothing kept: hashed afresh, states kept
			c.Identities(chain)
		}
	})
	for _, up := range []int{1, 2} { // the parent's hashes kept, or the grandparent's
		b.Run(fmt.Sprintf("kept-%d-below", up), func(b *testing.B) {
			var c IdentityCache
			c.Identities(chain[up:])
			for b.Loop() {
				c.kept = c.kept[:1] // that chain's hashes only
				c.Identities(chain)
			}
		})
	}
}
