package topo

import (
	"context"
	"log/slog"
	"maps"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Watch calls fn with the whole content of prefix (key → value) and the
// etcd revision it reflects, once at start and again after every change,
// until ctx ends. fn runs on Watch's goroutine and must not keep the map. A broken or compacted watch starts
// over from a fresh read, so fn always sees a consistent state.
func Watch(ctx context.Context, cli *clientv3.Client, prefix string, fn func(kv map[string][]byte, rev int64)) {
	WatchKeys(ctx, cli, prefix, nil, fn)
}

// WatchKeys is Watch keeping only the keys keep accepts (all when keep is
// nil): one watch, in etcd's revision order, over keys a prefix shares
// with others the caller need not hold or copy.
func WatchKeys(ctx context.Context, cli *clientv3.Client, prefix string, keep func(key string) bool, fn func(kv map[string][]byte, rev int64)) {
	for ctx.Err() == nil {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			if ctx.Err() == nil {
				slog.Warn("topo: read failed; retrying", "prefix", prefix, "err", err)
				sleep(ctx, 500*time.Millisecond)
			}
			continue
		}
		state := make(map[string][]byte, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			if keep == nil || keep(string(kv.Key)) {
				state[string(kv.Key)] = kv.Value
			}
		}
		fn(maps.Clone(state), resp.Header.Revision)
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if err := wr.Err(); err != nil {
				slog.Warn("topo: watch broken; re-reading", "prefix", prefix, "err", err)
				break
			}
			for _, ev := range wr.Events {
				if keep != nil && !keep(string(ev.Kv.Key)) {
					continue
				}
				if ev.Type == clientv3.EventTypeDelete {
					delete(state, string(ev.Kv.Key))
				} else {
					state[string(ev.Kv.Key)] = ev.Kv.Value
				}
			}
			fn(maps.Clone(state), wr.Header.Revision)
		}
		cancel()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
