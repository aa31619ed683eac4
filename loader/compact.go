package loader

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/cumulus-serving/cumulus/codec"
)

// Compact writes version v's chain — a full version and the deltas on
// it — as a new full version (a new number), and returns its manifest.
// v 0 means the newest version that passes the local checks
// (DeltaParent). Each partition's records are merged newest first and
// copied as encoded (never decoded and quantized again), deleted
// features dropped, so the new version scores exactly as v does; its
// files are verified as they are read. The new version is the same as v
// (SameAs): deltas published on v's line while it ran are copied onto it
// (their files linked), and deltas published later on them land on the
// copies, so the chain stays short even while deltas keep coming. It
// fails with ErrSuperseded, and publishes nothing, if a version off v's
// line was published meanwhile (the compaction, newer, would hide it).
func (r Repo) Compact(name string, v uint64) (*codec.Manifest, error) {
	if v == 0 {
		var err error
		if v, _, err = r.DeltaParent(name); err != nil {
			return nil, err
		}
	}
	chain, err := r.Chain(name, v)
	if err != nil {
		return nil, err
	}
	top, base := chain[0], chain[len(chain)-1]
	if len(chain) == 1 {
		return nil, fmt.Errorf("loader: %s version %d is a full version: nothing to compact", name, v)
	}
	if r2 := r.replacement(name, v); r2 != v {
		return nil, fmt.Errorf("%w: version %d is already replaced by version %d", ErrSuperseded, v, r2)
	}
	w, err := r.NewVersion(Spec{Name: name, Shape: top.Shape, Bias: top.Bias, Partitions: top.Partitions, Encoding: top.Encoding,
		Source: fmt.Sprintf("cumulus model compact: version %d (%d deltas on version %d)", v, len(chain)-1, base.Version), SameAs: v})
	if err != nil {
		return nil, err
	}
	parts := make([]uint32, top.Partitions)
	for p := range parts {
		parts[p] = uint32(p)
	}
	// The compaction is a full version: it holds the extra files the
	// chain uses (golden requests: only v's own, as they score v).
	if err := r.writeMerged(w, chain, chain, parts, false); err != nil {
		w.Abort()
		return nil, err
	}
	return w.Commit()
}

// mergeChain is partition p of chain (newest first) as one set of
// encoded records: the newest record of each key; for a key whose newest
// record deletes it, that record with tombstones, else none.
func (r Repo) mergeChain(chain []*codec.Manifest, p uint32, tombstones bool) ([]byte, error) {
	newest := map[uint64][]byte{}
	layers := codec.Layers(chain, p)
	for i := len(layers) - 1; i >= 0; i-- {
		pt, err := r.ReadPartition(layers[i], p)
		if err != nil {
			return nil, err
		}
		pt.EachHash(func(j int, h uint64) {
			if !tombstones && codec.IsTombstone(math.Float32frombits(binary.LittleEndian.Uint32(pt.ValueBytes(j)))) {
				delete(newest, h)
				return
			}
			newest[h] = append(binary.LittleEndian.AppendUint64(nil, h), pt.ValueBytes(j)...)
		})
		freePartition(pt)
	}
	var out []byte
	for _, h := range slices.Sorted(maps.Keys(newest)) {
		out = append(out, newest[h]...)
	}
	return out, nil
}

// CompactDeltas writes the deltas of version v's chain as one delta on
// the chain's full version (a new number, the same as v: SameAs, with
// deltas published on v's line meanwhile copied onto it, as Compact
// does), and returns its manifest. It reads and writes the partitions
// the deltas touch, each the newest record of every key the deltas hold,
// deletions kept (the full version may hold the key): it costs what the
// deltas hold, not the model. This is what a stream of pushes compacts
// with (manager.Options.CompactAfter): a delta a second would otherwise
// rewrite the whole model every few minutes.
func (r Repo) CompactDeltas(name string, v uint64) (*codec.Manifest, error) {
	chain, err := r.Chain(name, v)
	if err != nil {
		return nil, err
	}
	top, base := chain[0], chain[len(chain)-1]
	if len(chain) < 3 {
		return nil, fmt.Errorf("loader: %s version %d has %d delta(s) on version %d: nothing to merge", name, v, len(chain)-1, base.Version)
	}
	if r2 := r.replacement(name, v); r2 != v {
		return nil, fmt.Errorf("%w: version %d is already replaced by version %d", ErrSuperseded, v, r2)
	}
	deltas := chain[:len(chain)-1]
	touched := map[uint32]bool{}
	for _, m := range deltas {
		for _, p := range m.Touched() {
			touched[p] = true
		}
	}
	w, err := r.NewVersion(Spec{Name: name, Shape: top.Shape, Bias: top.Bias, Partitions: top.Partitions, Encoding: top.Encoding, Parent: base.Version,
		Source: fmt.Sprintf("cumulus model compact --deltas: version %d (%d deltas on version %d)", v, len(deltas), base.Version), SameAs: v})
	if err != nil {
		return nil, err
	}
	// It holds the deltas' extra files the chain still needs: a dense
	// part one of them replaced, and v's own golden requests.
	if err := r.writeMerged(w, chain, deltas, slices.Collect(maps.Keys(touched)), true); err != nil {
		w.Abort()
		return nil, err
	}
	return w.Commit()
}

