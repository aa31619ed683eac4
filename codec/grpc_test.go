package codec

import (
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// TestFrameBuffers: a buffer from GetFrameBuffer holds what was asked,
// empty; one given back through the codec's pool is filed by its
// capacity and handed out again for any size it holds, never for one it
// does not.
func TestFrameBuffers(t *testing.T) {
	for _, n := range []int{0, 1, 1 << 16, 1<<16 + 1, 3 << 20, 1 << 26, 1<<26 + 1} {
		b := GetFrameBuffer(n)
		if len(b) != 0 || cap(b) < n {
			t.Errorf("GetFrameBuffer(%d): len %d, cap %d", n, len(b), cap(b))
		}
	}
	c := encoding.GetCodecV2(GRPCCodecName)
	if c == nil {
		t.Fatal("no codec registered")
	}
	// A marshalled pooled frame carries its bytes; freeing it (as the
	// transport does once written) returns the buffer to the pool.
	b := append(GetFrameBuffer(300<<10), "response"...)
	out, err := c.Marshal(&PooledFrame{B: b})
	if err != nil || string(out.Materialize()) != "response" {
		t.Fatalf("marshalled %q, %v", out.Materialize(), err)
	}
	out.Free()
	// Asked for 300 KiB, it got 512 KiB: it may serve 512 KiB, never 600.
	// sync.Pool may drop what it holds, so only what comes back is
	// checked.
	for range 100 {
		if got := GetFrameBuffer(512 << 10); cap(got) < 512<<10 {
			t.Fatalf("GetFrameBuffer(512 KiB) has cap %d", cap(got))
		}
		if got := GetFrameBuffer(600 << 10); cap(got) < 600<<10 {
			t.Fatalf("GetFrameBuffer(600 KiB) has cap %d", cap(got))
		}
	}
	// A part of a buffer, less a header, is filed in the buffer's class
	// (sync.Pool keeps most of what one goroutine puts for its next get).
	reused := false
	for range 100 {
		b := GetFrameBuffer(1 << 20)[:1<<20]
		PutFrameBuffer(b[40:])
		got := GetFrameBuffer(1 << 20)
		if cap(got) < 1<<20 {
			t.Fatalf("GetFrameBuffer(1 MiB) has cap %d", cap(got))
		}
		reused = reused || cap(got) == cap(b)-40
	}
	if !reused {
		t.Error("a part of a buffer never came back for a buffer of its class")
	}
	// A reply received, its body given back round after round, keeps its
	// whole buffer: the frame, not the body, goes back to the pool.
	msg := AppendMuxReply(nil, 7, 0, make([]byte, 600<<10))
	caps := map[int]int{}
	for range 50 {
		var f Frame
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg)}, &f); err != nil {
			t.Fatal(err)
		}
		_, _, body, err := ParseMuxReply(f)
		if err != nil || len(body) != 600<<10 {
			t.Fatalf("parsed %d bytes, %v", len(body), err)
		}
		caps[cap(f)]++
		PutReplyBody(body)
	}
	if len(caps) != 1 || caps[1<<20+frameSlack] == 0 {
		t.Errorf("the frames received had capacities %v, want all %d", caps, 1<<20+frameSlack)
	}
	// Plain frames and a message of another type.
	plain, err := c.Marshal(&Frame{1, 2})
	if err != nil || len(plain.Materialize()) != 2 {
		t.Fatalf("Frame: %v, %v", plain, err)
	}
	if _, err := c.Marshal(new(int)); err == nil {
		t.Fatal("marshalled an int")
	}
	var f Frame
	if err := c.Unmarshal(plain, &f); err != nil || len(f) != 2 {
		t.Fatalf("unmarshalled %v, %v", f, err)
	}
}
