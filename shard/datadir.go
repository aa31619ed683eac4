package shard

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
)

// The data directory holds the shard's own copies of the partitions it
// serves mapped. A mapping of a repository file would show every later
// write to that file and raise SIGBUS past a truncation; a copy nobody
// else writes cannot change under the shard. Copies are unlinked as soon
// as they are mapped (loader.MapPartitionCopy), so the directory is empty
// while the shard runs; only a crash mid-copy leaves files in it.

// defaultDataDir is Options.DataDir's default: one per cluster and
// shard ID, so shards of two clusters on one host never share one.
func defaultDataDir(cluster topo.Cluster, id string) string {
	return filepath.Join(os.TempDir(), "cumulus-shard-"+string(cluster.OrDefault())+"-"+url.PathEscape(id))
}

// prepareDataDir creates dir and removes copies a previous run left in
// it.
func prepareDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("shard: data dir: %w", err)
	}
	if err := loader.RemoveCopies(dir); err != nil {
		return fmt.Errorf("shard: data dir %s: %w", dir, err)
	}
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC {
		slog.Warn("shard: the data dir is on tmpfs: partitions served mapped occupy memory there, outside the memory budget; set a data dir on disk",
			"dir", dir)
	}
	return nil
}

// mapCopy maps partition p from the shard's own copy of its file, in
// the process's load turn.
func (s *Shard) mapCopy(m *codec.Manifest, p uint32) (*codec.Partition, error) {
	done, err := s.turn(s.ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return s.opts.Repo.MapPartitionCopy(m, p, s.opts.DataDir)
}

// readPartition reads partition p into resident memory, in the
// process's load turn.
func (s *Shard) readPartition(m *codec.Manifest, p uint32) (*codec.Partition, error) {
	done, err := s.turn(s.ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return s.opts.Repo.ReadPartition(m, p)
}

// turn waits for the process's turn to load a partition
// (Options.LoadTurn) and returns its end; or fails once the shard
// closes (a closing shard does not wait for another's load) or ctx
// ends.
func (s *Shard) turn(ctx context.Context) (done func(), err error) {
	if s.opts.LoadTurn == nil {
		return func() {}, nil
	}
	select {
	case s.opts.LoadTurn <- struct{}{}:
		return func() { <-s.opts.LoadTurn }, nil
	case <-s.ctx.Done():
	case <-ctx.Done():
	}
	// Closing is said as such whichever case was taken: the loads pass
	// the shard's own context, and both are ready then.
	if s.ctx.Err() != nil {
		return nil, fmt.Errorf("shard %s: closing", s.opts.ID)
	}
	return nil, ctx.Err()
}
