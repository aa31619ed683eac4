package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/prometheus/procfs"
)

// ReadRSS is process pid's resident memory in bytes, VmRSS of
// /proc/PID/status, read with Prometheus' procfs: Linux only.
func ReadRSS(pid int) (int64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	if st.VmRSS == 0 {
		return 0, fmt.Errorf("bench: no VmRSS in process %d's status (a kernel thread?)", pid)
	}
	return int64(st.VmRSS), nil
}

// RSS is a process's resident memory around a load run, in bytes. A
// figure of 0 was not measured: Err says why.
type RSS struct {
	PID                 int
	Before, Peak, After int64
	Samples             int           // reads while the load ran
	Settle              time.Duration // after the load, before After was read
	Err                 error         // the first failed read; no figure is made up for it
}

// WatchRSS reads pid's resident memory just before calling load, every
// interval while load runs (Peak is the largest of these reads), and once
// more settle after load returns. It owns one sampling goroutine and
// stops it when load returns. If ctx ends during settle, After is not
// read.
func WatchRSS(ctx context.Context, pid int, every, settle time.Duration, load func()) RSS {
	r := RSS{PID: pid, Settle: settle}
	if r.Before, r.Err = ReadRSS(pid); r.Err != nil {
		load()
		return r
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			rss, err := ReadRSS(pid)
			if err != nil {
				r.Err = err
				return
			}
			r.Peak = max(r.Peak, rss)
			r.Samples++
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	load()
	close(stop)
	wg.Wait()
	if r.Err != nil {
		return r
	}
	t := time.NewTimer(settle)
	defer t.Stop()
	select {
	case <-ctx.Done():
		r.Err = fmt.Errorf("bench: settle cut short: %w", ctx.Err())
		return r
	case <-t.C:
	}
	r.After, r.Err = ReadRSS(pid)
	return r
}

// Print writes one line: the figures and their ratios to Before, or why
// there are none.
func (r RSS) Print(w io.Writer, workload string) {
	if r.Before == 0 {
		fmt.Fprintf(w, "%-8s rss pid=%d: not measured: %v\n", workload, r.PID, r.Err)
		return
	}
	mib := func(b int64) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fMiB (%.2fx)", float64(b)/(1<<20), float64(b)/float64(r.Before))
	}
	fmt.Fprintf(w, "%-8s rss pid=%d: rss_before=%.1fMiB rss_peak=%s rss_after=%s after settle=%s, %d samples during load\n",
		workload, r.PID, float64(r.Before)/(1<<20), mib(r.Peak), mib(r.After), r.Settle, r.Samples)
	if r.Err != nil {
		fmt.Fprintf(w, "%-8s rss: sampling stopped: %v\n", workload, r.Err)
	}
}
