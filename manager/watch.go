package manager

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
)

// watchRepo asks for a scan whenever the repository's listing changes: a
// model directory appears, a version is published (renamed into its
// model's directory) or a version directory is removed. It watches the
// repository's directory and each model's (inotify on Linux, through
// fsnotify); files changing inside a version directory are left to the
// periodic scan, which also stays the fallback for what a watch cannot
// see: a network filesystem reports no changes made on other hosts, and
// a watch that overflows loses events (a scan follows at once).
func (m *Manager) watchRepo(ctx context.Context) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		slog.Warn("manager: cannot watch the repository; finding versions by scanning only", "every", m.opts.ScanInterval, "err", err)
		return
	}
	defer w.Close()
	root := filepath.Clean(m.opts.Repo.Dir)
	if err := w.Add(root); err != nil {
		slog.Warn("manager: cannot watch the repository; finding versions by scanning only", "every", m.opts.ScanInterval, "err", err)
		return
	}
	watchModel := func(dir string) {
		if err := w.Add(dir); err != nil {
			slog.Warn("manager: cannot watch a model directory; its versions are found by scanning", "dir", dir, "every", m.opts.ScanInterval, "err", err)
		}
	}
	names, _ := m.opts.Repo.Models()
	for _, name := range names {
		watchModel(filepath.Join(root, name))
	}
	m.Rescan() // what appeared before the watch began
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if strings.HasPrefix(filepath.Base(ev.Name), ".") {
				// Never a model or a version: a writer's lock, high-water
				// mark or unpublished directory, a prune under way, the
				// manager's own write check (which would rescan after
				// every commit).
				continue
			}
			if ev.Has(fsnotify.Create) && filepath.Dir(ev.Name) == root {
				watchModel(ev.Name) // a new model (a file fails harmlessly)
			}
			m.newVersions()
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			slog.Warn("manager: watching the repository; scanning", "err", err)
			m.Rescan()
		}
	}
}
