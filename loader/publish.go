package loader

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/model"
)

// Spec is what a writer needs to know about a new version.
type Spec struct {
	Name string
	model.Shape
	Bias       float64 // global bias
	Partitions uint32
	Encoding   string                    // factors: "" or fp32, fp16, int8
	Parent     uint64                    // for a delta: the version it applies to; 0 for a full version
	Source     string                    // recorded in the manifest
	Pushed     map[string]codec.PushMark // recorded in a delta's manifest
	// Fence, if set, is asked under the model's lock just before the
	// version becomes visible: an error publishes nothing. (A manager
	// sealing pushes checks it still leads: a deposed one must not
	// publish after its successor.)
	Fence func() error
	// Written, if set, is told the version's number and the directory
	// holding its files, complete, just before it becomes visible (the
	// directory is then renamed: its files stay as they are). It may be
	// told a number more than once, if a number it was told is taken.
	Written   func(version uint64, dir string)
	Generator *codec.GenInfo
	// SameAs: the version serves exactly what version SameAs serves (a
	// compaction of its chain). Commit then also copies every delta
	// published on SameAs's line since onto it, so that nothing newer is
	// hidden, and deltas published later on SameAs land on it too; it
	// fails with ErrSuperseded if a version off that line came since.
	SameAs uint64
	// Golden, if set, are golden requests to publish with the version
	// (publish and PublishDelta write them; VersionWriter does not): the
	// version's golden file, each request's want scored by its reference
	// scorer.
	Golden Goldens
	// Pack, for a delta, writes its partitions as sections of one file
	// (manifest format 3) rather than a file each: a delta a second over
	// a thousand partitions creates, syncs and opens one file, not
	// hundreds. The partitions are held in memory until Commit.
	Pack bool
}

// packName is a packed delta's file of partitions.
const packName = "partitions.pack"

// ErrSuperseded is returned by the Commit of a compaction when a version
// other than deltas on the compacted one was published meanwhile: the
// compaction, newer, would hide it.
var ErrSuperseded = errors.New("loader: a newer version is off the compacted chain (the compaction, newer still, would hide it)")

// VersionWriter writes one new version. A full version writes every
// partition; a delta only those it changes, and the others are its
// parent's (format 2: Manifest.Unchanged). Partition files go to a hidden
// directory; Commit fsyncs them, writes the manifest last and renames the
// directory into place, so readers see all of a version or none of it.
type VersionWriter struct {
	repo   Repo
	spec   Spec
	tmp    string
	files  []codec.File
	done   []bool
	extras []codec.Extra
	// packed holds, with Spec.Pack, each partition's bytes until Commit.
	packed [][]byte
}

// NewVersion starts writing a new version of spec.Name.
func (r Repo) NewVersion(spec Spec) (*VersionWriter, error) {
	m := codec.Manifest{Format: 1, Name: spec.Name, Version: 1, Kind: codec.KindFull, Shape: spec.Shape,
		Encoding: spec.Encoding, Bias: spec.Bias, Partitions: spec.Partitions, Hash: partition.HashName}
	if err := m.ValidateHeader(); err != nil {
		return nil, fmt.Errorf("loader: new version: %w", err)
	}
	if parts, v, ok := r.modelPartitions(spec.Name); ok && parts != spec.Partitions {
		return nil, fmt.Errorf("loader: model %s has %d partitions (fixed by version %d); a version with %d would be rejected: give %d partitions, or publish under another name",
			spec.Name, parts, v, spec.Partitions, parts)
	}
	dir := filepath.Join(r.Dir, spec.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".writing-")
	if err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	w := &VersionWriter{repo: r, spec: spec, tmp: tmp, files: make([]codec.File, spec.Partitions), done: make([]bool, spec.Partitions)}
	if spec.Pack && spec.Parent != 0 {
		w.packed = make([][]byte, spec.Partitions)
	}
	return w, nil
}

