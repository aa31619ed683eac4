package bench_test

import (
	"context"
	"io"
	"testing"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/testenv"
)

// The storage comparison runs end to end against a real redis-server and
// reports sane figures: every store timed for every distribution, Redis
// answering every key of every MGET (CompareStores checks), and the
// memory ordering this project's design rests on.
func TestCompareStores(t *testing.T) {
	o := bench.StoreOptions{Params: 20000, RedisParams: 20000, RedisServer: testenv.Tool(t, "redis-server"),
		Batch: 1000, Batches: 20, Rounds: 3, Seed: 3}
	rs, err := bench.CompareStores(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("%d stores, want table, map and Redis", len(rs))
	}
	for _, r := range rs {
		for _, d := range bench.Distributions {
			if r.NsPerKey[d] <= 0 || r.BatchP50[d] <= 0 || r.BatchP99[d] < r.BatchP50[d] {
				t.Errorf("%s %s: %.1f ns/key, p50 %v, p99 %v", r.Store, d, r.NsPerKey[d], r.BatchP50[d], r.BatchP99[d])
			}
		}
	}
	table, m, redis := rs[0], rs[1], rs[2]
	// A record as stored (11 bytes with 7-byte quotiented keys, at 1,250
	// buckets) and a quarter byte of directory.
	if rec := float64(codec.StoredRecordSize(o.Params, 1, codec.EncFP32)); rec != 11 || table.BytesPerParam < rec || table.BytesPerParam > rec+0.5 {
		t.Errorf("table %.2f B/param, want %.0f–%.1f", table.BytesPerParam, rec, rec+0.5)
	}
	if !(table.BytesPerParam < m.BytesPerParam && m.BytesPerParam < redis.BytesPerParam) {
		t.Errorf("B/param: table %.2f, map %.2f, Redis %.2f", table.BytesPerParam, m.BytesPerParam, redis.BytesPerParam)
	}
}
