package loader

import (
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
)

// ManifestCache keeps manifests as parsed while their file stays the
// same (size, modification time, inode): a shard or manager that takes in
// a delta a second reads the manifests of its chain (up to --compact-after
// of them, a full version's alone 200 KB at 1,024 partitions) once each,
// not once per delta. A manifest it hands out is shared: callers do not
// change it. Safe for concurrent use; it holds at most
// maxCachedManifests (then starts afresh).
type ManifestCache struct {
	mu sync.Mutex
	m  map[string]cachedManifest
}

type cachedManifest struct {
	size  int64
	mtime time.Time
	ino   uint64
	m     *codec.Manifest
}

// maxCachedManifests bounds a ManifestCache.
const maxCachedManifests = 4096

// NewManifestCache returns an empty cache.
func NewManifestCache() *ManifestCache { return &ManifestCache{m: map[string]cachedManifest{}} }

func fileKey(st os.FileInfo) (ino uint64) {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Ino
	}
	return 0
}

// get returns the manifest cached for path if its file is as it was,
// and the file's state now (for put, when it is not: nil without a
// cache, or without a regular file).
func (c *ManifestCache) get(path string) (*codec.Manifest, os.FileInfo) {
	if c == nil {
		return nil, nil
	}
	st, err := os.Lstat(path)
	if err != nil || !st.Mode().IsRegular() {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[path]
	if !ok || e.size != st.Size() || !e.mtime.Equal(st.ModTime()) || e.ino != fileKey(st) {
		return nil, st
	}
	return e.m, st
}

// put caches m as path's, with the file's state before it was read
// (st): a file changed while read is read again next time.
func (c *ManifestCache) put(path string, st os.FileInfo, m *codec.Manifest) {
	if c == nil || st == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCachedManifests {
		clear(c.m)
	}
	c.m[path] = cachedManifest{size: st.Size(), mtime: st.ModTime(), ino: fileKey(st), m: m}
}
