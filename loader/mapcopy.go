package loader

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
)

// copySuffix ends the name of every copy MapPartitionCopy writes, so
// RemoveCopies can tell them from anything else in the directory.
const copySuffix = ".partcopy"

// MapPartitionCopy is ReadPartition for a partition served from a
// read-only mapping, without faulting the records into memory. It maps a
// copy of the file in dir, a directory the caller owns, never the
// repository's file: a mapping shows every later write to its file, and
// touching a page past a truncation raises SIGBUS, so a repository file
// edited or truncated in place would give wrong answers or kill the
// process.
//
// The source is read once: every byte read for verification (size,
// block checksums, SHA-256 against the manifest) is written to the same
// offset of the copy, so the copy holds exactly the bytes verified and a
// file changed mid-copy is refused. The copy is synced (a write error
// shows now, not as a bad page later), mapped, checked against the
// manifest and unlinked: the mapping and its open file keep the data,
// and the disk space returns when the partition's memory is released.
// Nothing stays in dir, on success or failure, unless the process dies
// mid-call; RemoveCopies clears such leftovers.
func (r Repo) MapPartitionCopy(m *codec.Manifest, part uint32, dir string) (*codec.Partition, error) {
	f, p, err := r.partFile(m, part)
	if err != nil {
		return nil, err
	}
	copyFile, err := copyVerified(p, f, m.PackSize(f.Path), dir, r.Throttle, fmt.Sprintf("%s-%d-%d-*%s", m.Name, m.Version, part, copySuffix))
	if err != nil {
		return nil, err
	}
	defer copyFile.Close() // releases the lock once the name is gone
	mem, err := tablemem.Map(copyFile.Name(), f.Size)
	// Unlinked whether mapping worked or not: the mapping needs no name.
	if rerr := os.Remove(copyFile.Name()); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return nil, fmt.Errorf("loader: mapping the copy of %s: %w", p, err)
	}
	pt, err := codec.ParsePartitionStructure(mem.Bytes)
	if err != nil {
		return nil, fmt.Errorf("loader: %s (copied): %w", p, err)
	}
	if err := matchesManifest(pt, m, part, f, p); err != nil {
		return nil, err
	}
	pt.Owner = mem
	return pt, nil
}

// copyVerified copies the partition file at src to a new file in dir
// (named by pattern, as os.CreateTemp does) while codec.VerifyStream
// checks it against f, and returns the copy, synced, still open and
// locked. On error the copy is removed.
//
// VerifyStream reads every byte of the file and hashes each range where
// it last reads it; the tee writes each read to the same offset, so the
// copy is byte for byte what was hashed. (It reads the header twice, and
// the second read, inside block 0, is the one hashed and kept.)
//
// The copy holds an exclusive flock while it has a name, so RemoveCopies
// in another process sharing dir leaves it alone. (One that runs between
// the create and the flock removes it; the Map that follows then fails,
// and the load with it.)
func copyVerified(src string, f codec.File, whole int64, dir string, throttle *Throttle, pattern string) (_ *os.File, err error) {
	fh, err := openSection(src, whole)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	in := io.NewSectionReader(fh, f.Offset, f.Size)
	out, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, fmt.Errorf("loader: copying %s: %w", src, err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	if err := unix.Flock(int(out.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil, fmt.Errorf("loader: locking %s: %w", out.Name(), err)
	}
	tee := &teeReaderAt{r: in, w: out, throttle: throttle}
	sum, err := codec.VerifyStream(tee, f.Size)
	switch {
	case tee.werr != nil:
		return nil, fmt.Errorf("loader: copying %s to %s: %w", src, dir, tee.werr)
	case errors.Is(err, io.EOF):
		return nil, fmt.Errorf("loader: %s: %w: shrank while being copied", src, codec.ErrCorrupt)
	case err != nil:
		return nil, fmt.Errorf("loader: %s: %w", src, err)
	case sum != f.SHA256:
		return nil, fmt.Errorf("loader: %s%s: %w: SHA-256 does not match the manifest", src, section(f), codec.ErrCorrupt)
	}
	if err := out.Sync(); err != nil {
		return nil, fmt.Errorf("loader: syncing the copy of %s: %w", src, err)
	}
	return out, nil
}

// teeReaderAt writes everything read from r to the same offset of w, at
// throttle's pace. A write error is kept in werr and ends the reading.
type teeReaderAt struct {
	r        io.ReaderAt
	w        io.WriterAt
	throttle *Throttle
	werr     error
}

func (t *teeReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if err := t.throttle.wait(len(p)); err != nil {
		return 0, err
	}
	n, err := t.r.ReadAt(p, off)
	if n > 0 {
		if _, t.werr = t.w.WriteAt(p[:n], off); t.werr != nil {
			return n, t.werr
		}
	}
	return n, err
}

// RemoveCopies deletes the copies MapPartitionCopy left in dir when a
// process died mid-copy: regular files named like its copies that no
// process holds locked. Nothing else in dir is touched.
func RemoveCopies(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), copySuffix) {
			continue
		}
		if err := removeUnlocked(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("loader: removing leftover copies: %w", err)
	}
	return nil
}

// removeUnlocked removes the file at p unless another open file holds
// its lock: a copy being written.
func removeUnlocked(p string) error {
	fh, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil // its writer has just unlinked it
	}
	if err != nil {
		return err
	}
	defer fh.Close()
	if err := unix.Flock(int(fh.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return nil
	} else if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
