package loader

import (
	"fmt"
	"math"
	"runtime"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/model"
)

// Sparse is a whole model in memory, as importers produce it. Values
// holds Width floats per key: the linear weight, then the factors.
type Sparse struct {
	model.Shape
	Bias   float64
	Keys   []uint64
	Values []float32
	// HasBias says the source named the bias (a TSV's bias header), so
	// that a delta's upserts can carry a new bias (PublishDelta).
	HasBias bool
	// Dense is the dense part of a type that has one (model.Shape.
	// HasDense).
	Dense *model.Dense
}

// check refuses duplicate keys and non-finite numbers.
func (s *Sparse) check() error {
	_, err := s.checkSorted()
	return err
}

// checkSorted is check, returning the keys sorted. Duplicates are found
// by sorting a copy, not through a map: a delta of a million keys
// sealed every second pays a sort, not a million map inserts.
func (s *Sparse) checkSorted() ([]uint64, error) {
	if len(s.Values) != len(s.Keys)*s.Width() {
		return nil, fmt.Errorf("loader: %d values for %d keys of width %d", len(s.Values), len(s.Keys), s.Width())
	}
	if math.IsNaN(s.Bias) || math.IsInf(s.Bias, 0) {
		return nil, fmt.Errorf("loader: bias %v is not finite", s.Bias)
	}
	if err := checkFinite(s.Keys, s.Values, s.Width()); err != nil {
		return nil, err
	}
	sorted := slices.Clone(s.Keys)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, fmt.Errorf("loader: feature id %d appears twice", sorted[i])
		}
	}
	return sorted, nil
}

// Publish splits a model into partitions and publishes it as the next
// version of name.
func (r Repo) Publish(name string, s *Sparse, partitions uint32, source string) (*codec.Manifest, error) {
	return r.PublishEncoded(name, s, partitions, "", source)
}

// PublishEncoded is Publish with FM factors stored in encoding (fp32,
// fp16 or int8; "" means fp32).
func (r Repo) PublishEncoded(name string, s *Sparse, partitions uint32, encoding, source string) (*codec.Manifest, error) {
	return r.PublishSpec(Spec{Name: name, Partitions: partitions, Encoding: encoding, Source: source}, s)
}

// PublishSpec publishes s as the next version of spec.Name, as spec's
// Partitions, Encoding, Source and Golden say (its shape and bias are
// s's).
func (r Repo) PublishSpec(spec Spec, s *Sparse) (*codec.Manifest, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if s.HasDense() && s.Dense == nil {
		return nil, fmt.Errorf("loader: a %s model needs its dense part", s.Type)
	}
	spec.Shape, spec.Bias, spec.Parent = s.Shape, s.Bias, 0
	return r.publish(spec, s.Keys, s.Values, s.Dense)
}

// Delta is an increment to a version of a model.
type Delta struct {
	Upserts *Sparse  // features added or changed (and the new bias, if it names one); may be nil
	Deletes []uint64 // features removed
	Bias    *float64 // the new bias; nil keeps the upserts' (if named) or the parent's
	// Dense replaces the dense part (model types with one); nil keeps the
	// parent's.
	Dense *model.Dense
	// Parent is the version to build on; 0: the newest that passes the
	// local checks (DeltaParent).
	Parent uint64
	Source string
	// Pushed, for a delta sealed from pushes, are its producers' marks
	// (codec.Manifest.Pushed).
	Pushed map[string]codec.PushMark
	// Fence: see Spec.Fence.
	Fence func() error
	// ParentChecked: the caller has validated Parent's files itself (a
	// manager sealing pushes onto a version it validates), so they are
	// not read again; its chain's manifests still are.
	ParentChecked bool
	// Golden, if set, are the delta's golden requests, scored on the new
	// chain (see Spec.Golden); nil: the delta has none (golden requests
	// are not inherited: their wants are one version's scores).
	Golden Goldens
	// Pack writes its partitions as sections of one file (Spec.Pack).
	Pack bool
	// Written: see Spec.Written.
	Written func(version uint64, dir string)
	// Split, in place of Upserts and Deletes, is the delta's rows
	// already split by partition (a window of pushes): no golden
	// requests with it.
	Split *Split
}

// Split is a delta's rows by partition. Rows(p) returns partition p's
// upserted keys with their values (Width per key) and its deleted keys,
// each key once and of partition p (checked). It is called once for each
// partition in Touched (ascending, no repeats), concurrently for
// different ones, as the partition is written: splitting and writing
// share the machine's cores, and no copy of the whole delta is made.
type Split struct {
	Touched []uint32
	Rows    func(p uint32) (keys []uint64, values []float32, deletes []uint64)
}

