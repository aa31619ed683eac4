package loader

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
)

// TestManifestCache: a manifest is parsed once while its file stays the
// same, and read again once it changes.
func TestManifestCache(t *testing.T) {
	r := Repo{Dir: t.TempDir(), Manifests: NewManifestCache()}
	if _, err := r.Publish("m", &Sparse{Shape: smallFM().Shape, Keys: []uint64{1}, Values: []float32{1, 2, 3}}, 2, "test"); err != nil {
		t.Fatal(err)
	}
	a, err := r.Manifest("m", 1)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := r.Manifest("m", 1); b != a {
		t.Fatal("the same file parsed twice")
	}
	p := filepath.Join(r.VersionDir("m", 1), codec.ManifestName)
	raw, _ := os.ReadFile(p)
	os.WriteFile(p, append(raw, ' '), 0o644)
	later := time.Now().Add(time.Minute)
	os.Chtimes(p, later, later)
	if b, err := r.Manifest("m", 1); err != nil || b == a {
		t.Fatalf("a changed file was not read again: %v", err)
	}
	os.WriteFile(p, []byte("{"), 0o644)
	os.Chtimes(p, later.Add(time.Minute), later.Add(time.Minute))
	if _, err := r.Manifest("m", 1); err == nil {
		t.Fatal("a damaged manifest was served from the cache")
	}
}
