package codec

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/model"
)

// ManifestName is the manifest's file name inside a version directory.
const ManifestName = "manifest.json"

// Version kinds.
const (
	KindFull  = "full"
	KindDelta = "delta"
)

// Manifest describes one version of one model. It is written last, so a
// version directory with a valid manifest is complete.
type Manifest struct {
	// Format is 1, or 2 for a delta that lists Unchanged partitions
	// (readers of format 1 refuse it whole rather than take the missing
	// files for empty ones), or 3 for a delta whose partitions are
	// sections of one file (File.Offset; readers of 2 refuse it whole
	// rather than take a section for a file).
	Format  int    `json:"format"`
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	Kind    string `json:"kind"`             // full or delta
	Parent  uint64 `json:"parent,omitempty"` // the version a delta applies to
	// SameAs: this version serves exactly what version SameAs serves (a
	// compaction of its chain, or a delta copied onto one). A delta
	// published later on SameAs is stacked on this version instead.
	SameAs uint64 `json:"same_as,omitempty"`
	// The model's type and its parameters (type, dim, fields, …): see
	// package model.
	model.Shape
	Encoding   string  `json:"encoding,omitempty"` // factors: fp32 (default), fp16 or int8
	Bias       float64 `json:"bias"`               // global bias term
	Partitions uint32  `json:"partitions"`
	Hash       string  `json:"hash"` // partition function; see internal/partition
	Params     int64   `json:"params"`
	// Files are the version's partition files, in partition order: every
	// partition's for a full version and in format 1; in format 2, a
	// delta's touched partitions only (File finds one).
	Files []File `json:"files"`
	// Unchanged (format 2, deltas only) lists as inclusive ranges
	// [first, last] the partitions the delta leaves as its parent has
	// them: their layer is the parent's, with the parent's identity.
	// Together with Files it names every partition exactly once.
	Unchanged [][2]uint32 `json:"unchanged,omitempty"`
	// Extras are the version's other files, one per role. A delta
	// inherits its parent's dense part unless it lists its own
	// (ChainExtra); golden requests are its own or none.
	Extras []Extra `json:"extras,omitempty"`
	Source string  `json:"source,omitempty"` // free text: importer, generator flags
	// Pushed, on a delta sealed from pushes (manager/push.go), maps each
	// producer whose batches it holds to the highest sequence it holds:
	// a manager taking over reads its producers' high-water marks here.
	Pushed    map[string]PushMark `json:"pushed,omitempty"`
	Generator *GenInfo            `json:"generator,omitempty"`
	Created   string              `json:"created,omitempty"`

	// packs is each file's size, as ParseManifest found it (PackSize):
	// set once, before the manifest is shared. A manifest built in
	// memory has none, and PackSize scans its files.
	packs map[string]int64
}

// GenInfo describes a synthetic model's ids, so load generators can send
// traffic that hits it: the model holds the ids of ranks 0..Params-1, and
// rank r's id is r itself ("dense") or splitmix64(Seed+r) ("hashed").
type GenInfo struct {
	Seed uint64 `json:"seed"`
	IDs  string `json:"ids"` // dense or hashed
}