// writePart writes partition p's file with write, or, packing, keeps
// its bytes for Commit; keys is how many it holds (the buffer is sized
// for them).
func (w *VersionWriter) writePart(p uint32, keys int, write func(io.Writer) error) (path string, err error) {
	if w.packed != nil {
		var b bytes.Buffer
		b.Grow(int(codec.PartitionFileSize(keys, w.spec.Width(), codec.Encodings[w.spec.Encoding], codec.DefaultBlockSize)))
		if err := write(&b); err != nil {
			return "", err
		}
		w.packed[p] = b.Bytes()
		return packName, nil
	}
	name := partFileName(p)
	return name, writeUnsynced(filepath.Join(w.tmp, name), write)
}

// writePack writes the kept partitions as sections of one file, in
// partition order, and gives each file its offset.
func (w *VersionWriter) writePack(files []codec.File) error {
	var off int64
	return writeUnsynced(filepath.Join(w.tmp, packName), func(f io.Writer) error {
		for i := range files {
			b := w.packed[files[i].Partition]
			if _, err := f.Write(b); err != nil {
				return err
			}
			files[i].Offset = off
			off += int64(len(b))
		}
		return nil
	})
}

func partFileName(p uint32) string { return fmt.Sprintf("part-%05d.bin", p) }

// modelPartitions is the partition count of a model's oldest version
// whose manifest reads, which fixes it for every later one (the manager
// rejects a version with another); ok is false for a new model.
func (r Repo) modelPartitions(name string) (parts uint32, version uint64, ok bool) {
	versions, err := r.Versions(name)
	if err != nil {
		return 0, 0, false
	}
	for _, v := range versions {
		if m, err := r.Manifest(name, v); err == nil {
			return m.Partitions, v, true
		}
	}
	return 0, 0, false
}

// WritePartition writes partition p. Keys must be unique and belong to
// partition p. It may be called concurrently for different partitions.
func (w *VersionWriter) WritePartition(p uint32, keys []uint64, values []float32) error {
	if p >= w.spec.Partitions {
		return fmt.Errorf("loader: partition %d of %d", p, w.spec.Partitions)
	}
	var sum codec.FileSum
	name, err := w.writePart(p, len(keys), func(f io.Writer) (err error) {
		sum, err = codec.WritePartition(f, p, w.spec.Width(), codec.Encodings[w.spec.Encoding], keys, values)
		return err
	})
	if err != nil {
		return err
	}
	w.files[p] = codec.File{Partition: p, Path: name, Keys: int64(len(keys)), Size: sum.Size, SHA256: sum.SHA256}
	w.done[p] = true
	return nil
}

// WriteRecords writes partition p from records already encoded in the
// version's encoding (codec.WriteRecords: copied, never re-encoded). It
// may be called concurrently for different partitions.
func (w *VersionWriter) WriteRecords(p uint32, records []byte) error {
	if p >= w.spec.Partitions {
		return fmt.Errorf("loader: partition %d of %d", p, w.spec.Partitions)
	}
	var sum codec.FileSum
	enc := codec.Encodings[w.spec.Encoding]
	name, err := w.writePart(p, len(records)/codec.RecordSize(w.spec.Width(), enc), func(f io.Writer) (err error) {
		sum, err = codec.WriteRecords(f, p, w.spec.Width(), enc, records)
		return err
	})
	if err != nil {
		return err
	}
	w.files[p] = codec.File{Partition: p, Path: name, Keys: int64(len(records) / codec.RecordSize(w.spec.Width(), enc)), Size: sum.Size, SHA256: sum.SHA256}
	w.done[p] = true
	return nil
}

