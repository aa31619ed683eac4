package manager

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/loader"
)

// Prune removes the directories of model's versions that nothing served,
// staged, pinned or kept for rollback needs, keeping the keep newest of
// them (OpPrune), and returns the versions removed. It is audited like
// every admin call.
func (m *Manager) Prune(ctx context.Context, model string, keep int, from string) ([]uint64, *State, error) {
	r, err := m.do(ctx, Command{Op: OpPrune, Model: model, Keep: keep, At: time.Now().UTC(), From: from})
	return r.removed, r.st, err
}

// listForPrune fills c's listing of the model's versions and whether the
// repository can be written.
func (m *Manager) listForPrune(c *Command) {
	c.Listed, c.ReadOnly = nil, ""
	if vs, err := m.opts.Repo.Versions(c.Model); err == nil {
		c.Listed = vs
	}
	c.ReadOnly = writable(filepath.Join(m.opts.Repo.Dir, c.Model))
}

// writable tries to create a file in dir and says why it cannot ("" when
// it can), the same words each time (for logging once).
func writable(dir string) string {
	f, err := os.CreateTemp(dir, ".cumulus-write-check-")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return dir + ": " + pe.Err.Error()
		}
		return err.Error()
	}
	f.Close()
	os.Remove(f.Name())
	return ""
}

// carryOut does what a persisted decision asks besides validation:
// removes pruned directories, and after a commit prunes (AutoPrune) and
// compacts (CompactAfter) the model.
func (m *Manager) carryOut(ctx context.Context, cur, next *State, acts []Action) {
	for _, a := range acts {
		r, ok := a.(Remove)
		if !ok {
			continue
		}
		var removed []uint64
		for _, v := range r.Versions {
			if err := m.removeVersion(m.opts.Repo.VersionDir(r.Model, v)); err != nil {
				slog.Error("manager: pruning", "model", r.Model, "version", v, "err", err)
				continue
			}
			removed = append(removed, v)
		}
		m.removed = removed
		slog.Info("manager: pruned", "model", r.Model, "removed", removed)
		m.Rescan() // the state drops what left
	}
	for name, nm := range next.Models {
		om := cur.Models[name]
		if nm == om || om == nil || nm.Live == om.Live || nm.Live == 0 {
			continue
		}
		if m.opts.AutoPrune > 0 {
			m.autoPrune(ctx, nm)
		}
		m.maybeCompact(nm)
	}
}

// autoPrune prunes ms after a commit (--auto-prune) when there is
// something to remove: only then is it a call of its own in the audit
// log. A repository it cannot write to is logged once.
func (m *Manager) autoPrune(ctx context.Context, ms *ModelState) {
	c := Command{Op: OpPrune, Model: ms.Name, Keep: m.opts.AutoPrune, At: time.Now().UTC(), From: "auto-prune"}
	m.listForPrune(&c)
	if c.ReadOnly != "" {
		if m.noPrune != c.ReadOnly {
			slog.Warn("manager: cannot auto-prune: the repository is not writable", "model", ms.Name, "err", c.ReadOnly)
		}
		m.noPrune = c.ReadOnly
		return
	}
	m.noPrune = ""
	if acts, err := ms.prune(c); err != nil || len(acts) == 0 {
		return
	}
	if err := m.apply(ctx, c); err != nil {
		slog.Warn("manager: auto-prune", "model", ms.Name, "err", err)
	}
}

// Compacting reports whether the manager is compacting a chain of model.
func (m *Manager) Compacting(model string) bool {
	_, ok := m.compacting.Load(model)
	return ok
}

// pruningPrefix starts the name a pruned version directory is renamed to
// while it is deleted.
const pruningPrefix = ".pruning-"

// removeVersion removes a version directory: renamed at once, so that the
// version leaves the listing whole, then deleted in the background (a
// large version's files must not hold up the loop).
func (m *Manager) removeVersion(dir string) error {
	gone := filepath.Join(filepath.Dir(dir), pruningPrefix+filepath.Base(dir)+"-"+rand.Text()[:6])
	if err := os.Rename(dir, gone); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	m.done.Add(1)
	go func() {
		defer m.done.Done()
		if err := os.RemoveAll(gone); err != nil {
			slog.Error("manager: deleting a pruned version's files", "dir", gone, "err", err)
		}
	}()
	return nil
}

