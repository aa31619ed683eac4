package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"

	"github.com/cumulus-serving/cumulus/router"
)

// An HTTP body is read into pooled chunks as its bytes arrive, each
// counted against reception before it is taken: memory follows the bytes
// received, never the length announced, and a body's buffers go back to
// the pool once it is decoded. The first chunk is small, so that a
// request's usual body and a slow sender's first bytes cost little.
const (
	firstChunk = 4 << 10
	chunkSize  = 64 << 10
)

var (
	firstChunks = sync.Pool{New: func() any { return new([firstChunk]byte) }}
	chunks      = sync.Pool{New: func() any { return new([chunkSize]byte) }}
)

// body is a request body in chunks: chunk i holds bytes
// [i·chunkSize − (chunkSize − firstChunk), …), the first firstChunk.
type body struct {
	first  *[firstChunk]byte
	chunks []*[chunkSize]byte
	n      int
}

// chunk returns chunk i's bytes, all of it.
func (b *body) chunk(i int) []byte {
	if i == 0 {
		return b.first[:]
	}
	return b.chunks[i-1][:]
}

// readBody reads r's whole body, at most limit bytes, charging x for
// each chunk before it is read into. A body past the limit, or shorter
// than announced, is InvalidArgument; one refused by a reception bound
// is errReceiving; a read cut by the connection's deadline is
// os.ErrDeadlineExceeded, for the caller to name.
func readBody(r *http.Request, limit int, x *receiving) (*body, error) {
	b := &body{}
	src := io.Reader(r.Body)
	if r.ContentLength < 0 {
		src = http.MaxBytesReader(nil, r.Body, int64(limit))
	}
	for {
		size := int64(chunkSize)
		if b.first == nil {
			size = firstChunk
		}
		if err := x.take(size); err != nil {
			b.free()
			return nil, err
		}
		if b.first == nil {
			b.first = firstChunks.Get().(*[firstChunk]byte)
		} else {
			b.chunks = append(b.chunks, chunks.Get().(*[chunkSize]byte))
		}
		buf := b.chunk(len(b.chunks))
		if r.ContentLength >= 0 { // within the limit (inferHTTP): exactly that
			buf = buf[:min(int64(len(buf)), r.ContentLength-int64(b.n))]
		}
		n, err := fill(src, buf)
		b.n += n
		switch {
		case r.ContentLength >= 0 && int64(b.n) == r.ContentLength:
			return b, nil
		case err == nil:
			continue
		case r.ContentLength < 0 && err == io.EOF:
			return b, nil
		case err == io.EOF: // before the announced length
			err = io.ErrUnexpectedEOF
		}
		got := b.n
		b.free()
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return nil, badInput("request body is over the limit of %d bytes", limit)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, errBodyCut{n: got}
		}
		return nil, badInput("reading the request body after %d bytes: %v", got, err)
	}
}

// fill reads into buf until it is full (nil), the body ends (io.EOF,
// with what it read), or reading fails. Unlike io.ReadFull, a body that
// ends is never confused with one cut off: net/http reports a chunked
// body whose connection ended before its last chunk as
// io.ErrUnexpectedEOF, and that stays an error.
func fill(src io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := src.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// free gives the chunks back to their pools.
func (b *body) free() {
	if b == nil {
		return
	}
	if b.first != nil {
		firstChunks.Put(b.first)
		b.first = nil
	}
	for _, c := range b.chunks {
		chunks.Put(c)
	}
	b.chunks, b.n = nil, 0
}

// section is a reader of the body's bytes [off, off+n).
func (b *body) section(off, n int) *bodyReader {
	return &bodyReader{b: b, off: off, end: off + n}
}

// bodyReader reads a section of a body, chunk by chunk.
type bodyReader struct {
	b        *body
	off, end int
}

func (r *bodyReader) Read(p []byte) (int, error) {
	if r.off >= r.end {
		return 0, io.EOF
	}
	i, at := 0, r.off
	if at >= firstChunk {
		i, at = 1+(at-firstChunk)/chunkSize, (at-firstChunk)%chunkSize
	}
	c := r.b.chunk(i)
	n := copy(p, c[at:min(len(c), at+r.end-r.off)])
	r.off += n
	return n, nil
}

// Len is the bytes left to read.
func (r *bodyReader) Len() int { return r.end - r.off }

// bodyOf is a body holding b, for tests and fuzzing.
func bodyOf(p []byte) *body {
	b := &body{first: new([firstChunk]byte)}
	b.n = copy(b.first[:], p)
	for rest := p[b.n:]; len(rest) > 0; {
		c := new([chunkSize]byte)
		k := copy(c[:], rest)
		b.chunks, b.n, rest = append(b.chunks, c), b.n+k, rest[k:]
	}
	return b
}

// errBodyCut is a body read cut off by the connection's read deadline,
// n of its bytes read.
type errBodyCut struct{ n int }

func (e errBodyCut) Error() string { return fmt.Sprintf("body cut off after %d bytes", e.n) }
func (e errBodyCut) Unwrap() error { return os.ErrDeadlineExceeded }

// errBodyDeadline is the error for a body cut off by the request's own
// deadline rather than its receive time.
func errBodyDeadline(cut errBodyCut) error {
	return fmt.Errorf("server: %w: the request body did not arrive within the request's time (%d of its bytes did)", router.ErrDeadlineExceeded, cut.n)
}