// Commit publishes the version under a number this model has never used
// and returns its manifest. Numbers are never reused, even after the
// newest version is deleted: shards report, routers route by, and clients
// pin and are answered with the number, and one number must always mean
// the same weights.
//
// Commit holds the model's lock (flock on DIR/NAME/.lock) while it picks
// the number max(high-water, Latest)+1, raises the high-water mark to it
// and renames the version into place. The mark is raised (durably)
// before the rename, so no version is ever visible without the mark
// covering it; a crash between the two only skips a number.
func (w *VersionWriter) Commit() (*codec.Manifest, error) {
	kind := codec.KindFull
	if w.spec.Parent != 0 {
		kind = codec.KindDelta
	}
	var params int64
	var files []codec.File
	var unchanged [][2]uint32
	for p, ok := range w.done {
		switch {
		case ok:
			params += w.files[p].Keys
			files = append(files, w.files[p])
		case kind == codec.KindFull:
			w.Abort()
			return nil, fmt.Errorf("loader: partition %d was never written", p)
		case len(unchanged) > 0 && unchanged[len(unchanged)-1][1] == uint32(p)-1:
			unchanged[len(unchanged)-1][1] = uint32(p)
		default:
			unchanged = append(unchanged, [2]uint32{uint32(p), uint32(p)})
		}
	}
	format := 1
	if len(unchanged) > 0 {
		format = 2 // a delta as big as what it changes; format 1 readers refuse it whole
	}
	if w.packed != nil && len(files) > 0 {
		if err := w.writePack(files); err != nil {
			w.Abort()
			return nil, err
		}
		format = codec.PackedFormat
	}
	if err := w.syncPartitions(files); err != nil {
		w.Abort()
		return nil, err
	}
	slices.SortFunc(w.extras, func(a, b codec.Extra) int { return strings.Compare(a.Role, b.Role) })
	m := &codec.Manifest{Format: format, Name: w.spec.Name, Kind: kind, Parent: w.spec.Parent, SameAs: w.spec.SameAs, Shape: w.spec.Shape, Encoding: w.spec.Encoding,
		Bias: w.spec.Bias, Partitions: w.spec.Partitions, Hash: partition.HashName, Params: params, Files: files, Unchanged: unchanged,
		Source: w.spec.Source, Pushed: w.spec.Pushed, Generator: w.spec.Generator, Created: time.Now().UTC().Format(time.RFC3339), Extras: w.extras}
	if err := w.commit(m); err != nil {
		w.Abort()
		return nil, err
	}
	return m, nil
}

// commit numbers m, writes it and publishes the version under the lock.
// A delta whose parent has a same-content replacement (SameAs) is stacked
// on the replacement; a compaction copies the deltas published since on
// its line onto itself (rebase).
func (w *VersionWriter) commit(m *codec.Manifest) error {
	unlock, err := w.repo.lock(w.spec.Name)
	if err != nil {
		return err
	}
	defer unlock()
	var copies []*stagedCopy
	switch {
	case m.SameAs != 0:
		rebase, err := w.repo.laterOnLine(w.spec.Name, m.SameAs)
		if err != nil {
			return err
		}
		// Every copy is staged before anything becomes visible: a delta
		// that cannot be copied fails the compaction, which would
		// otherwise hide it by being newer.
		for _, x := range rebase {
			c, err := w.repo.stageCopy(x)
			if err != nil {
				for _, c := range copies {
					c.w.Abort()
				}
				return fmt.Errorf("loader: delta %d, published on the compacted chain, cannot be copied onto the compaction, which would hide it: %w", x.Version, err)
			}
			copies = append(copies, c)
		}
	case m.Parent != 0:
		m.Parent = w.repo.replacement(w.spec.Name, m.Parent)
	}
	if err := w.commitLocked(m); err != nil {
		for _, c := range copies {
			c.w.Abort()
		}
		return err
	}
	for i, c := range copies {
		// (Only a crash from here on can leave a copied delta out.)
		c.m.Parent = w.repo.replacement(c.m.Name, c.m.Parent)
		if err := c.w.commitLocked(c.m); err != nil {
			for _, c := range copies[i:] {
				c.w.Abort()
			}
			return fmt.Errorf("loader: version %d written; copying delta %d onto it: %w", m.Version, c.m.SameAs, err)
		}
	}
	return nil
}