// removeLeftovers deletes what pruning left when a manager stopped
// mid-delete, and versions a writer left half-written (hidden
// directories untouched for a day: no writer takes that long).
func removeLeftovers(repo string) {
	left, _ := filepath.Glob(filepath.Join(repo, "*", pruningPrefix+"*"))
	half, _ := filepath.Glob(filepath.Join(repo, "*", ".writing-*"))
	for _, dir := range half {
		if st, err := os.Stat(dir); err == nil && st.IsDir() && time.Since(st.ModTime()) > 24*time.Hour {
			left = append(left, dir)
		}
	}
	for _, dir := range left {
		if err := os.RemoveAll(dir); err != nil {
			slog.Warn("manager: deleting what an interrupted prune left", "dir", dir, "err", err)
		}
	}
}

// deltasSmall says whether a chain's deltas are small beside its full
// version: at most a quarter of its bytes. Why a quarter: a merged
// delta is read with its full version by every shard that loads a
// partition afresh, and held in the shards' overlays; past a quarter of
// the model, rewriting the model once is the cheaper.
func deltasSmall(chain []*codec.Manifest) bool {
	var deltas, full int64
	for _, m := range chain {
		var n int64
		for _, f := range m.Files {
			n += f.Size
		}
		if m.Kind == codec.KindFull {
			full += n
		} else {
			deltas += n
		}
	}
	return 4*deltas <= full
}

// maybeCompact compacts model m's live chain in the background once it
// has CompactAfter deltas (deltas published on it meanwhile are copied
// onto the compaction): into one delta on the chain's full version while
// the deltas are small beside it (deltasSmall; loader.Repo.CompactDeltas:
// under a stream of pushes, a delta a second, a compaction costs what
// the stream changed), else into a full version (loader.Repo.Compact).
func (m *Manager) maybeCompact(ms *ModelState) {
	lv := ms.version(ms.Live)
	if m.opts.CompactAfter <= 0 || lv == nil || lv.Info == nil || len(lv.Info.Chain)-1 < m.opts.CompactAfter {
		return
	}
	if why := writable(filepath.Join(m.opts.Repo.Dir, ms.Name)); why != "" {
		if m.noCompact != why {
			slog.Warn("manager: cannot compact: the repository is not writable; compact with 'cumulus model compact'", "model", ms.Name, "deltas", len(lv.Info.Chain)-1, "err", why)
		}
		m.noCompact = why
		return
	}
	m.noCompact = ""
	if _, busy := m.compacting.LoadOrStore(ms.Name, true); busy {
		return
	}
	m.done.Add(1)
	go func() {
		defer m.done.Done()
		defer m.compacting.Delete(ms.Name)
		start := time.Now()
		compact, how := m.opts.Repo.Compact, "full"
		if chain, err := m.opts.Repo.Chain(ms.Name, ms.Live); err == nil && len(chain) > 2 && deltasSmall(chain) {
			compact, how = m.opts.Repo.CompactDeltas, "deltas"
		}
		out, err := compact(ms.Name, ms.Live)
		switch {
		case errors.Is(err, loader.ErrSuperseded):
			m.metrics.compactions.WithLabelValues("superseded").Inc()
			slog.Info("manager: compaction not published: a version off the compacted chain came first", "model", ms.Name, "version", ms.Live, "err", err)
			return
		case err != nil:
			m.metrics.compactions.WithLabelValues("failed").Inc()
			slog.Warn("manager: compaction", "model", ms.Name, "version", ms.Live, "err", err)
			return
		}
		m.metrics.compactions.WithLabelValues("ok").Inc()
		slog.Info("manager: compacted", "model", ms.Name, "chain", fmt.Sprintf("%d deltas", len(lv.Info.Chain)-1), "into", out.Version, "as", how, "took", time.Since(start).Round(time.Millisecond))
		m.Rescan()
	}()
}
