package codec

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/model"
)

func validManifest() Manifest {
	size := PartitionFileSize(10, 1, EncFP32, DefaultBlockSize)
	sha := strings.Repeat("ab", 32)
	return Manifest{
		Format: 1, Name: "ctr", Version: 3, Kind: KindFull, Shape: model.Shape{Type: model.LR},
		Partitions: 2, Hash: partition.HashName, Params: 20,
		Files: []File{
			{Partition: 0, Path: "part-00000.bin", Keys: 10, Size: size, SHA256: sha},
			{Partition: 1, Path: "part-00001.bin", Keys: 10, Size: size, SHA256: sha},
		},
	}
}

func TestManifestValidate(t *testing.T) {
	m := validManifest()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	sha := strings.Repeat("cd", 32)
	dense := Extra{Role: RoleDense, Path: "dense.safetensors", Size: 100, SHA256: sha}
	dnn := model.Shape{Type: model.DNN, Dim: 4, Fields: 2, Pooling: "sum"}
	// A dnn version with its dense part is valid; a delta may inherit it.
	m = validManifest()
	m.Shape, m.Extras = dnn, []Extra{dense}
	dnnFiles := []File{{Partition: 0, Path: "part-00000.bin", Keys: 10, Size: PartitionFileSize(10, 5, EncFP32, DefaultBlockSize), SHA256: sha},
		{Partition: 1, Path: "part-00001.bin", Keys: 10, Size: PartitionFileSize(10, 5, EncFP32, DefaultBlockSize), SHA256: sha}}
	m.Files = dnnFiles
	if err := m.Validate(); err != nil {
		t.Fatalf("dnn with dense: %v", err)
	}
	m.Kind, m.Parent, m.Extras = KindDelta, 2, nil
	if err := m.Validate(); err != nil {
		t.Fatalf("dnn delta inheriting its dense part: %v", err)
	}
	// Each case must be refused for its own reason: the error names it.
	cases := map[string]struct {
		mutate func(m *Manifest)
		says   string
	}{
		"format":        {func(m *Manifest) { m.Format = 4 }, "unsupported format 4"},
		"format 3 full": {func(m *Manifest) { m.Format = 3 }, "a full version is format 1"},
		"offset":        {func(m *Manifest) { m.Files[1].Offset = 8 }, "only format 3 has offsets"},
		"shared file":   {func(m *Manifest) { m.Files[1].Path = m.Files[0].Path }, "share file part-00000.bin"},
		"format 2 full": {func(m *Manifest) { m.Format = 2 }, "a full version is format 1"},
		"name":          {func(m *Manifest) { m.Name = "../etc" }, `invalid model name "../etc"`},
		"version":       {func(m *Manifest) { m.Version = 0 }, "version must be ≥ 1"},
		"kind":          {func(m *Manifest) { m.Kind = "partial" }, `kind "partial"`},
		"delta parent":  {func(m *Manifest) { m.Kind = KindDelta }, "needs a parent version below it"},
		"type":          {func(m *Manifest) { m.Type = "svm" }, `unknown model type "svm"`},
		"lr dim":        {func(m *Manifest) { m.Dim = 4 }, "an lr model takes no dim (it has 4)"},
		"hash":          {func(m *Manifest) { m.Hash = "crc32" }, `unknown partition hash "crc32"`},
		"file count":    {func(m *Manifest) { m.Files = m.Files[:1] }, "1 files for 2 partitions"},
		"file order":    {func(m *Manifest) { m.Files[0].Partition = 1 }, "file 0 is for partition 1"},
		"escape":        {func(m *Manifest) { m.Files[1].Path = "../../x" }, `file path "../../x"`},
		"absolute":      {func(m *Manifest) { m.Files[1].Path = "/etc/passwd" }, `file path "/etc/passwd"`},
		"sha":           {func(m *Manifest) { m.Files[0].SHA256 = "" }, "has no SHA-256"},
		"size":          {func(m *Manifest) { m.Files[0].Size++ }, "does not match 10 keys"},
		"params":        {func(m *Manifest) { m.Params = 21 }, "params says 21"},
		"no partitions": {func(m *Manifest) { m.Partitions = 0; m.Files = nil }, "partition count 0"},
		"encoding":      {func(m *Manifest) { m.Encoding = "bf16" }, `unknown encoding "bf16"`},
		"lr dense":      {func(m *Manifest) { m.Extras = []Extra{dense} }, "an lr model takes no dense part"},
		"extra role":    {func(m *Manifest) { m.Extras = []Extra{{Role: "weights", Path: "w", Size: 1, SHA256: sha}} }, `unknown role "weights"`},
		"extra path":    {func(m *Manifest) { m.Extras = []Extra{{Role: RoleDense, Path: "part-00000.bin", Size: 1, SHA256: sha}} }, "no other file's"},
		"extra escape":  {func(m *Manifest) { m.Extras = []Extra{{Role: RoleDense, Path: "../d", Size: 1, SHA256: sha}} }, "no other file's"},
		"extra size":    {func(m *Manifest) { m.Extras = []Extra{{Role: RoleDense, Path: "d", Size: 0, SHA256: sha}} }, "size 0 outside"},
		"two dense": {func(m *Manifest) {
			m.Shape, m.Files = dnn, dnnFiles
			m.Extras = []Extra{dense, dense}
		}, "two extra files"},
		"dnn no dense": {func(m *Manifest) { m.Shape, m.Files = dnn, dnnFiles }, "a full dnn version needs its dense part"},
	}
	for name, c := range cases {
		m := validManifest()
		m.Files = append([]File(nil), m.Files...)
		c.mutate(&m)
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
	}
}