// writeMerged writes into w each of parts merged from the layers
// (mergeChain; tombstones kept or not), in parallel, and the extra files
// of layers that chain takes from them (golden requests: chain[0]'s
// only, as they score it).
func (r Repo) writeMerged(w *VersionWriter, chain, layers []*codec.Manifest, parts []uint32, tombstones bool) error {
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for _, p := range parts {
		g.Go(func() error {
			records, err := r.mergeChain(layers, p, tombstones)
			if err != nil {
				return err
			}
			return w.WriteRecords(p, records)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, m := range layers {
		for _, e := range m.Extras {
			if e.Role == codec.RoleGolden && m != chain[0] {
				continue
			}
			if from, _, _ := codec.ChainExtra(chain, e.Role); from == m {
				if err := w.copyExtra(m, e); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// replacement is the version that serves what v serves and later deltas
// on v stack on: the newest version SameAs leads to from v (v itself
// when none). The caller holds the model's lock.
func (r Repo) replacement(name string, v uint64) uint64 {
	versions, err := r.Versions(name)
	if err != nil {
		return v
	}
	for _, w := range versions {
		if w <= v {
			continue
		}
		if m, err := r.Manifest(name, w); err == nil && m.SameAs == v {
			v = w // and look on for a replacement of w, which is newer still
		}
	}
	return v
}

// laterOnLine lists, ascending, the versions published after v that are
// deltas on v's line (their chain passes through v); it fails with
// ErrSuperseded if one after v is not (a full version, another line),
// unless its manifest is unreadable (the manager rejects it: nothing to
// hide). The caller holds the model's lock.
func (r Repo) laterOnLine(name string, v uint64) ([]*codec.Manifest, error) {
	versions, err := r.Versions(name)
	if err != nil {
		return nil, err
	}
	on := map[uint64]bool{v: true}
	var out []*codec.Manifest
	for _, w := range versions {
		if w <= v {
			continue
		}
		m, err := r.Manifest(name, w)
		if err != nil {
			continue
		}
		if m.Kind != codec.KindDelta || !on[m.Parent] {
			return nil, fmt.Errorf("%w: version %d (%s) is not a delta on version %d's chain", ErrSuperseded, w, m.Kind, v)
		}
		on[w] = true
		out = append(out, m)
	}
	return out, nil
}

// stagedCopy is a copy of a delta written but not yet published: its
// manifest's Parent is still the original's (replaced at publication).
type stagedCopy struct {
	w *VersionWriter
	m *codec.Manifest
}

// stageCopy writes a copy of delta x (its files linked, not rewritten,
// each checked against the manifest's size) into a hidden directory, to
// be published as a version the same as x. The caller holds the model's
// lock.
func (r Repo) stageCopy(x *codec.Manifest) (*stagedCopy, error) {
	tmp, err := os.MkdirTemp(filepath.Join(r.Dir, x.Name), ".writing-")
	if err != nil {
		return nil, err
	}
	w := &VersionWriter{repo: r, spec: Spec{Name: x.Name}, tmp: tmp}
	paths := map[string]int64{}
	for _, f := range x.Files {
		paths[f.Path] = x.PackSize(f.Path) // a packed delta's file once, whole
	}
	for _, e := range x.Extras {
		paths[e.Path] = e.Size
	}
	for p, size := range paths {
		if err := linkOrCopy(filepath.Join(r.VersionDir(x.Name, x.Version), p), filepath.Join(tmp, p), size); err != nil {
			w.Abort()
			return nil, err
		}
	}
	m := *x
	m.SameAs = x.Version
	m.Source = fmt.Sprintf("copy of version %d onto a compaction; %s", x.Version, x.Source)
	return &stagedCopy{w: w, m: &m}, nil
}

// copyFile copies src to a new file dst, synced.
func copyFile(src, dst string) error {
	in, _, err := OpenRegular(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return writeSynced(dst, func(f io.Writer) error {
		_, err := io.Copy(f, in)
		return err
	})
}