// commitLocked numbers m, writes it into w.tmp and renames that into
// place. The caller holds the model's lock.
func (w *VersionWriter) commitLocked(m *codec.Manifest) error {
	if w.spec.Fence != nil {
		if err := w.spec.Fence(); err != nil {
			return err
		}
	}
	next, err := w.repo.nextVersion(w.spec.Name)
	if err != nil {
		return err
	}
	// The lock makes a taken number rare: a writer that does not take it
	// (an older cumulus) or a stray directory without a manifest, which
	// Latest does not count. Skip such numbers.
	for attempt := 0; attempt < 100; attempt, next = attempt+1, next+1 {
		if next == 0 {
			return fmt.Errorf("loader: %s has run out of version numbers", w.spec.Name)
		}
		m.Version = next
		if err := m.Validate(); err != nil {
			return fmt.Errorf("loader: commit: %w", err)
		}
		b, _ := json.MarshalIndent(m, "", "  ")
		err := writeSynced(filepath.Join(w.tmp, codec.ManifestName), func(f io.Writer) error {
			_, err := f.Write(append(b, '\n'))
			return err
		})
		if err != nil {
			return err
		}
		if err := w.repo.writeHighWater(w.spec.Name, next); err != nil {
			return err
		}
		if w.spec.Written != nil {
			w.spec.Written(next, w.tmp)
		}
		err = os.Rename(w.tmp, w.repo.VersionDir(w.spec.Name, next))
		if err == nil {
			// The version is visible now; failing to sync its name would
			// not make it less so, so the error is not reported.
			_ = syncPath(filepath.Join(w.repo.Dir, w.spec.Name))
			return nil
		}
		if !errors.Is(err, os.ErrExist) && !isNotEmpty(err) {
			return fmt.Errorf("loader: publishing version: %w", err)
		}
	}
	return fmt.Errorf("loader: could not claim a version number for %s: 100 numbers after the high-water mark are taken", w.spec.Name)
}

// nextVersion is the number the next version of a model gets: one past
// both the high-water mark and the latest version, which covers
// repositories from before the mark existed. The caller holds the lock.
func (r Repo) nextVersion(name string) (uint64, error) {
	hw, err := r.highWater(name)
	if err != nil {
		return 0, err
	}
	latest, err := r.Latest(name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, err
	}
	return max(hw, latest) + 1, nil
}

// writeHighWater replaces a model's high-water mark with v, durably: a
// temporary file, fsynced, renamed over the old one, then the directory
// fsynced. The caller holds the lock, so the temporary name is its own.
func (r Repo) writeHighWater(name string, v uint64) error {
	dir := filepath.Join(r.Dir, name)
	tmp := filepath.Join(dir, highWaterName+".tmp")
	err := writeSynced(tmp, func(f io.Writer) error {
		_, err := fmt.Fprintf(f, "%d\n", v)
		return err
	})
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, highWaterName)); err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	if err := syncPath(dir); err != nil {
		return fmt.Errorf("loader: syncing %s: %w", dir, err)
	}
	return nil
}

// lock takes the model's writer lock and returns its release. It is an
// flock on DIR/NAME/.lock, so it excludes writers in other processes and,
// since each call opens the file anew, other goroutines in this one. The
// kernel releases it if the process dies.
func (r Repo) lock(name string) (unlock func(), err error) {
	p := filepath.Join(r.Dir, name, lockName)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("loader: locking %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}

// Abort removes everything written.
func (w *VersionWriter) Abort() { os.RemoveAll(w.tmp) }

// syncPartitions makes the partition files durable before the manifest
// is written, many at once. Partition files are written without a sync
// and synced together here: on ext4 an fsync holds the journal, and a
// file created meanwhile waits on it, so syncing each file as it is
// written serialized a thousand-partition version on its fsyncs; synced
// together, the journal commits them in groups.
func (w *VersionWriter) syncPartitions(files []codec.File) error {
	var g errgroup.Group
	g.SetLimit(syncParallel)
	synced := map[string]bool{} // a packed delta's file once
	for _, f := range files {
		if synced[f.Path] {
			continue
		}
		synced[f.Path] = true
		g.Go(func() error {
			path := filepath.Join(w.tmp, f.Path)
			if err := syncPath(path); err != nil {
				return fmt.Errorf("loader: syncing %s: %w", path, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// syncParallel bounds the fsyncs syncPartitions has under way.
const syncParallel = 64

// writeSynced creates path, lets write fill it, and fsyncs it.
func writeSynced(path string, write func(io.Writer) error) error {
	return writeFile(path, write, true)
}

// writeUnsynced creates path and lets write fill it; the caller syncs
// it (syncPartitions) before anything refers to it.
func writeUnsynced(path string, write func(io.Writer) error) error {
	return writeFile(path, write, false)
}

func writeFile(path string, write func(io.Writer) error, sync bool) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	err = write(f)
	if err == nil && sync {
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

// syncPath fsyncs a file, or a directory (making renames in it durable).
func syncPath(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
