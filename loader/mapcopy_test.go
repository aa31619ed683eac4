package loader

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
	"github.com/cumulus-serving/cumulus/model"
)

// lrModel is an LR model of n features.
func lrModel(n int, scale float32) *Sparse {
	s := &Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= uint64(n); k++ {
		s.Keys = append(s.Keys, k*0x9e3779b97f4a7c15)
		s.Values = append(s.Values, scale*float32(k))
	}
	return s
}

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("%s left behind in %s", e.Name(), dir)
	}
}

// A mapped copy holds the file's bytes and keeps holding them whatever
// then happens to the repository's file; its name is gone at once.
func TestMapPartitionCopy(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	m, err := repo.Publish("m", lrModel(250000, 1), 2, "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Files[1].Size <= codec.DefaultBlockSize {
		t.Fatal("the file has one checksum block: the test wants several")
	}
	dir := t.TempDir()
	src := filepath.Join(repo.VersionDir("m", 1), m.Files[1].Path)
	orig, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	pt, err := repo.MapPartitionCopy(m, 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, dir)
	mem, ok := pt.Owner.(*tablemem.Buffer)
	if !ok || !mem.Mapped || mem.File == nil {
		t.Fatalf("owner %T is not a mapped buffer with its file", pt.Owner)
	}
	if mem.File.Name() == src || !strings.HasPrefix(mem.File.Name(), dir) {
		t.Fatalf("mapped %s, want a copy in %s", mem.File.Name(), dir)
	}

	// Overwrite, then truncate, the repository's file.
	junk := bytes.Repeat([]byte{0xA5}, len(orig)/2)
	if err := os.WriteFile(src, append(orig[:len(orig)/4:len(orig)/4], junk...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, int64(len(orig)/3)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem.Bytes, orig) {
		t.Fatal("the mapping changed with the repository's file")
	}
	viaFile := make([]byte, len(orig))
	if _, err := mem.File.ReadAt(viaFile, 0); err != nil || !bytes.Equal(viaFile, orig) {
		t.Fatalf("pread of the copy does not give the original bytes (%v)", err)
	}
	if err := pt.VerifyBlocks(1); err != nil {
		t.Fatal(err)
	}
	if pt.Number != 1 || int64(pt.Count) != m.Files[1].Keys {
		t.Fatalf("partition %d with %d keys, want 1 with %d", pt.Number, pt.Count, m.Files[1].Keys)
	}
}

// A source that does not match the manifest is refused, named, and no
// copy stays behind.
func TestMapPartitionCopyRefusesMismatch(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	m, err := repo.Publish("m", lrModel(250000, 1), 2, "")
	if err != nil {
		t.Fatal(err)
	}
	// Version 2 has the same keys, so files of the same size and sound
	// checksums, with other values.
	m2, err := repo.Publish("m", lrModel(250000, 2), 2, "")
	if err != nil {
		t.Fatal(err)
	}
	if m2.Files[1].Size != m.Files[1].Size {
		t.Fatal("the versions' files differ in size: the other-file case would test nothing new")
	}
	src := filepath.Join(repo.VersionDir("m", 1), m.Files[1].Path)
	orig, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.ReadFile(filepath.Join(repo.VersionDir("m", 2), m2.Files[1].Path))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		file func() []byte
	}{
		{"byte flipped mid-file", func() []byte {
			b := bytes.Clone(orig)
			b[len(b)/2] ^= 1
			return b
		}},
		{"truncated", func() []byte { return orig[:len(orig)/2] }},
		{"grown", func() []byte { return append(bytes.Clone(orig), 0) }},
		{"another version's file", func() []byte { return other }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(src, tc.file(), 0o644); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			pt, err := repo.MapPartitionCopy(m, 1, dir)
			if pt != nil || !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), src) {
				t.Fatalf("err = %v, want codec.ErrCorrupt naming %s", err, src)
			}
			assertEmpty(t, dir)
		})
	}

	// A data dir that cannot take the copy: refused, naming the source.
	if err := os.WriteFile(src, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.MapPartitionCopy(m, 1, filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), src) {
		t.Fatalf("copy into a missing directory: err = %v", err)
	}
}

// RemoveCopies removes leftover copies only: not other files, and not a
// copy another process is writing (it holds the lock).
func TestRemoveCopies(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leftover := write("m-3-1-123456" + copySuffix)
	keep := []string{write("notes.txt"), write("m-3-1-123456" + copySuffix + ".bak")}
	busy := write("m-3-0-654321" + copySuffix)
	keep = append(keep, busy)
	fh, err := os.Open(busy)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := unix.Flock(int(fh.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	subdir := filepath.Join(dir, "d"+copySuffix)
	if err := os.Mkdir(subdir, 0o700); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, subdir)

	if err := RemoveCopies(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover copy not removed: %v", err)
	}
	for _, p := range keep {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
