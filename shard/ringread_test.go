package shard

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cumulus-serving/cumulus/model"
)

// TestRingGivesUp: reads through io_uring that never complete (from a
// pipe nobody writes) end when the caller gives up, the lookup
// returning at once with its context's error and calling no step
// after; once the reads do complete, their turns come back and the ring
// goes back to the pool to be lent again.
func TestRingGivesUp(t *testing.T) {
	p, err := rings()
	if err != nil {
		t.Skipf("the kernel refuses io_uring here: %v", err)
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	defer wr.Close()
	r := NewColdReads(4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// The caller gives up once the 4 reads its turns allow are in
		// flight (or after 10s, failing the test below).
		deadline := time.Now().Add(10 * time.Second)
		for len(r.slots) < 4 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	returned := make(chan struct{})
	stepped := 0
	err = p.readAll(ctx, r, func(int) *os.File { return rd }, 10, func(i int, data []byte) (int64, int, error) {
		select {
		case <-returned:
			t.Errorf("step %d called after readAll returned", i)
		default:
		}
		if data == nil {
			stepped++
			return 0, 8, nil
		}
		return 0, 0, nil
	})
	close(returned)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("readAll: %v, want Canceled", err)
	}
	if stepped != 4 || len(r.slots) != 4 {
		t.Fatalf("%d items begun, %d turns held: want 4 and 4 (the turns bound the reads in flight)", stepped, len(r.slots))
	}
	p.mu.Lock()
	idle := len(p.idle)
	p.mu.Unlock()
	// The 4 reads complete: their turns are given back and the ring is
	// lent again.
	if _, err := wr.Write(make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		back := len(p.idle) > idle
		p.mu.Unlock()
		if back && len(r.slots) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the reads completed: %d turns still held, ring back in the pool: %v", len(r.slots), back)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkDiskReads: 4 KiB reads at random places in a 1 GiB file, the
// page cache dropped before each batch of 4,096 (fadvise), 64 in flight:
// through io_uring, and with a goroutine in pread each. Reports reads a
// second. go test ./shard -run XXX -bench DiskReads
func BenchmarkDiskReads(b *testing.B) {
	const size, batch, page = 1 << 30, 4096, 4096
	f, err := os.Create(filepath.Join(b.TempDir(), "data"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	for off := int64(0); off < size; off += int64(len(chunk)) {
		if _, err := f.WriteAt(chunk, off); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	offs := make([]int64, batch)
	for _, r := range diskReaders(b, coldReaders) {
		b.Run(r.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				for i := range offs {
					offs[i] = rng.Int64N(size/page) * page
				}
				if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				err := readAll(context.Background(), r.r, f, batch, func(i int, data []byte) (int64, int, error) {
					if data == nil {
						return offs[i], page, nil
					}
					return 0, 0, nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "reads/s")
		})
	}
}

// TestRingEnds: a lookup whose context has already ended reads nothing
// and holds no turn; unsubmitted reads are taken back from the ring
// whole; a read past the end of its file fails with io.EOF, as pread's
// does, and one within it reads what is there.
func TestRingEnds(t *testing.T) {
	p, err := rings()
	if err != nil {
		t.Skipf("the kernel refuses io_uring here: %v", err)
	}
	path := filepath.Join(t.TempDir(), "f")
	data := make([]byte, 100)
	for i := range data {
		data[i] = byte(i)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := NewColdReads(4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = p.readAll(ctx, r, func(int) *os.File { return f }, 10, func(i int, data []byte) (int64, int, error) {
		t.Errorf("step %d called with an ended context", i)
		return 0, 0, nil
	})
	if !errors.Is(err, context.Canceled) || len(r.slots) != 0 {
		t.Fatalf("an ended context: %v, %d turns held; want Canceled and none", err, len(r.slots))
	}

	rg, err := newRing(8)
	if err != nil {
		t.Fatal(err)
	}
	defer rg.close()
	for range 3 {
		rg.prep(int(f.Fd()), 0, 8)
	}
	if n := rg.unprep(); n != 3 || rg.inflight != 0 || len(rg.free) != rg.entries {
		t.Fatalf("unprep: %d taken back, %d in flight, %d of %d entries free", n, rg.inflight, len(rg.free), rg.entries)
	}
	e := rg.prep(int(f.Fd()), 10, 4)
	for rg.inflight > 0 {
		if err := rg.enter(time.Second); err != nil {
			t.Fatal(err)
		}
		rg.reap(func(got int, res int32) {
			if got != e || res != 4 || rg.bufs[e][0] != 10 {
				t.Errorf("after unprep: entry %d read %d bytes (%v), want entry %d: 4 bytes from 10", got, res, rg.bufs[got][:4], e)
			}
		})
	}

	for _, tc := range []struct {
		off  int64
		n    int
		want error
	}{{80, 20, nil}, {80, 64, io.EOF}, {200, 8, io.EOF}} {
		var got []byte
		err := p.readAll(context.Background(), r, func(int) *os.File { return f }, 1, func(i int, data []byte) (int64, int, error) {
			if data == nil {
				return tc.off, tc.n, nil
			}
			got = append(got, data...)
			return 0, 0, nil
		})
		if !errors.Is(err, tc.want) || err == nil && !bytes.Equal(got, data[tc.off:tc.off+int64(tc.n)]) {
			t.Errorf("%d bytes at %d of 100: %v (%v), want %v", tc.n, tc.off, err, got, tc.want)
		}
	}
	if len(r.slots) != 0 {
		t.Errorf("%d turns held after the reads", len(r.slots))
	}
}

// BenchmarkReadSpans: warming's reads (readSpans) of 16,384 of a
// table's 200,000 keys, its file in the page cache, through io_uring and
// with preads. go test ./shard -run XXX -bench ReadSpans
func BenchmarkReadSpans(b *testing.B) {
	tb, _, _ := diskTable(b, model.Shape{Type: model.LR}, "")
	rng := rand.New(rand.NewPCG(5, 6))
	keys := make([]uint64, 16384)
	for j := range keys {
		k := rng.Uint64N(200000)
		keys[j] = k*k + k
	}
	out := make([]int32, len(keys))
	vals := make([]byte, len(keys)*tb.vlen)
	for _, r := range diskReaders(b, coldReaders) {
		b.Run(r.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := tb.readSpans(context.Background(), keys, out, vals, r.r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
