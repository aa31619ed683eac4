package raftgroup

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogger is an hclog.Logger (what hashicorp/raft logs through) that
// writes to slog, so that raft's lines take the process's format, level
// and rate limit (internal/lograte): a member that is down makes the
// leader log a failed heartbeat every few milliseconds.
func hclogger(name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: name, Output: slogWriter{}, JSONFormat: true,
		Level: hclog.Info, DisableTime: true})
}

// slogWriter takes hclog's JSON lines and logs each through slog.
type slogWriter struct{}

func (slogWriter) Write(p []byte) (int, error) {
	for line := range bytes.Lines(p) {
		var fields map[string]any
		if json.Unmarshal(line, &fields) != nil {
			slog.Info(string(bytes.TrimSpace(line)))
			continue
		}
		msg, _ := fields["@message"].(string)
		var level slog.Level
		switch fields["@level"] {
		case "trace", "debug":
			level = slog.LevelDebug
		case "warn":
			level = slog.LevelWarn
		case "error":
			level = slog.LevelError
		}
		attrs := make([]any, 0, 2*len(fields))
		for k, v := range fields {
			switch k {
			case "@message", "@level", "@timestamp", "@module":
				continue
			}
			attrs = append(attrs, k, v)
		}
		if mod, ok := fields["@module"].(string); ok {
			msg = mod + ": " + msg
		}
		slog.Log(context.Background(), level, msg, attrs...)
	}
	return len(p), nil
}
