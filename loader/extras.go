package loader

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/model"
)

// Extra files' names in a version directory.
const (
	DenseFileName  = "dense.safetensors"
	GoldenFileName = "golden.jsonl"
)

// WriteExtra writes the version's extra file of role as name, filled by
// write. A role may be written once.
func (w *VersionWriter) WriteExtra(role, name string, write func(io.Writer) error) error {
	for _, e := range w.extras {
		if e.Role == role {
			return fmt.Errorf("loader: extra file of role %q written twice", role)
		}
	}
	h := sha256.New()
	var size int64
	err := writeSynced(filepath.Join(w.tmp, name), func(f io.Writer) error {
		c := &countingWriter{w: io.MultiWriter(f, h)}
		err := write(c)
		size = c.n
		return err
	})
	if err != nil {
		return err
	}
	w.extras = append(w.extras, codec.Extra{Role: role, Path: name, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))})
	return nil
}

// WriteDense writes d as the version's dense part.
func (w *VersionWriter) WriteDense(d *model.Dense) error {
	if err := d.Check(w.spec.DenseIn()); err != nil {
		return fmt.Errorf("loader: dense part for %s: %w", w.spec.Shape, err)
	}
	return w.WriteExtra(codec.RoleDense, DenseFileName, func(f io.Writer) error { return model.WriteSafetensors(f, d, "") })
}

// WriteGolden writes b as the version's golden requests (package
// golden reads and writes their lines).
func (w *VersionWriter) WriteGolden(b []byte) error {
	if len(b) == 0 || len(b) > codec.MaxGoldenBytes {
		return fmt.Errorf("loader: golden requests of %d bytes; 1 to %d are allowed", len(b), codec.MaxGoldenBytes)
	}
	return w.WriteExtra(codec.RoleGolden, GoldenFileName, func(f io.Writer) error { _, err := f.Write(b); return err })
}

// Golden reads version m's golden requests, checked against its
// manifest; nil when it has none. Unlike a dense part, golden requests
// are not inherited: their wants are one version's scores.
func (r Repo) Golden(m *codec.Manifest) ([]byte, error) {
	e, ok := m.Extra(codec.RoleGolden)
	if !ok {
		return nil, nil
	}
	return readExtra(filepath.Join(r.VersionDir(m.Name, m.Version), e.Path), e)
}

// copyExtra writes the extra file e of version from into w, linked where
// the file system allows.
func (w *VersionWriter) copyExtra(from *codec.Manifest, e codec.Extra) error {
	src := filepath.Join(w.repo.VersionDir(from.Name, from.Version), e.Path)
	if err := linkOrCopy(src, filepath.Join(w.tmp, e.Path), e.Size); err != nil {
		return err
	}
	w.extras = append(w.extras, e)
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// Dense reads the dense part the version whose chain (newest first) is
// given uses, verifying its SHA-256 against the manifest that lists it
// and its layers against the model's shape, and returns it with that
// SHA-256.
func (r Repo) Dense(chain []*codec.Manifest) (*model.Dense, string, error) {
	from, e, ok := codec.ChainExtra(chain, codec.RoleDense)
	if !ok {
		return nil, "", fmt.Errorf("loader: %s version %d has no dense part", chain[0].Name, chain[0].Version)
	}
	_, d, err := r.readDense(from, e, chain[0].Shape)
	return d, e.SHA256, err
}

// DenseFile reads the dense part's file the version whose chain is given
// uses, which must have SHA-256 sum (as the serving map names it), and
// hold layers the model's shape can use.
func (r Repo) DenseFile(chain []*codec.Manifest, sum string) ([]byte, error) {
	from, e, ok := codec.ChainExtra(chain, codec.RoleDense)
	if !ok || e.SHA256 != sum {
		return nil, fmt.Errorf("loader: %s version %d: its dense part is not %q", chain[0].Name, chain[0].Version, sum)
	}
	b, _, err := r.readDense(from, e, chain[0].Shape)
	return b, err
}

// readDense reads the dense part e that version m lists, checks its size
// and SHA-256 against e and its layers against shape, and returns the
// file and the layers it holds.
func (r Repo) readDense(m *codec.Manifest, e codec.Extra, shape model.Shape) ([]byte, *model.Dense, error) {
	p := filepath.Join(r.VersionDir(m.Name, m.Version), e.Path)
	b, err := readExtra(p, e)
	if err != nil {
		return nil, nil, err
	}
	d, err := ParseDense(b, shape)
	if err != nil {
		return nil, nil, fmt.Errorf("loader: %s: %w", p, err)
	}
	return b, d, nil
}

// ParseDense reads a dense part's file and checks its layers fit shape.
func ParseDense(b []byte, shape model.Shape) (*model.Dense, error) {
	d, err := shape.ReadDense(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", codec.ErrCorrupt, err)
	}
	return d, nil
}

// readExtra reads extra file p, which must have e's size and SHA-256.
func readExtra(p string, e codec.Extra) ([]byte, error) {
	f, _, err := OpenRegular(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, e.Size+1))
	if err != nil {
		return nil, fmt.Errorf("loader: %s: %w", p, err)
	}
	if int64(len(b)) != e.Size {
		return nil, fmt.Errorf("loader: %s: %w: size %d, manifest says %d", p, codec.ErrCorrupt, len(b), e.Size)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != e.SHA256 {
		return nil, fmt.Errorf("loader: %s: %w: SHA-256 does not match the manifest", p, codec.ErrCorrupt)
	}
	return b, nil
}

// verifyExtra checks version m's extra file e: its size and SHA-256, and
// for a dense part, that it reads as layers the model's shape can use.
func (r Repo) verifyExtra(m *codec.Manifest, e codec.Extra) error {
	if e.Role == codec.RoleDense {
		_, _, err := r.readDense(m, e, m.Shape)
		return err
	}
	_, err := readExtra(filepath.Join(r.VersionDir(m.Name, m.Version), e.Path), e)
	return err
}

// linkOrCopy links src to dst, or copies it where links are refused, and
// checks the result has size bytes.
func linkOrCopy(src, dst string, size int64) error {
	if err := os.Link(src, dst); err != nil {
		if err := copyFile(src, dst); err != nil {
			return err
		}
	}
	if st, err := os.Stat(dst); err != nil || st.Size() != size {
		return fmt.Errorf("%s: not the size its manifest says", src)
	}
	return nil
}
