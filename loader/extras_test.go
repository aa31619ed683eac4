package loader

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/model"
)

func dnnModel(seed uint64, hidden ...int) *Sparse {
	s := &Sparse{Shape: model.Shape{Type: model.DNN, Dim: 2, Fields: 3, Pooling: "sum"}, Bias: 0.5}
	for id := range uint64(50) {
		s.Keys = append(s.Keys, id)
		s.Values = append(s.Values, 0.1*float32(id), 0.2, -0.3)
	}
	s.Dense = GenDense(seed, s.DenseIn(), hidden)
	return s
}

// A dnn version carries its dense part; a delta inherits it unless it
// replaces it; a compaction carries the one its chain uses; a damaged or
// ill-shaped dense file fails verification, naming it.
func TestDenseExtras(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	m1, err := repo.Publish("d", dnnModel(1, 4), 2, "test")
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := m1.Extra(codec.RoleDense); !ok || e.Path != DenseFileName {
		t.Fatalf("v1 extras %+v", m1.Extras)
	}
	dense := func(v uint64) (*model.Dense, string) {
		t.Helper()
		chain, err := repo.Chain("d", v)
		if err != nil {
			t.Fatal(err)
		}
		if err := repo.Verify(chain[0]); err != nil {
			t.Fatal(err)
		}
		d, sum, err := repo.Dense(chain)
		if err != nil {
			t.Fatal(err)
		}
		return d, sum
	}
	d1, sum1 := dense(1)
	if !reflect.DeepEqual(d1.Layers, dnnModel(1, 4).Dense.Layers) {
		t.Fatal("v1's dense part read back differs")
	}
	// A delta without one inherits v1's.
	m2, err := repo.PublishDelta("d", Delta{Deletes: []uint64{3}})
	if err != nil {
		t.Fatal(err)
	}
	if len(m2.Extras) != 0 {
		t.Fatalf("delta lists extras %+v", m2.Extras)
	}
	if _, sum := dense(2); sum != sum1 {
		t.Fatal("delta does not use its parent's dense part")
	}
	// A delta with one replaces it, for itself and what stacks on it.
	if _, err := repo.PublishDelta("d", Delta{Dense: dnnModel(9, 4).Dense}); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.PublishDelta("d", Delta{Deletes: []uint64{4}}); err != nil {
		t.Fatal(err)
	}
	d4, sum4 := dense(4)
	if sum4 == sum1 || !reflect.DeepEqual(d4.Layers, dnnModel(9, 4).Dense.Layers) {
		t.Fatal("v4 does not use v3's dense part")
	}
	// A compaction of v4 holds v3's dense part itself.
	c, err := repo.Compact("d", 4)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := c.Extra(codec.RoleDense); !ok || e.SHA256 != sum4 {
		t.Fatalf("compaction extras %+v, want the dense part %s", c.Extras, sum4)
	}
	dense(c.Version)
	// Refusals: a dense part that does not fit the shape, or none.
	if _, err := repo.PublishDelta("d", Delta{Dense: GenDense(1, 5, nil)}); err == nil || !strings.Contains(err.Error(), "takes 5 inputs; it is given 6") {
		t.Errorf("ill-shaped dense delta: %v", err)
	}
	noDense := dnnModel(1)
	noDense.Dense = nil
	if _, err := repo.Publish("e", noDense, 2, "test"); err == nil || !strings.Contains(err.Error(), "needs its dense part") {
		t.Errorf("dnn without dense: %v", err)
	}
	// A damaged dense file fails verification, naming it.
	p := filepath.Join(repo.VersionDir("d", 1), DenseFileName)
	b, _ := os.ReadFile(p)
	b[len(b)-1] ^= 1
	os.WriteFile(p, b, 0o644)
	chain, _ := repo.Chain("d", 1)
	if err := repo.Verify(chain[0]); err == nil || !strings.Contains(err.Error(), DenseFileName) {
		t.Errorf("damaged dense file: %v", err)
	}
	// So does one with the right checksum in its manifest whose layers do
	// not fit the shape (a manifest edited by hand).
	os.WriteFile(p, func() []byte {
		var sb strings.Builder
		model.WriteSafetensors(&sb, GenDense(1, 5, nil), "")
		return []byte(sb.String())
	}(), 0o644)
	b, _ = os.ReadFile(p)
	sum := sha256.Sum256(b)
	m1.Extras[0].SHA256, m1.Extras[0].Size = hex.EncodeToString(sum[:]), int64(len(b))
	mj, _ := json.Marshal(m1)
	os.WriteFile(filepath.Join(repo.VersionDir("d", 1), codec.ManifestName), mj, 0o644)
	chain, _ = repo.Chain("d", 1)
	if err := repo.Verify(chain[0]); err == nil || !strings.Contains(err.Error(), "takes 5 inputs") {
		t.Errorf("ill-shaped dense file: %v", err)
	}
}

// TestVerifyRefusesNonFinite: a version whose files hold a NaN (written
// around the importers, which refuse one) fails verification — so the
// manager rejects it — naming the file and the feature.
func TestVerifyRefusesNonFinite(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	w, err := repo.NewVersion(Spec{Name: "m", Shape: model.Shape{Type: model.FM, Dim: 2}, Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WritePartition(0, []uint64{7, 8}, []float32{0.5, 0.1, 0.2, 0.25, float32(math.NaN()), 0.3}); err != nil {
		t.Fatal(err)
	}
	m, err := w.Commit()
	if err != nil {
		t.Fatal(err)
	}
	err = repo.Verify(m)
	if !errors.Is(err, codec.ErrNotFinite) || !strings.Contains(err.Error(), "feature id 8") || !strings.Contains(err.Error(), "part-00000.bin") {
		t.Fatalf("verify: %v", err)
	}
}

// TestNamedPipesAreRefused: a named pipe where a version has a file (a
// partition, an extra file, the manifest) is refused as damaged at once,
// not opened and waited on.
func TestNamedPipesAreRefused(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	m, err := repo.Publish("m", &Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{1, 2}, Values: []float32{0.5, -0.5}}, 2, "test")
	if err != nil {
		t.Fatal(err)
	}
	dir := repo.VersionDir("m", m.Version)
	fifo := func(name string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fifo(m.Files[1].Path)
	done := make(chan error, 1)
	go func() { done <- repo.Verify(m) }()
	select {
	case err := <-done:
		if !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("a named pipe as a partition file: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Verify blocked on a named pipe")
	}
	if _, err := repo.ReadPartition(m, 1); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("ReadPartition: %v", err)
	}
	fifo(codec.ManifestName)
	if _, err := repo.Manifest("m", m.Version); !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a named pipe as the manifest: %v", err)
	}
	p := filepath.Join(t.TempDir(), "holdout")
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRegular(p, 100); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("ReadRegular of a named pipe: %v", err)
	}
}
