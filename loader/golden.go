package loader

import (
	"fmt"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/model"
)

// Goldens are golden requests to publish with a version (package
// golden's Set): the ids they ask for, and the golden file with each
// request's scores as ref, the new version's reference scorer, gives
// them.
type Goldens interface {
	IDs() []uint64
	File(ref *model.Reference) ([]byte, error)
}

// writeGolden scores spec.Golden on the version being written — keys
// and values (a delta's tombstones included) over its parent's chain —
// and writes the golden file.
func (r Repo) writeGolden(w *VersionWriter, spec Spec, keys []uint64, values []float32, dense *model.Dense) error {
	ids := spec.Golden.IDs()
	need := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		need[id] = true
	}
	vecs := map[uint64][]float32{}
	width := spec.Width()
	for i, k := range keys {
		if need[k] {
			if v := values[i*width : (i+1)*width]; !codec.IsTombstone(v[0]) {
				vecs[k] = v
			}
			delete(need, k)
		}
	}
	if spec.Parent != 0 {
		chain, err := r.Chain(spec.Name, spec.Parent)
		if err != nil {
			return err
		}
		var rest []uint64
		for id := range need {
			rest = append(rest, id)
		}
		old, err := r.Lookup(chain, rest)
		if err != nil {
			return fmt.Errorf("loader: scoring golden requests on the parent's records: %w", err)
		}
		for id, v := range old {
			vecs[id] = v
		}
		if dense == nil && spec.HasDense() {
			if dense, _, err = r.Dense(chain); err != nil {
				return err
			}
		}
	}
	ref, err := spec.Shape.Reference(spec.Bias, func(id uint64) []float32 { return vecs[id] }, dense)
	if err != nil {
		return fmt.Errorf("loader: golden requests: %w", err)
	}
	b, err := spec.Golden.File(ref)
	if err != nil {
		return err
	}
	return w.WriteGolden(b)
}