// File is one partition file of a version.
type File struct {
	Partition uint32 `json:"partition"`
	Path      string `json:"path"` // relative to the version directory
	// Offset, in format 3, is where the partition's bytes start in Path,
	// a file several partitions share as sections; 0 otherwise. Size and
	// SHA256 are the section's.
	Offset int64  `json:"offset,omitempty"`
	Keys   int64  `json:"keys"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// PackedFormat is the manifest format of a delta whose partitions are
// sections of one file.
const PackedFormat = 3

// Extra is a file of a version besides its partitions.
type Extra struct {
	Role   string `json:"role"` // RoleDense, RoleGolden
	Path   string `json:"path"` // relative to the version directory
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Roles of extra files.
const (
	// RoleDense is a version's dense part: its MLP layers, in the
	// safetensors format (model.ReadSafetensors).
	RoleDense = "dense"
	// RoleGolden is a version's golden requests: KServe v2 JSON infer
	// bodies, one per line, each with the scores the version must give
	// ("want"); the manager's golden gate sends them (package golden).
	// A delta does not inherit its parent's: their wants are the
	// parent's scores.
	RoleGolden = "golden"
)

// MaxGoldenBytes bounds a golden file: the manager reads it whole.
const MaxGoldenBytes = 64 << 20

// Extra is m's own extra file of role, if it lists one.
func (m *Manifest) Extra(role string) (Extra, bool) {
	for _, e := range m.Extras {
		if e.Role == role {
			return e, true
		}
	}
	return Extra{}, false
}

// ChainExtra is the extra file of role that the version whose chain
// (newest first) is given uses: the newest link's that lists one, with
// that link's manifest; ok is false if none does.
func ChainExtra(chain []*Manifest, role string) (from *Manifest, e Extra, ok bool) {
	for _, m := range chain {
		if e, ok := m.Extra(role); ok {
			return m, e, true
		}
	}
	return nil, Extra{}, false
}

// Enc is the manifest's factor encoding.
func (m *Manifest) Enc() Encoding { return Encodings[m.Encoding] }

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidName reports whether s is usable as a model name: it becomes a
// directory name and a URL path segment.
func ValidName(s string) bool { return namePattern.MatchString(s) }

// Validate checks internal consistency; it does not touch files. Its
// cost grows with the files and ranges listed, not with the partition
// count.
func (m *Manifest) Validate() error {
	if err := m.ValidateHeader(); err != nil {
		return err
	}
	if m.SameAs >= m.Version {
		return fmt.Errorf("codec: manifest: same_as %d is not an earlier version than %d", m.SameAs, m.Version)
	}
	if err := m.validateCover(); err != nil {
		return err
	}
	var total int64
	for _, f := range m.Files {
		if !localPath(f.Path) {
			return fmt.Errorf("codec: manifest: file path %q must be relative and inside the version directory", f.Path)
		}
		if len(f.SHA256) != 64 {
			return fmt.Errorf("codec: manifest: file %s has no SHA-256", f.Path)
		}
		if f.Keys < 0 || f.Keys > 1<<32-1 || !PartitionSizeValid(f.Size, int(f.Keys), m.Width(), m.Enc(), DefaultBlockSize) {
			return fmt.Errorf("codec: manifest: file %s size %d does not match %d keys of width %d", f.Path, f.Size, f.Keys, m.Width())
		}
		if f.Offset < 0 || (f.Offset != 0 && m.Format != PackedFormat) || f.Offset > math.MaxInt64-f.Size {
			return fmt.Errorf("codec: manifest: partition %d's offset %d in %s (only format %d has offsets, each ≥ 0)", f.Partition, f.Offset, f.Path, PackedFormat)
		}
		total += f.Keys
	}
	if err := m.validateSections(); err != nil {
		return err
	}
	if total != m.Params {
		return fmt.Errorf("codec: manifest: files hold %d keys, params says %d", total, m.Params)
	}
	if err := m.validatePushed(); err != nil {
		return err
	}
	return m.validateExtras()
}

// PushMark is a producer's highest sealed sequence and when its window
// was sealed (the sealing leader's clock).
type PushMark struct {
	Seq uint64    `json:"seq"`
	At  time.Time `json:"at"`
}

// MaxPushProducers bounds the producers a manifest (and a model's state)
// may name.
const MaxPushProducers = 4096

var producerPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// ValidProducer reports whether s is usable as a push producer's ID.
func ValidProducer(s string) bool { return producerPattern.MatchString(s) }

func (m *Manifest) validatePushed() error {
	if len(m.Pushed) == 0 {
		return nil
	}
	if m.Kind != KindDelta || len(m.Pushed) > MaxPushProducers {
		return fmt.Errorf("codec: manifest: pushed marks on a %s version, or more than %d (%d)", m.Kind, MaxPushProducers, len(m.Pushed))
	}
	for p, mk := range m.Pushed {
		if !ValidProducer(p) || mk.Seq == 0 {
			return fmt.Errorf("codec: manifest: pushed mark %q: sequence %d (a producer is 1 to 128 of [A-Za-z0-9._:-], a sequence at least 1)", p, mk.Seq)
		}
	}
	return nil
}

// validateSections checks that no two partitions share bytes of a file:
// before format 3 each has a file of its own; in format 3 partitions in
// one file are sections that do not overlap.
func (m *Manifest) validateSections() error {
	byPath := map[string][]File{}
	for _, f := range m.Files {
		byPath[f.Path] = append(byPath[f.Path], f)
	}
	for path, fs := range byPath {
		if len(fs) > 1 && m.Format != PackedFormat {
			return fmt.Errorf("codec: manifest: partitions %d and %d share file %s (only format %d packs partitions in one file)", fs[0].Partition, fs[1].Partition, path, PackedFormat)
		}
		// A file's sections follow one another from its first byte: no
		// overlap, and no gap of bytes nothing checks.
		slices.SortFunc(fs, func(a, b File) int { return cmp.Compare(a.Offset, b.Offset) })
		var end int64
		for _, f := range fs {
			if f.Offset != end {
				return fmt.Errorf("codec: manifest: partition %d starts at byte %d of %s; the sections before it end at %d (sections follow one another from byte 0)", f.Partition, f.Offset, path, end)
			}
			end += f.Size
		}
	}
	return nil
}

// PackSize is the size file path must have in m: the end of its last
// section (its size, if it holds one partition).
func (m *Manifest) PackSize(path string) int64 {
	if m.packs != nil {
		return m.packs[path] // as ParseManifest found them: a lookup per partition read
	}
	return packSizes(m.Files)[path]
}

// packSizes is each file's size: where its last section ends.
func packSizes(files []File) map[string]int64 {
	sizes := make(map[string]int64, len(files))
	for _, f := range files {
		sizes[f.Path] = max(sizes[f.Path], f.Offset+f.Size)
	}
	return sizes
}

// validateCover checks that Files and Unchanged name every partition
// exactly once: in format 1 (and for a full version) every partition has
// its file, in order; in format 2 a delta's files and unchanged ranges,
// each ascending, together cover 0..Partitions-1 without overlap.
func (m *Manifest) validateCover() error {
	if m.Format >= 2 && m.Kind == KindFull {
		return fmt.Errorf("codec: manifest: format %d is for a delta; a full version is format 1", m.Format)
	}
	if m.Format == 1 {
		if len(m.Unchanged) > 0 {
			return fmt.Errorf("codec: manifest: only a delta in format 2 may list unchanged partitions")
		}
		if len(m.Files) != int(m.Partitions) {
			return fmt.Errorf("codec: manifest: %d files for %d partitions", len(m.Files), m.Partitions)
		}
		for i, f := range m.Files {
			if f.Partition != uint32(i) {
				return fmt.Errorf("codec: manifest: file %d is for partition %d; files must be in partition order", i, f.Partition)
			}
		}
		return nil
	}
	if m.Format == 2 && len(m.Unchanged) == 0 {
		return fmt.Errorf("codec: manifest: a format 2 delta lists its unchanged partitions (none: write format 1)")
	}
	for i := 1; i < len(m.Files); i++ {
		if m.Files[i].Partition < m.Files[i-1].Partition {
			return fmt.Errorf("codec: manifest: file %d is for partition %d, after partition %d; files must be in partition order", i, m.Files[i].Partition, m.Files[i-1].Partition)
		}
	}
	for i := 1; i < len(m.Unchanged); i++ {
		if m.Unchanged[i][0] < m.Unchanged[i-1][0] {
			return fmt.Errorf("codec: manifest: unchanged range %d starts at partition %d, before the one above it; ranges must ascend", i, m.Unchanged[i][0])
		}
	}
	var next uint32 // the lowest partition not yet named
	fi, ui := 0, 0
	for fi < len(m.Files) || ui < len(m.Unchanged) {
		var first, last uint32
		var what string
		if ui == len(m.Unchanged) || fi < len(m.Files) && m.Files[fi].Partition <= m.Unchanged[ui][0] {
			first, last, what = m.Files[fi].Partition, m.Files[fi].Partition, "a file"
			if ui < len(m.Unchanged) && first == m.Unchanged[ui][0] {
				return fmt.Errorf("codec: manifest: partition %d is listed both as unchanged and with a file", first)
			}
			fi++
		} else {
			first, last, what = m.Unchanged[ui][0], m.Unchanged[ui][1], "unchanged"
			if first > last {
				return fmt.Errorf("codec: manifest: unchanged range [%d, %d] is reversed", first, last)
			}
			ui++
		}
		switch {
		case last >= m.Partitions:
			return fmt.Errorf("codec: manifest: partition %d (%s) is out of range: the model has partitions 0..%d", last, what, m.Partitions-1)
		case first < next:
			// Both lists ascend, so an overlap shows as a step back.
			return fmt.Errorf("codec: manifest: partition %d is named twice: as unchanged and with a file, or twice in one list (files and unchanged ranges ascend and do not overlap)", first)
		case first > next:
			return fmt.Errorf("codec: manifest: partition %d has neither a file nor an unchanged mark", next)
		}
		next = last + 1
	}
	if next != m.Partitions {
		return fmt.Errorf("codec: manifest: partition %d has neither a file nor an unchanged mark", next)
	}
	return nil
}

// File is partition p's file in m; ok is false when m leaves p unchanged
// (or has no partition p).
func (m *Manifest) File(p uint32) (f File, ok bool) {
	if p >= m.Partitions {
		return File{}, false
	}
	if len(m.Files) == int(m.Partitions) {
		return m.Files[p], true
	}
	i, ok := slices.BinarySearchFunc(m.Files, p, func(f File, p uint32) int { return cmp.Compare(f.Partition, p) })
	if !ok {
		return File{}, false
	}
	return m.Files[i], true
}

// Touched lists the partitions m has files for, ascending.
func (m *Manifest) Touched() []uint32 {
	out := make([]uint32, len(m.Files))
	for i, f := range m.Files {
		out[i] = f.Partition
	}
	return out
}

// validateExtras checks the extra files: known roles, once each, paths
// inside the version directory and apart from the partitions', and a
// dense part exactly for a type with one (a full version's own; a
// delta may inherit its parent's).
func (m *Manifest) validateExtras() error {
	paths := map[string]bool{}
	for _, f := range m.Files {
		paths[f.Path] = true
	}
	roles := map[string]bool{}
	for _, e := range m.Extras {
		switch {
		case e.Role != RoleDense && e.Role != RoleGolden:
			return fmt.Errorf("codec: manifest: extra file %q has unknown role %q", e.Path, e.Role)
		case roles[e.Role]:
			return fmt.Errorf("codec: manifest: two extra files of role %q", e.Role)
		case !localPath(e.Path) || paths[e.Path]:
			return fmt.Errorf("codec: manifest: extra file path %q must be relative, inside the version directory, and no other file's", e.Path)
		case len(e.SHA256) != 64:
			return fmt.Errorf("codec: manifest: extra file %s has no SHA-256", e.Path)
		case e.Size <= 0 || e.Size > maxExtraBytes(e.Role):
			return fmt.Errorf("codec: manifest: extra file %s size %d outside 1..%d", e.Path, e.Size, maxExtraBytes(e.Role))
		case e.Role == RoleDense && !m.HasDense():
			return fmt.Errorf("codec: manifest: an %s model takes no dense part", m.Type)
		}
		roles[e.Role], paths[e.Path] = true, true
	}
	if m.HasDense() && m.Kind == KindFull && !roles[RoleDense] {
		return fmt.Errorf("codec: manifest: a full %s version needs its dense part (an extra file of role %q)", m.Type, RoleDense)
	}
	return nil
}

func maxExtraBytes(role string) int64 {
	if role == RoleGolden {
		return MaxGoldenBytes
	}
	return model.MaxDenseBytes
}

// localPath reports whether p is a clean relative path inside its
// directory.
func localPath(p string) bool {
	return p != "" && !path.IsAbs(p) && path.Clean(p) == p && p != ".." && !strings.HasPrefix(p, "../")
}

// ValidateHeader checks every field but the file list and totals: what a
// writer knows before it has written any partition.
func (m *Manifest) ValidateHeader() error {
	switch {
	case m.Format < 1 || m.Format > PackedFormat:
		return fmt.Errorf("codec: manifest: unsupported format %d (this build reads 1 to %d)", m.Format, PackedFormat)
	case !ValidName(m.Name):
		return fmt.Errorf("codec: manifest: invalid model name %q", m.Name)
	case m.Version == 0:
		return fmt.Errorf("codec: manifest: version must be ≥ 1")
	case m.Kind != KindFull && m.Kind != KindDelta:
		return fmt.Errorf("codec: manifest: kind %q is neither full nor delta", m.Kind)
	case m.Kind == KindDelta && (m.Parent == 0 || m.Parent >= m.Version):
		return fmt.Errorf("codec: manifest: delta version %d needs a parent version below it", m.Version)
	case m.Partitions == 0 || m.Partitions > 1<<16:
		return fmt.Errorf("codec: manifest: partition count %d outside 1..65536", m.Partitions)
	case m.Hash != partition.HashName:
		return fmt.Errorf("codec: manifest: unknown partition hash %q (want %q)", m.Hash, partition.HashName)
	case m.Encoding != "" && m.Encoding != "fp32" && m.Encoding != "fp16" && m.Encoding != "int8":
		return fmt.Errorf("codec: manifest: unknown encoding %q (fp32, fp16 or int8)", m.Encoding)
	case math.IsNaN(m.Bias) || math.IsInf(m.Bias, 0):
		return fmt.Errorf("codec: manifest: bias %v is not finite", m.Bias)
	}
	if err := m.Shape.Validate(); err != nil {
		return fmt.Errorf("codec: manifest: %w", err)
	}
	return nil
}

// ParseManifest decodes and validates a manifest.
func ParseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("codec: manifest: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	m.packs = packSizes(m.Files)
	return &m, nil
}

// PartitionIdentity is the content identity of partition p of the version
// whose chain (newest first, ending at a full version) is given, from the
// files of p's layers: the links that have a file for p (every link in
// format 1; a format 2 delta that leaves p unchanged adds no layer). It
// is the SHA-256 of the full version's file as its manifest records it
// when no delta touches p, else the SHA-256 of the layers' file hashes
// from the full version up, one per line. So a delta that leaves p
// unchanged has its parent's identity for p. Two versions with the same
// identity for p serve the same parameters for p; shards report it for
// what they verified and routers use only reports that match the serving
// map's.
func PartitionIdentity(chain []*Manifest, p uint32) string {
	if len(chain) == 0 || p >= chain[0].Partitions {
		return ""
	}
	var sums []string
	for i := len(chain) - 1; i >= 0; i-- {
		if f, ok := chain[i].File(p); ok {
			sums = append(sums, f.SHA256)
		}
	}
	switch len(sums) {
	case 0:
		return ""
	case 1:
		return sums[0]
	}
	h := sha256.New()
	for _, s := range sums {
		io.WriteString(h, s)
		io.WriteString(h, "\n")
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Layers lists the links of chain (newest first) that have a file for
// partition p: p's layers, newest first.
func Layers(chain []*Manifest, p uint32) []*Manifest {
	var out []*Manifest
	for _, m := range chain {
		if _, ok := m.File(p); ok {
			out = append(out, m)
		}
	}
	return out
}

// ChainVersions lists the versions of a chain's manifests, in its order.
func ChainVersions(chain []*Manifest) []uint64 {
	out := make([]uint64, len(chain))
	for i, m := range chain {
		out[i] = m.Version
	}
	return out
}

// Identities is PartitionIdentity for every partition.
func Identities(chain []*Manifest) []string {
	if len(chain) == 0 {
		return nil
	}
	out := make([]string, chain[0].Partitions)
	for p := range out {
		out[p] = PartitionIdentity(chain, uint32(p))
	}
	return out
}
