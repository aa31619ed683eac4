package loader

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/cumulus-serving/cumulus/codec"
)

// OpenRegular opens a file of the repository (or an operator's) for
// reading, refusing anything but a regular file: a named pipe would block
// the open (and the goroutine reading for every model) until someone
// writes to it, a device never end. The open does not block
// (O_NONBLOCK, which regular files ignore). A file that is not regular
// is refused with an error wrapping codec.ErrCorrupt: where a version
// has a file, it is damaged.
func OpenRegular(p string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("loader: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("loader: %w", err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("loader: %s: %w: not a regular file (%v)", p, codec.ErrCorrupt, st.Mode().Type())
	}
	return f, st, nil
}

// ReadRegular reads the regular file p, of at most limit bytes.
func ReadRegular(p string, limit int64) ([]byte, error) {
	f, st, err := OpenRegular(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st.Size() > limit {
		return nil, fmt.Errorf("loader: %s: %d bytes, over the limit of %d", p, st.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("loader: %s: %w", p, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("loader: %s: grew over the limit of %d bytes while read", p, limit)
	}
	return b, nil
}
