package loader

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
)

// Spec is what a writer needs to know about a new version.
type Spec struct {
	Name       string
	Type       string  // codec.TypeLR or codec.TypeFM
	Dim        int     // FM factors
	Bias       float64 // global bias
	Partitions uint32
	Encoding   string // FM factors: "" or fp32, fp16, int8
	Parent     uint64 // for a delta: the version it applies to; 0 for a full version
	Source     string // recorded in the manifest
	Generator  *codec.GenInfo
}

// VersionWriter writes one new version. Partition files go to a hidden
// directory; Commit fsyncs them, writes the manifest last and renames the
// directory into place, so readers see all of a version or none of it.
type VersionWriter struct {
	repo  Repo
	spec  Spec
	tmp   string
	files []codec.File
	done  []bool
}

// NewVersion starts writing a new version of spec.Name.
func (r Repo) NewVersion(spec Spec) (*VersionWriter, error) {
	m := codec.Manifest{Format: 1, Name: spec.Name, Version: 1, Kind: codec.KindFull, Type: spec.Type, Dim: spec.Dim,
		Encoding: spec.Encoding, Bias: spec.Bias, Partitions: spec.Partitions, Hash: partition.HashName}
	if err := m.ValidateHeader(); err != nil {
		return nil, fmt.Errorf("loader: new version: %w", err)
	}
	dir := filepath.Join(r.Dir, spec.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".writing-")
	if err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	return &VersionWriter{repo: r, spec: spec, tmp: tmp, files: make([]codec.File, spec.Partitions), done: make([]bool, spec.Partitions)}, nil
}

func partFileName(p uint32) string { return fmt.Sprintf("part-%05d.bin", p) }

// WritePartition writes partition p. Keys must be unique and belong to
// partition p. It may be called concurrently for different partitions.
func (w *VersionWriter) WritePartition(p uint32, keys []uint64, values []float32) error {
	if p >= w.spec.Partitions {
		return fmt.Errorf("loader: partition %d of %d", p, w.spec.Partitions)
	}
	name := partFileName(p)
	var sum codec.FileSum
	err := writeSynced(filepath.Join(w.tmp, name), func(f io.Writer) (err error) {
		sum, err = codec.WritePartition(f, p, 1+w.spec.Dim, codec.Encodings[w.spec.Encoding], keys, values)
		return err
	})
	if err != nil {
		return err
	}
	w.files[p] = codec.File{Partition: p, Path: name, Keys: int64(len(keys)), Size: sum.Size, SHA256: sum.SHA256}
	w.done[p] = true
	return nil
}

// Commit publishes the version under the next free version number and
// returns its manifest.
func (w *VersionWriter) Commit() (*codec.Manifest, error) {
	var params int64
	for p, ok := range w.done {
		if !ok {
			w.Abort()
			return nil, fmt.Errorf("loader: partition %d was never written", p)
		}
		params += w.files[p].Keys
	}
	kind := codec.KindFull
	if w.spec.Parent != 0 {
		kind = codec.KindDelta
	}
	m := &codec.Manifest{Format: 1, Name: w.spec.Name, Kind: kind, Parent: w.spec.Parent, Type: w.spec.Type, Dim: w.spec.Dim, Encoding: w.spec.Encoding,
		Bias: w.spec.Bias, Partitions: w.spec.Partitions, Hash: partition.HashName, Params: params, Files: w.files,
		Source: w.spec.Source, Generator: w.spec.Generator, Created: time.Now().UTC().Format(time.RFC3339)}
	// Another writer may take a number between Latest and Rename: retry.
	for attempt := 0; attempt < 100; attempt++ {
		latest, err := w.repo.Latest(w.spec.Name)
		if err != nil && !errors.Is(err, ErrNotFound) {
			w.Abort()
			return nil, err
		}
		m.Version = latest + 1
		if err := m.Validate(); err != nil {
			w.Abort()
			return nil, fmt.Errorf("loader: commit: %w", err)
		}
		b, _ := json.MarshalIndent(m, "", "  ")
		err = writeSynced(filepath.Join(w.tmp, codec.ManifestName), func(f io.Writer) error {
			_, err := f.Write(append(b, '\n'))
			return err
		})
		if err != nil {
			w.Abort()
			return nil, err
		}
		err = os.Rename(w.tmp, w.repo.VersionDir(w.spec.Name, m.Version))
		if err == nil {
			syncDir(filepath.Join(w.repo.Dir, w.spec.Name))
			return m, nil
		}
		if !errors.Is(err, os.ErrExist) && !isNotEmpty(err) {
			w.Abort()
			return nil, fmt.Errorf("loader: publishing version: %w", err)
		}
	}
	w.Abort()
	return nil, fmt.Errorf("loader: could not claim a version number for %s", w.spec.Name)
}

// Abort removes everything written.
func (w *VersionWriter) Abort() { os.RemoveAll(w.tmp) }

// writeSynced creates path, lets write fill it, and fsyncs it.
func writeSynced(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	err = write(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("loader: writing %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
