package server

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"golang.org/x/net/http2"
)

// h2events feeds b to a fresh h2frames in pieces of the sizes cuts gives
// (the rest whole), and lists what it saw.
func h2events(b []byte, cuts func() int) []string {
	f := h2frames{preface: len(h2ClientPrface)}
	var ev []string
	var data map[uint32]int = map[uint32]int{}
	header := func(typ, flags byte, stream uint32, length int) error {
		ev = append(ev, fmt.Sprintf("header %d %d %d %d", typ, flags, stream, length))
		return nil
	}
	payload := func(stream uint32, n int) error { data[stream] += n; return nil }
	end := func(typ, flags byte, stream uint32) error {
		ev = append(ev, fmt.Sprintf("end %d %d %d data %d", typ, flags, stream, data[stream]))
		return nil
	}
	for len(b) > 0 {
		k := min(len(b), max(1, cuts()))
		if err := f.feed(b[:k], header, payload, end); err != nil {
			ev = append(ev, "error "+err.Error())
			return ev
		}
		b = b[k:]
	}
	return ev
}

// h2sample is a client's connection start: the preface, SETTINGS, two
// streams' HEADERS and DATA (one padded, one ended), a PING and a reset.
func h2sample(t testing.TB) []byte {
	var buf bytes.Buffer
	buf.WriteString(h2ClientPrface)
	fr := http2.NewFramer(&buf, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("hdrs"), EndHeaders: true})
	fr.WriteData(1, false, bytes.Repeat([]byte{7}, 20000))
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte("hdrs"), EndHeaders: true})
	fr.WriteDataPadded(3, true, bytes.Repeat([]byte{1}, 300), make([]byte, 17))
	fr.WritePing(false, [8]byte{1})
	fr.WriteRSTStream(1, http2.ErrCodeCancel)
	return buf.Bytes()
}

// TestH2FramesAnySplit: h2frames sees the same frames however the bytes
// are cut into reads.
func TestH2FramesAnySplit(t *testing.T) {
	b := h2sample(t)
	whole := h2events(b, func() int { return len(b) })
	if len(whole) != 14 || whole[len(whole)-1] != "end 3 0 1 data 20000" {
		t.Fatalf("whole: %q", whole)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		got := h2events(b, func() int { return rng.IntN(40) })
		if fmt.Sprint(got) != fmt.Sprint(whole) {
			t.Fatalf("split %d: %q, want %q", i, got, whole)
		}
	}
}

// FuzzH2Frames: any bytes, cut anywhere, give the events they give
// whole, without a panic.
func FuzzH2Frames(f *testing.F) {
	f.Add(h2sample(f), uint64(1))
	f.Add([]byte(h2ClientPrface+"\xff\xff\xff\x00\x01\x00\x00\x00\x01"), uint64(2))
	f.Add([]byte{}, uint64(3))
	f.Fuzz(func(t *testing.T, b []byte, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 0))
		if got, want := h2events(b, func() int { return rng.IntN(64) }), h2events(b, func() int { return len(b) }); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("cut: %q, whole: %q", got, want)
		}
	})
}