// DeltaParent is the version a delta is built on by default: the newest
// whose chain of manifests reads and agrees, and whose own files match
// their manifest. A version the manager would reject (damaged, a broken
// chain) is passed over, and so is its reason returned in skipped.
func (r Repo) DeltaParent(name string) (v uint64, skipped []error, err error) {
	chain, skipped, err := r.deltaParent(name)
	if err != nil {
		return 0, skipped, err
	}
	return chain[0].Version, skipped, nil
}

// deltaParent is DeltaParent, returning the parent's chain.
func (r Repo) deltaParent(name string) (chain []*codec.Manifest, skipped []error, err error) {
	versions, err := r.Versions(name)
	if err != nil {
		return nil, nil, err
	}
	for i := len(versions) - 1; i >= 0; i-- {
		chain, err := r.checkParent(name, versions[i])
		if err != nil {
			skipped = append(skipped, fmt.Errorf("version %d: %w", versions[i], err))
			continue
		}
		return chain, skipped, nil
	}
	return nil, skipped, fmt.Errorf("%w: model %q has no version a delta can build on (%d skipped)", ErrNotFound, name, len(skipped))
}

// checkParent is DeltaParent's check of one version, returning its chain.
func (r Repo) checkParent(name string, v uint64) ([]*codec.Manifest, error) {
	chain, err := r.Chain(name, v)
	if err != nil {
		return nil, err
	}
	return chain, r.Verify(chain[0])
}

// roomOnChain refuses a delta on chain (newest first) that would make
// it longer than a chain may be: refused when published, not when a
// reader meets it.
func roomOnChain(chain []*codec.Manifest) error {
	if len(chain)-1 >= MaxChain {
		return fmt.Errorf("loader: a delta on %s version %d would stack %d deltas, over the %d a chain may hold: compact the chain first ('cumulus model compact', or the manager's --compact-after)",
			chain[0].Name, chain[0].Version, len(chain), MaxChain)
	}
	return nil
}

// PublishDelta publishes d as a delta version on top of d.Parent (by
// default DeltaParent): its partition files hold the upserted records
// and, for each deleted feature, a record whose weight is
// codec.Tombstone.
func (r Repo) PublishDelta(name string, d Delta) (*codec.Manifest, error) {
	latest := d.Parent
	var chain []*codec.Manifest
	var err error
	if latest == 0 {
		if chain, _, err = r.deltaParent(name); err != nil {
			return nil, err
		}
		latest = chain[0].Version
	} else if d.ParentChecked {
		if chain, err = r.Chain(name, latest); err != nil {
			return nil, fmt.Errorf("loader: parent %d: %w", latest, err)
		}
	} else if chain, err = r.checkParent(name, latest); err != nil {
		return nil, fmt.Errorf("loader: parent %d: %w", latest, err)
	}
	if err := roomOnChain(chain); err != nil {
		return nil, err
	}
	parent := chain[0]
	if d.Split != nil {
		return r.publishSplit(name, parent, d)
	}
	up := d.Upserts
	if up == nil {
		up = &Sparse{Shape: parent.Shape}
	}
	if up.Shape != parent.Shape {
		return nil, fmt.Errorf("loader: delta is %s; %s version %d is %s", up.Shape, name, latest, parent.Shape)
	}
	sorted, err := up.checkSorted()
	if err != nil {
		return nil, err
	}
	deletes := slices.Sorted(slices.Values(d.Deletes))
	for i, j := 0, 0; j < len(deletes); j++ {
		if j > 0 && deletes[j] == deletes[j-1] {
			return nil, fmt.Errorf("loader: delta deletes feature %d twice", deletes[j])
		}
		for i < len(sorted) && sorted[i] < deletes[j] {
			i++
		}
		if i < len(sorted) && sorted[i] == deletes[j] {
			return nil, fmt.Errorf("loader: delta both changes and deletes feature %d", deletes[j])
		}
	}
	keys, values := withTombstones(up.Keys, up.Values, deletes, parent.Width())
	bias := parent.Bias
	switch {
	case d.Bias != nil && up.HasBias && *d.Bias != up.Bias:
		return nil, fmt.Errorf("loader: delta names two biases: %v, and %v in its upserts; give one", *d.Bias, up.Bias)
	case d.Bias != nil:
		bias = *d.Bias
	case up.HasBias:
		bias = up.Bias
	}
	if d.Dense != nil && !parent.HasDense() {
		return nil, fmt.Errorf("loader: an %s model takes no dense part", parent.Type)
	}
	return r.publish(Spec{Name: name, Shape: parent.Shape, Bias: bias, Partitions: parent.Partitions,
		Encoding: parent.Encoding, Parent: latest, Source: d.Source, Pushed: d.Pushed, Fence: d.Fence, Golden: d.Golden, Pack: d.Pack, Written: d.Written}, keys, values, d.Dense)
}

