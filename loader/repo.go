package loader

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
)

// ErrNotFound is wrapped when a model or version does not exist.
var ErrNotFound = errors.New("loader: not found")

// Repo is a model repository on a file system:
//
//	DIR/NAME/VERSION/manifest.json
//	DIR/NAME/VERSION/part-00000.bin …
//	DIR/NAME/.high-water
//	DIR/NAME/.lock
//
// VERSION is a decimal number. Names starting with a dot are never
// versions: directories being written, the high-water mark (the highest
// version number ever given out, so a deleted version's number is never
// reused) and the lock writers hold while they take a number.
type Repo struct {
	Dir string
	// Throttle, if set, bounds how fast partitions are read to be served
	// (ReadPartition, MapPartitionCopy).
	Throttle *Throttle
	// Manifests, if set, keeps manifests parsed while their files stay
	// the same (Manifest, Chain): for readers that never change one.
	Manifests *ManifestCache
}

// Files kept beside a model's versions; see Repo.
const (
	highWaterName = ".high-water"
	lockName      = ".lock"
)

// Models lists model names, sorted.
func (r Repo) Models() ([]string, error) {
	ents, err := os.ReadDir(r.Dir)
	if err != nil {
		return nil, fmt.Errorf("loader: reading repository: %w", err)
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() && codec.ValidName(e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Versions lists the published versions of a model, ascending.
func (r Repo) Versions(name string) ([]uint64, error) {
	if !codec.ValidName(name) {
		return nil, fmt.Errorf("loader: invalid model name %q", name)
	}
	ents, err := os.ReadDir(filepath.Join(r.Dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: model %q in %s", ErrNotFound, name, r.Dir)
	}
	if err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	var vs []uint64
	for _, e := range ents {
		v, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil || !e.IsDir() || v == 0 {
			continue
		}
		if _, err := os.Stat(filepath.Join(r.Dir, name, e.Name(), codec.ManifestName)); err == nil {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	return vs, nil
}

// Latest returns the highest published version of a model.
func (r Repo) Latest(name string) (uint64, error) {
	vs, err := r.Versions(name)
	if err != nil {
		return 0, err
	}
	if len(vs) == 0 {
		return 0, fmt.Errorf("%w: model %q has no published version", ErrNotFound, name)
	}
	return vs[len(vs)-1], nil
}

// highWater returns the highest version number ever given to a model, or
// 0 if the repository has no high-water file (it was written before there
// was one, or nothing was published yet).
func (r Repo) highWater(name string) (uint64, error) {
	p := filepath.Join(r.Dir, name, highWaterName)
	b, err := ReadRegular(p, 1<<10)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	text := strings.TrimSpace(string(b))
	v, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		if len(text) > 32 {
			text = text[:32] + "…"
		}
		return 0, fmt.Errorf("loader: %s: %w: holds %q, not a version number; write the highest version ever published into it",
			p, codec.ErrCorrupt, text)
	}
	return v, nil
}

// maxManifestBytes bounds a manifest (about 150 bytes a partition).
const maxManifestBytes = 64 << 20

// VersionDir is the directory holding one version.
func (r Repo) VersionDir(name string, version uint64) string {
	return filepath.Join(r.Dir, name, strconv.FormatUint(version, 10))
}

// Manifest reads and validates a version's manifest, checking that it
// describes the model and version it is filed under.
func (r Repo) Manifest(name string, version uint64) (*codec.Manifest, error) {
	p := filepath.Join(r.VersionDir(name, version), codec.ManifestName)
	cached, st := r.Manifests.get(p)
	if cached != nil {
		return cached, nil
	}
	b, err := ReadRegular(p, maxManifestBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: model %q version %d", ErrNotFound, name, version)
	}
	if err != nil {
		return nil, err
	}
	m, err := codec.ParseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("loader: %s: %w", p, err)
	}
	if m.Name != name || m.Version != version {
		return nil, fmt.Errorf("loader: %s describes %s version %d", p, m.Name, m.Version)
	}
	r.Manifests.put(p, st, m)
	return m, nil
}

// partFile returns the manifest entry and path of one partition's file.
func (r Repo) partFile(m *codec.Manifest, part uint32) (codec.File, string, error) {
	if part >= m.Partitions {
		return codec.File{}, "", fmt.Errorf("loader: model %s has no partition %d", m.Name, part)
	}
	f, ok := m.File(part)
	if !ok {
		return codec.File{}, "", fmt.Errorf("loader: %s version %d has no file for partition %d: it leaves it as its parent has it", m.Name, m.Version, part)
	}
	return f, filepath.Join(r.VersionDir(m.Name, m.Version), f.Path), nil
}

// matchesManifest checks a parsed partition is the one the manifest lists.
func matchesManifest(pt *codec.Partition, m *codec.Manifest, part uint32, f codec.File, path string) error {
	if pt.Number != part || pt.Width != m.Width() || pt.Encoding != m.Enc() || int64(pt.Count) != f.Keys {
		return fmt.Errorf("loader: %s: %w: holds partition %d, width %d, %d keys; manifest says %d, %d, %d",
			path, codec.ErrCorrupt, pt.Number, pt.Width, pt.Count, part, m.Width(), f.Keys)
	}
	return nil
}

// ReadPartition reads one partition file of a version (at the pace of
// r.Throttle) and verifies its size, SHA-256 and structure. Errors name
// the file.
func (r Repo) ReadPartition(m *codec.Manifest, part uint32) (*codec.Partition, error) {
	f, p, err := r.partFile(m, part)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	mem, err := readSection(p, m.PackSize(f.Path), f.Offset, f.Size, h, r.Throttle)
	if err != nil {
		return nil, err
	}
	if hex.EncodeToString(h.Sum(nil)) != f.SHA256 {
		mem.Free()
		return nil, fmt.Errorf("loader: %s%s: %w: SHA-256 does not match the manifest", p, section(f), codec.ErrCorrupt)
	}
	// The file is, byte for byte, the one the manifest names: its block
	// checksums add nothing to the SHA-256 (they say which block a
	// damaged file lost, and VerifyStream checks them when a version is
	// validated).
	pt, err := codec.ParsePartitionStructure(mem.Bytes)
	if err != nil {
		mem.Free()
		return nil, fmt.Errorf("loader: %s: %w", p, err)
	}
	if err := matchesManifest(pt, m, part, f, p); err != nil {
		mem.Free()
		return nil, err
	}
	pt.Owner = mem
	return pt, nil
}

// freePartition releases the memory ReadPartition read pt into; pt
// must not be used after.
func freePartition(pt *codec.Partition) {
	if b, ok := pt.Owner.(interface{ Free() }); ok {
		b.Free()
	}
}

// readSection reads size bytes at off of a file of size whole (a
// partition's file, or its section of a packed delta's) into memory that
// will serve lookups in place (huge pages where possible), writing what
// it reads to sum as it goes (while it is in the cache), at throttle's
// pace.
func readSection(path string, whole, off, size int64, sum io.Writer, throttle *Throttle) (*tablemem.Buffer, error) {
	f, err := openSection(path, whole)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mem := tablemem.Alloc(int(size))
	if _, err := io.ReadFull(io.TeeReader(throttle.reader(io.NewSectionReader(f, off, size)), sum), mem.Bytes); err != nil {
		mem.Free()
		return nil, fmt.Errorf("loader: reading %s: %w", path, err)
	}
	return mem, nil
}

// Verify checks every partition file of a version against the manifest
// (size, SHA-256, block checksums) with a small buffer, and reports every
// damaged file. It holds no table in memory.
func (r Repo) Verify(m *codec.Manifest) error {
	var errs damaged
	for _, group := range byFile(m.Files) {
		p := filepath.Join(r.VersionDir(m.Name, m.Version), group[0].Path)
		if err := verifyFile(p, group, m.PackSize(group[0].Path)); err != nil {
			errs = append(errs, err)
		}
	}
	for _, e := range m.Extras {
		if err := r.verifyExtra(m, e); err != nil {
			errs = append(errs, err)
		}
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return errs
}

// damaged is the error of several damaged files: each named, on one line.
type damaged []error

func (d damaged) Error() string {
	s := make([]string, len(d))
	for i, err := range d {
		s[i] = strings.TrimPrefix(err.Error(), "loader: ")
	}
	return fmt.Sprintf("loader: %d files damaged: %s", len(d), strings.Join(s, "; "))
}

func (d damaged) Unwrap() []error { return d }

// byFile groups files by path, in the manifest's order: a packed
// delta's partitions are one group, opened once.
func byFile(files []codec.File) [][]codec.File {
	var out [][]codec.File
	at := map[string]int{}
	for _, f := range files {
		i, ok := at[f.Path]
		if !ok {
			i = len(out)
			at[f.Path] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], f)
	}
	return out
}

// verifyFile checks the partitions fs, all in file p (a partition's
// own, or a packed delta's) of size whole, against the manifest: its size, and
// each partition's block checksums and SHA-256. It reports the first
// damaged partition.
func verifyFile(p string, fs []codec.File, whole int64) error {
	fh, err := openSection(p, whole)
	if err != nil {
		return err
	}
	defer fh.Close()
	for _, f := range fs {
		sum, err := codec.VerifyStream(io.NewSectionReader(fh, f.Offset, f.Size), f.Size)
		if err != nil {
			return fmt.Errorf("loader: %s%s: %w", p, section(f), err)
		}
		if sum != f.SHA256 {
			return fmt.Errorf("loader: %s%s: %w: SHA-256 does not match the manifest", p, section(f), codec.ErrCorrupt)
		}
	}
	return nil
}

// openSection opens a partition file, or a packed delta's file of
// partitions, and checks it has the size the manifest gives it.
func openSection(p string, whole int64) (*os.File, error) {
	fh, st, err := OpenRegular(p)
	if err != nil {
		return nil, err
	}
	if st.Size() != whole {
		fh.Close()
		return nil, fmt.Errorf("loader: %s: %w: size %d, manifest says %d", p, codec.ErrCorrupt, st.Size(), whole)
	}
	return fh, nil
}

// section names partition f's place in a packed file ("" in a file
// named for it alone), for errors.
func section(f codec.File) string {
	if f.Offset == 0 && path.Base(f.Path) == partFileName(f.Partition) {
		return ""
	}
	return fmt.Sprintf(" (partition %d at byte %d)", f.Partition, f.Offset)
}

// MaxChain bounds how many deltas may stack on a full version: a chain
// longer is refused, and so is a delta that would make one.
const MaxChain = 1000

// Chain returns the manifests a version is made of, newest first: the
// version itself, then its parents, ending at a full version. Every link
// must agree on the model's shape (type, dim, encoding, partitions, hash).
func (r Repo) Chain(name string, version uint64) ([]*codec.Manifest, error) {
	var chain []*codec.Manifest
	for v := version; ; {
		m, err := r.Manifest(name, v)
		if err != nil {
			if len(chain) > 0 {
				return nil, fmt.Errorf("loader: %s version %d: parent %d: %w", name, chain[len(chain)-1].Version, v, err)
			}
			return nil, err
		}
		if len(chain) > 0 {
			top := chain[0]
			if m.Partitions != top.Partitions {
				return nil, fmt.Errorf("loader: %s version %d has %d partitions, its parent %d has %d (a delta's partitions, changed or not, are its parent's)", name, chain[len(chain)-1].Version, top.Partitions, v, m.Partitions)
			}
			if m.Shape != top.Shape || m.Enc() != top.Enc() || m.Hash != top.Hash {
				return nil, fmt.Errorf("loader: %s version %d does not match the shape of its parent %d", name, chain[len(chain)-1].Version, v)
			}
		}
		chain = append(chain, m)
		if m.Kind == codec.KindFull {
			return chain, nil
		}
		if len(chain) > MaxChain {
			return nil, fmt.Errorf("loader: %s version %d stacks more than %d deltas", name, version, MaxChain)
		}
		v = m.Parent
	}
}