// sparseDelta is a format 2 delta on version 2 of a model of 4
// partitions that touches partition 1 only.
func sparseDelta() Manifest {
	m := validManifest()
	m.Format, m.Kind, m.Parent, m.Partitions, m.Params = 2, KindDelta, 2, 4, 10
	m.Files = []File{m.Files[1]}
	m.Unchanged = [][2]uint32{{0, 0}, {2, 3}}
	return m
}

// TestPackedManifest: a format 3 delta's partitions are sections of one
// file, which follow one another from its first byte.
func TestPackedManifest(t *testing.T) {
	m := validManifest()
	m.Format, m.Kind, m.Parent = PackedFormat, KindDelta, 2
	size := m.Files[0].Size
	m.Files[0].Path, m.Files[1].Path, m.Files[1].Offset = "pack.bin", "pack.bin", size
	if err := m.Validate(); err != nil {
		t.Fatalf("two sections: %v", err)
	}
	if got := m.PackSize("pack.bin"); got != 2*size {
		t.Fatalf("pack size %d; want %d", got, 2*size)
	}
	for _, off := range []int64{size - 1, size + 1} {
		m.Files[1].Offset = off
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "sections follow one another") {
			t.Fatalf("a section at %d after one of %d bytes: %v", off, size, err)
		}
	}
	m.Files[0].Offset, m.Files[1].Offset = size, 0 // in another order than the partitions': fine
	if err := m.Validate(); err != nil {
		t.Fatalf("sections in reverse order: %v", err)
	}
	m.Files[0].Offset = 0
	m.Files[1].Path = "other.pack"
	m.Files[1].Offset = 8 // alone in its file, not at its start
	if err := m.Validate(); err == nil {
		t.Fatal("a lone section not at byte 0 was accepted")
	}
	m.Files[1].Path = "pack.bin"
	m.Files[1].Offset = -size
	if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "offset") {
		t.Fatalf("a negative offset: %v", err)
	}
	// A format 3 delta may list no unchanged partitions, and leave some.
	m.Files[1].Offset, m.Partitions, m.Unchanged = size, 3, [][2]uint32{{2, 2}}
	if err := m.Validate(); err != nil {
		t.Fatalf("with an unchanged partition: %v", err)
	}
}

