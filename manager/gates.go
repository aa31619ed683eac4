package manager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// The staged gates run on their own goroutine, one version at a time,
// off the main loop: a validator may take a minute.

// runGates runs the gates RunGates actions ask for (the loop queues them
// without waiting), one version at a time, and posts their outcomes.
func (m *Manager) runGates(ctx context.Context) {
	m.gr.ctx = ctx
	defer m.gr.close()
	for {
		var g RunGates
		select {
		case <-ctx.Done():
			return
		case g = <-m.gates:
		}
		ev := GatesChecked{Model: g.Model, Version: g.Version}
		pause := time.Duration(0)
		for _, gate := range g.Gates {
			res := m.runGate(ctx, gate, g)
			if res.Outcome == outcomeError {
				// Asked again as soon as it is posted: not in a loop.
				pause = m.opts.GateRetry
			}
			ev.Results = append(ev.Results, res)
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return
		}
		select {
		case m.results <- ev:
		case <-ctx.Done():
			return
		}
	}
}

// runGate runs one staged gate on version g.
func (m *Manager) runGate(ctx context.Context, gate string, g RunGates) GateResult {
	res, start := GateResult{Gate: gate, Outcome: "passed"}, time.Now()
	switch gate {
	case GateValidator:
		if reason := m.runValidator(ctx, m.opts.Repo.VersionDir(g.Model, g.Version)); reason != "" {
			res.Outcome, res.Reason = "failed", reason
		}
	case GateGolden, GateHoldout:
		gctx, cancel := context.WithTimeout(ctx, m.opts.GateTimeout)
		outcome, reason := m.runServedGate(gctx, gate, g)
		cancel()
		res.Outcome, res.Reason = outcome, reason
	default:
		res.Outcome, res.Reason = "failed", fmt.Sprintf("this manager has no gate %q", gate)
	}
	res.At = time.Now().UTC()
	res.Took = res.At.Sub(start)
	return res
}

// runValidator runs the operator's validator, without a shell, with the
// version's directory as its argument, under ValidatorTimeout. It
// returns "" when it exits 0, else the reason: its last line on stderr,
// or how it ended.
func (m *Manager) runValidator(ctx context.Context, dir string) string {
	ctx, cancel := context.WithTimeout(ctx, m.opts.ValidatorTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.opts.Validator, dir)
	// The validator runs in a process group of its own: past the timeout
	// the whole group is killed, children it started included, and
	// children left holding its stderr are not waited for long. Once it
	// exits, what it left running is killed too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var stderr tailBuffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err == nil {
		return ""
	}
	last := stderr.lastLine()
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Sprintf("the validator did not finish within %v", m.opts.ValidatorTimeout)
	case last != "":
		return last
	}
	return fmt.Sprintf("the validator failed: %v", err)
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) lastLine() string {
	lines := strings.Split(strings.TrimSpace(string(bytes.ToValidUTF8(t.b, []byte("?")))), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
