package server

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
)

// TestBodySections: any section of a body in chunks reads as the same
// bytes of the whole, across the first chunk's end and the others'.
func TestBodySections(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	whole := make([]byte, firstChunk+3*chunkSize+123)
	for i := range whole {
		whole[i] = byte(rng.Uint32())
	}
	b := bodyOf(whole)
	if b.n != len(whole) {
		t.Fatalf("body of %d bytes holds %d", len(whole), b.n)
	}
	offsets := []int{0, 1, firstChunk - 1, firstChunk, firstChunk + 1, firstChunk + chunkSize - 3, len(whole) - 1, len(whole)}
	for range 50 {
		offsets = append(offsets, rng.IntN(len(whole)+1))
	}
	for _, off := range offsets {
		n := rng.IntN(len(whole) - off + 1)
		got, err := io.ReadAll(b.section(off, n))
		if err != nil || !bytes.Equal(got, whole[off:off+n]) {
			t.Fatalf("section [%d, %d): %d bytes, %v; differs from the whole", off, off+n, len(got), err)
		}
	}
}

// TestReadBody: a body read from a request, of known or unknown length,
// holds what was sent, and is charged in reception by the chunks it
// fills; a body past the limit, or shorter than announced, is refused.
func TestReadBody(t *testing.T) {
	r := newReception(&Options{MaxReceivingBytes: 1 << 30, MaxReceivingPerPeer: 1 << 30})
	sent := strings.Repeat("0123456789", 10_000) // 100,000 bytes: the first chunk and two more
	for _, length := range []int64{int64(len(sent)), -1} {
		req, _ := http.NewRequest("POST", "/", strings.NewReader(sent))
		req.ContentLength = length
		x, _ := r.begin("127.0.0.1:1", receiveOverhead)
		b, err := readBody(req, len(sent), x)
		if err != nil {
			t.Fatalf("length %d: %v", length, err)
		}
		got, _ := io.ReadAll(b.section(0, b.n))
		if string(got) != sent {
			t.Errorf("length %d: read %d bytes, not what was sent", length, len(got))
		}
		want := int64(receiveOverhead + firstChunk + 2*chunkSize)
		if x.n != want || r.bytes() != want {
			t.Errorf("length %d: charged %d (reception %d), want %d", length, x.n, r.bytes(), want)
		}
		b.free()
		x.done()
		if r.bytes() != 0 || len(r.peers) != 0 {
			t.Errorf("length %d: after done, reception holds %d bytes, %d peers", length, r.bytes(), len(r.peers))
		}
	}
	req, _ := http.NewRequest("POST", "/", strings.NewReader(sent))
	req.ContentLength = -1
	x, _ := r.begin("127.0.0.1:1", receiveOverhead)
	if _, err := readBody(req, 1000, x); err == nil || !strings.Contains(err.Error(), "over the limit of 1000 bytes") {
		t.Errorf("unknown length past the limit: %v", err)
	}
	x.done()
	req, _ = http.NewRequest("POST", "/", strings.NewReader(sent[:10]))
	req.ContentLength = 20
	x, _ = r.begin("127.0.0.1:1", receiveOverhead)
	if _, err := readBody(req, 1000, x); err == nil || !strings.Contains(err.Error(), "after 10 bytes") {
		t.Errorf("10 bytes of 20 announced: %v", err)
	}
	x.done()
	if r.bytes() != 0 {
		t.Errorf("after refusals, reception holds %d bytes", r.bytes())
	}
}

// TestReceptionBounds: a request is refused by the per-address bound
// before the total one, by the total one across addresses, and what is
// given back can be taken again.
func TestReceptionBounds(t *testing.T) {
	r := newReception(&Options{MaxReceivingBytes: 100, MaxReceivingPerPeer: 60})
	a, err := r.begin("10.0.0.1:5", 50)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.begin("10.0.0.1:6", 20); err != (errReceiving{"peer"}) {
		t.Errorf("70 from one address, bound 60: %v", err)
	}
	b, err := r.begin("10.0.0.2:5", 40)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.begin("10.0.0.3:5", 20); err != (errReceiving{"receiving"}) {
		t.Errorf("110 in all, bound 100: %v", err)
	}
	a.done()
	a.done() // once only
	if c, err := r.begin("[::1]:7", 60); err != nil {
		t.Errorf("60 after 50 given back: %v", err)
	} else {
		c.done()
	}
	b.done()
	if r.bytes() != 0 || len(r.peers) != 0 {
		t.Errorf("reception holds %d bytes, %d addresses", r.bytes(), len(r.peers))
	}
}