// TestManifestUnchanged: a format 2 delta names each partition once,
// with a file or as unchanged; anything else is refused, saying why.
func TestManifestUnchanged(t *testing.T) {
	m := sparseDelta()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if f, ok := m.File(1); !ok || f.Partition != 1 {
		t.Fatalf("File(1) = %+v, %v", f, ok)
	}
	for _, p := range []uint32{0, 2, 3, 4} {
		if _, ok := m.File(p); ok {
			t.Errorf("File(%d) found a file the delta leaves unchanged", p)
		}
	}
	file := func(p uint32) File { f := validManifest().Files[0]; f.Partition = p; return f }
	cases := map[string]struct {
		mutate func(m *Manifest)
		says   string
	}{
		"both":             {func(m *Manifest) { m.Unchanged = [][2]uint32{{0, 3}} }, "named twice: as unchanged and with a file"},
		"both at start":    {func(m *Manifest) { m.Unchanged = [][2]uint32{{0, 0}, {1, 3}} }, "partition 1 is listed both as unchanged and with a file"},
		"duplicate file":   {func(m *Manifest) { m.Files = []File{file(1), file(1)}; m.Params = 20 }, "partition 1 is named twice"},
		"overlapping":      {func(m *Manifest) { m.Unchanged = [][2]uint32{{0, 0}, {2, 3}, {3, 3}} }, "partition 3 is named twice"},
		"unordered":        {func(m *Manifest) { m.Unchanged = [][2]uint32{{2, 3}, {0, 0}} }, "ranges must ascend"},
		"unordered files":  {func(m *Manifest) { m.Files = []File{file(1), file(0)}; m.Params = 20 }, "files must be in partition order"},
		"range out":        {func(m *Manifest) { m.Unchanged = [][2]uint32{{0, 0}, {2, 4}} }, "partition 4 (unchanged) is out of range"},
		"file out":         {func(m *Manifest) { m.Files = []File{file(1), file(9)}; m.Params = 20 }, "partition 9 (a file) is out of range"},
		"huge range":       {func(m *Manifest) { m.Unchanged = [][2]uint32{{0, 0}, {2, 1<<32 - 1}} }, "out of range"},
		"gap":              {func(m *Manifest) { m.Unchanged = [][2]uint32{{0, 0}, {3, 3}} }, "partition 2 has neither a file nor an unchanged mark"},
		"gap at end":       {func(m *Manifest) { m.Unchanged = [][2]uint32{{0, 0}, {2, 2}} }, "partition 3 has neither"},
		"reversed":         {func(m *Manifest) { m.Unchanged = [][2]uint32{{0, 0}, {3, 2}} }, "reversed"},
		"format 1":         {func(m *Manifest) { m.Format = 1 }, "only a delta in format 2 may list unchanged partitions"},
		"none unchanged":   {func(m *Manifest) { m.Unchanged = nil }, "lists its unchanged partitions"},
		"full with ranges": {func(m *Manifest) { m.Kind, m.Parent = KindFull, 0 }, "a full version is format 1"},
	}
	for name, c := range cases {
		m := sparseDelta()
		c.mutate(&m)
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
	}
}

// TestIdentityOfUnchanged: a format 2 delta has its parent's identity
// for the partitions it leaves, and for those it touches the identity a
// format 1 chain of the same files would have.
func TestIdentityOfUnchanged(t *testing.T) {
	full := validManifest()
	full.Partitions, full.Params, full.Version = 4, 40, 2
	full.Files = nil
	for p := range uint32(4) {
		f := validManifest().Files[0]
		f.Partition, f.SHA256 = p, strings.Repeat(string(rune('a'+p)), 64)
		full.Files = append(full.Files, f)
	}
	d := sparseDelta()
	d.Version = 3
	d.Files[0].SHA256 = strings.Repeat("f", 64)
	chain := []*Manifest{&d, &full}
	dense := full // the same delta in format 1, every partition with a file
	dense.Version, dense.Kind, dense.Parent = 3, KindDelta, 2
	dense.Files = slices.Clone(full.Files)
	dense.Files[1] = d.Files[0]
	for p := range uint32(4) {
		got := PartitionIdentity(chain, p)
		if p != 1 && got != full.Files[p].SHA256 {
			t.Errorf("partition %d: identity %s, want the parent's %s", p, got, full.Files[p].SHA256)
		}
		if want := PartitionIdentity([]*Manifest{&dense, &full}, 1); p == 1 && got != want {
			t.Errorf("touched partition: identity %s, want %s as in format 1", got, want)
		}
		if n := len(Layers(chain, p)); n != 1+b2i(p == 1) {
			t.Errorf("partition %d: %d layers", p, n)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func FuzzParseManifest(f *testing.F) {
	m := validManifest()
	b, _ := json.Marshal(m)
	f.Add(b)
	sd := sparseDelta()
	b, _ = json.Marshal(sd)
	f.Add(b)
	f.Add([]byte(`{"format":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		// What is accepted means one thing: written back and read again,
		// it is the same manifest (no field read one way and written
		// another, nothing accepted that cannot be written).
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("an accepted manifest cannot be written: %v", err)
		}
		m2, err := ParseManifest(again)
		if err != nil {
			t.Fatalf("an accepted manifest, written back, is refused: %v\n%s", err, again)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the manifest:\n%+v\n%+v", m, m2)
		}
	})
}