// publishSplit is PublishDelta of d.Split on parent.
func (r Repo) publishSplit(name string, parent *codec.Manifest, d Delta) (*codec.Manifest, error) {
	switch {
	case d.Upserts != nil || len(d.Deletes) > 0:
		return nil, fmt.Errorf("loader: a delta's rows come as Upserts and Deletes or as a Split, not both")
	case d.Golden != nil:
		return nil, fmt.Errorf("loader: a delta with golden requests gives its rows as Upserts")
	case d.Dense != nil && !parent.HasDense():
		return nil, fmt.Errorf("loader: an %s model takes no dense part", parent.Type)
	}
	for i, p := range d.Split.Touched {
		if p >= parent.Partitions || (i > 0 && p <= d.Split.Touched[i-1]) {
			return nil, fmt.Errorf("loader: a split delta's partitions are not ascending in [0, %d): %d after %v", parent.Partitions, p, d.Split.Touched[:i])
		}
	}
	bias := parent.Bias
	if d.Bias != nil {
		bias = *d.Bias
	}
	spec := Spec{Name: name, Shape: parent.Shape, Bias: bias, Partitions: parent.Partitions, Encoding: parent.Encoding, Parent: parent.Version,
		Source: d.Source, Pushed: d.Pushed, Fence: d.Fence, Pack: d.Pack, Written: d.Written}
	width := spec.Width()
	return r.publishParts(spec, d.Split.Touched, func(p uint32) ([]uint64, []float32, error) {
		keys, values, deletes := d.Split.Rows(p)
		if len(values) != len(keys)*width {
			return nil, nil, fmt.Errorf("loader: partition %d: %d values for %d keys of width %d", p, len(values), len(keys), width)
		}
		if err := checkFinite(keys, values, width); err != nil {
			return nil, nil, err
		}
		if len(deletes) > 0 {
			keys, values = withTombstones(keys, values, deletes, width)
		}
		for _, k := range keys {
			if partition.Of(k, spec.Partitions) != p {
				return nil, nil, fmt.Errorf("loader: feature id %d given in partition %d is of partition %d", k, p, partition.Of(k, spec.Partitions))
			}
		}
		return keys, values, nil // a key twice is refused as the partition is written
	}, d.Dense, nil)
}

// checkFinite refuses a non-finite value, naming its key (values width
// per key).
func checkFinite(keys []uint64, values []float32, width int) error {
	for i, v := range values {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("loader: feature id %d has a non-finite value %v", keys[i/width], v)
		}
	}
	return nil
}

// withTombstones returns copies of keys and values (width per key) with
// a tombstone record after them for each of deletes.
func withTombstones(keys []uint64, values []float32, deletes []uint64, width int) ([]uint64, []float32) {
	keys = slices.Concat(keys, deletes)
	values = slices.Grow(slices.Clone(values), len(deletes)*width)
	for range deletes {
		values = append(values, codec.Tombstone)
		values = append(values, make([]float32, width-1)...)
	}
	return keys, values
}

// publish splits keys by partition and writes them, and dense (if not
// nil), as a new version.
func (r Repo) publish(spec Spec, keys []uint64, values []float32, dense *model.Dense) (*codec.Manifest, error) {
	width := spec.Width()
	pk := make([][]uint64, spec.Partitions)
	pv := make([][]float32, spec.Partitions)
	for i, k := range keys {
		p := partition.Of(k, spec.Partitions)
		pk[p] = append(pk[p], k)
		pv[p] = append(pv[p], values[i*width:(i+1)*width]...)
	}
	var touched []uint32
	for p := range spec.Partitions {
		if spec.Parent == 0 || len(pk[p]) > 0 { // a delta leaves the partitions it does not touch as they are
			touched = append(touched, p)
		}
	}
	var golden func(w *VersionWriter) error
	if spec.Golden != nil {
		golden = func(w *VersionWriter) error { return r.writeGolden(w, spec, keys, values, dense) }
	}
	return r.publishParts(spec, touched, func(p uint32) ([]uint64, []float32, error) { return pk[p], pv[p], nil }, dense, golden)
}

// publishParts writes dense and golden's requests (each if not nil)
// and each partition in touched, rows(p) its keys and values, as a new
// version; rows is called concurrently for different partitions.
func (r Repo) publishParts(spec Spec, touched []uint32, rows func(p uint32) ([]uint64, []float32, error), dense *model.Dense, golden func(w *VersionWriter) error) (*codec.Manifest, error) {
	w, err := r.NewVersion(spec)
	if err != nil {
		return nil, err
	}
	if dense != nil {
		if err := w.WriteDense(dense); err != nil {
			w.Abort()
			return nil, err
		}
	}
	if golden != nil {
		if err := golden(w); err != nil {
			w.Abort()
			return nil, err
		}
	}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for _, p := range touched {
		g.Go(func() error {
			keys, values, err := rows(p)
			if err != nil {
				return err
			}
			return w.WritePartition(p, keys, values)
		})
	}
	if err := g.Wait(); err != nil {
		w.Abort()
		return nil, err
	}
	return w.Commit()
}
