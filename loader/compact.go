package loader

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
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
// files are verified as they are read. It fails with ErrSuperseded, and
// publishes nothing, if another version was published meanwhile: the
// compacted version would otherwise hide it by being newer.
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
	if latest, err := r.Latest(name); err != nil || latest != v {
		return nil, fmt.Errorf("%w: compact the newest version (%d), not %d", ErrSuperseded, latest, v)
	}
	w, err := r.NewVersion(Spec{Name: name, Type: top.Type, Dim: top.Dim, Bias: top.Bias, Partitions: top.Partitions, Encoding: top.Encoding,
		Source: fmt.Sprintf("cumulus model compact: version %d (%d deltas on version %d)", v, len(chain)-1, base.Version), Newest: v})
	if err != nil {
		return nil, err
	}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for p := range top.Partitions {
		g.Go(func() error {
			records, err := r.mergeChain(chain, p)
			if err != nil {
				return err
			}
			return w.WriteRecords(p, records)
		})
	}
	if err := g.Wait(); err != nil {
		w.Abort()
		return nil, err
	}
	return w.Commit()
}

// mergeChain is partition p of chain (newest first) as one set of
// encoded records: the newest record of each key, none for a key whose
// newest record deletes it.
func (r Repo) mergeChain(chain []*codec.Manifest, p uint32) ([]byte, error) {
	newest := map[uint64][]byte{}
	for i := len(chain) - 1; i >= 0; i-- {
		pt, err := r.ReadPartition(chain[i], p)
		if err != nil {
			return nil, err
		}
		rs := pt.RecordSize
		for j := range pt.Count {
			rec := pt.Records[j*rs : (j+1)*rs]
			h := binary.LittleEndian.Uint64(rec)
			if codec.IsTombstone(math.Float32frombits(binary.LittleEndian.Uint32(rec[8:]))) {
				delete(newest, h)
				continue
			}
			newest[h] = slices.Clone(rec)
		}
		if b, ok := pt.Owner.(interface{ Free() }); ok {
			b.Free()
		}
	}
	var out []byte
	for _, h := range slices.Sorted(maps.Keys(newest)) {
		out = append(out, newest[h]...)
	}
	return out, nil
}
