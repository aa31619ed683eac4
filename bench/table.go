package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/shard"
)

// StoreOptions configure the storage comparison.
type StoreOptions struct {
	Params      int    // features in the table and the Go map; default 10,000,000
	RedisParams int    // features loaded into Redis (slow to fill); default 1,000,000; 0 with NoRedis skips it
	NoRedis     bool   // skip the Redis baseline
	RedisServer string // path of redis-server; default: found on PATH
	Batch       int    // keys per batched lookup; default 20,000
	Batches     int    // batches timed per store and distribution; default 200
	Rounds      int    // turns the table and the map take over the batches; default 5
	Seed        uint64
}

func (o *StoreOptions) fill() {
	if o.Params == 0 {
		o.Params = 10_000_000
	}
	if o.RedisParams == 0 {
		o.RedisParams = 1_000_000
	}
	if o.Batch == 0 {
		o.Batch = 20_000
	}
	if o.Batches == 0 {
		o.Batches = 200
	}
	if o.Rounds == 0 {
		o.Rounds = 5
	}
}

// StoreResult is one store's figures.
type StoreResult struct {
	Store         string
	Params        int
	BytesPerParam float64
	NsPerKey      map[string]float64       // by key distribution
	BatchP50      map[string]time.Duration // whole-batch latency
	BatchP99      map[string]time.Duration
}

// Distributions of query keys over the stored features' ranks.
var Distributions = []string{"zipf1.1", "uniform"}

// queryBatches draws batches of ranks below n.
func queryBatches(dist string, n, batch, count int, seed uint64) [][]uint64 {
	rng := rand.New(rand.NewPCG(seed, uint64(len(dist))))
	z := rand.NewZipf(rng, 1.1, 1, uint64(n-1))
	out := make([][]uint64, count)
	for i := range out {
		out[i] = make([]uint64, batch)
		for j := range out[i] {
			if dist == "uniform" {
				out[i][j] = rng.Uint64N(uint64(n))
			} else {
				out[i][j] = z.Uint64()
			}
		}
	}
	return out
}

func idsOf(ranks [][]uint64, gen codec.GenInfo) [][]uint64 {
	out := make([][]uint64, len(ranks))
	for i, b := range ranks {
		out[i] = make([]uint64, len(b))
		for j, r := range b {
			out[i][j] = loader.GenID(gen, r)
		}
	}
	return out
}

// timeBatches runs fn on every batch and returns each batch's latency.
func timeBatches(batches [][]uint64, fn func([]uint64)) []time.Duration {
	fn(batches[0]) // warm
	lat := make([]time.Duration, len(batches))
	for i, b := range batches {
		t0 := time.Now()
		fn(b)
		lat[i] = time.Since(t0)
	}
	return lat
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// CompareStores measures, in one run and on the same keys, Cumulus's
// table, a Go map[uint64]float32 and Redis MGET over loopback: memory per
// parameter and batched lookup time per key for each key distribution.
func CompareStores(ctx context.Context, o StoreOptions, log io.Writer) ([]StoreResult, error) {
	o.fill()
	gen := codec.GenInfo{Seed: o.Seed, IDs: "hashed"}
	keys := make([]uint64, o.Params)
	vals := make([]float32, o.Params)
	for r := range keys {
		keys[r] = loader.GenID(gen, uint64(r))
		vals[r] = float32(r%1000) / 1000
	}
	queries := map[string][][]uint64{}
	for _, d := range Distributions {
		queries[d] = idsOf(queryBatches(d, o.Params, o.Batch, o.Batches, o.Seed), gen)
	}
	// Cumulus table: one partition holding every key.
	fmt.Fprintf(log, "building the Cumulus table of %d params\n", o.Params)
	before := heapInUse()
	tb, err := shard.ResidentTable(1, codec.EncFP32, keys, vals) // as a shard holds it
	if err != nil {
		return nil, err
	}
	tableHeap := heapInUse() - before
	fmt.Fprintf(log, "  table %d bytes (%.2f B/param) on huge pages, outside the Go heap (heap grew %.2f B/param building it)\n",
		tb.Bytes(), float64(tb.Bytes())/float64(o.Params), float64(tableHeap)/float64(o.Params))

	fmt.Fprintf(log, "building map[uint64]float32 of %d params\n", o.Params)
	before = heapInUse()
	m := make(map[uint64]float32)
	for i, k := range keys {
		m[k] = vals[i]
	}
	mapHeap := heapInUse() - before

	idx := make([]int32, o.Batch)
	v := make([]float32, o.Batch)
	var sink float32
	stores := []struct {
		res    StoreResult
		lookup func([]uint64)
	}{
		{StoreResult{Store: "cumulus table", BytesPerParam: float64(tb.Bytes()) / float64(o.Params)},
			func(b []uint64) { tb.FindWeights(b, idx, v) }}, // what a shard does for LR
		{StoreResult{Store: "go map", BytesPerParam: float64(mapHeap) / float64(o.Params)},
			func(b []uint64) {
				for j, k := range b {
					v[j] = m[k]
				}
				sink += v[0]
			}},
	}
	// The stores take turns, o.Rounds times over the same batches, so a
	// noisy spell on a shared machine falls on both; each store's ns/key
	// is its median round, p50/p99 over every batch of every round.
	fmt.Fprintf(log, "timing %d rounds of %d batches per store and distribution, stores taking turns\n", o.Rounds, o.Batches)
	for i := range stores {
		r := &stores[i].res
		r.Params, r.NsPerKey, r.BatchP50, r.BatchP99 = o.Params, map[string]float64{}, map[string]time.Duration{}, map[string]time.Duration{}
	}
	for _, d := range Distributions {
		rounds := make([][]float64, len(stores))
		lat := make([][]time.Duration, len(stores))
		for range o.Rounds {
			for i, st := range stores {
				l := timeBatches(queries[d], st.lookup)
				ns, _, _ := summarize(l, o.Batch)
				rounds[i], lat[i] = append(rounds[i], ns), append(lat[i], l...)
			}
		}
		for i := range stores {
			r := &stores[i].res
			slices.Sort(rounds[i])
			r.NsPerKey[d] = rounds[i][len(rounds[i])/2]
			_, r.BatchP50[d], r.BatchP99[d] = summarize(lat[i], o.Batch)
		}
	}
	runtime.KeepAlive(tb)
	runtime.KeepAlive(m)
	_ = sink
	tb, m = nil, nil
	results := []StoreResult{stores[0].res, stores[1].res}

	if !o.NoRedis {
		r, err := redisBaseline(ctx, o, keys[:min(o.RedisParams, len(keys))], log)
		if err != nil {
			return results, err
		}
		results = append(results, r)
	}
	return results, nil
}

// PrintStores writes the comparison table, with ratios against the first
// row.
func PrintStores(w io.Writer, rs []StoreResult, batch int) {
	fmt.Fprintf(w, "%-14s %11s %9s", "store", "params", "B/param")
	for _, d := range Distributions {
		fmt.Fprintf(w, " %14s %22s", "ns/key "+d, fmt.Sprintf("%dk-batch p50/p99", batch/1000))
	}
	fmt.Fprintln(w)
	for _, r := range rs {
		fmt.Fprintf(w, "%-14s %11d %9.2f", r.Store, r.Params, r.BytesPerParam)
		for _, d := range Distributions {
			fmt.Fprintf(w, " %14.1f %22s", r.NsPerKey[d], fmt.Sprintf("%s / %s", r.BatchP50[d].Round(time.Microsecond), r.BatchP99[d].Round(time.Microsecond)))
		}
		fmt.Fprintln(w)
	}
	for _, r := range rs[1:] {
		fmt.Fprintf(w, "%s vs %s: %.1f× the memory per param", r.Store, rs[0].Store, r.BytesPerParam/rs[0].BytesPerParam)
		for _, d := range Distributions {
			fmt.Fprintf(w, ", %.1f× the time per key (%s)", r.NsPerKey[d]/rs[0].NsPerKey[d], d)
		}
		fmt.Fprintln(w)
	}
}

// redisBaseline starts redis-server on a loopback port, loads keys as
// 8-byte binary keys with 4-byte values, and times MGET of the same
// batches (restricted to the keys it holds).
func redisBaseline(ctx context.Context, o StoreOptions, keys []uint64, log io.Writer) (StoreResult, error) {
	path := o.RedisServer
	if path == "" {
		var err error
		if path, err = exec.LookPath("redis-server"); err != nil {
			return StoreResult{}, fmt.Errorf("bench: redis-server not found (Debian package redis-server): %w", err)
		}
	}
	port, err := freePort()
	if err != nil {
		return StoreResult{}, err
	}
	dir, err := os.MkdirTemp("", "cumulus-redis-")
	if err != nil {
		return StoreResult{}, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return StoreResult{}, fmt.Errorf("bench: starting redis-server: %w", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	rc := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rc.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			return StoreResult{}, fmt.Errorf("bench: redis-server did not answer PING within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	used := func() (float64, error) {
		info, err := rc.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				return strconv.ParseFloat(v, 64)
			}
		}
		return 0, fmt.Errorf("bench: no used_memory in INFO memory")
	}
	base, err := used()
	if err != nil {
		return StoreResult{}, err
	}
	fmt.Fprintf(log, "loading %d params into redis-server on 127.0.0.1:%d\n", len(keys), port)
	key := func(k uint64) string { var b [8]byte; binary.LittleEndian.PutUint64(b[:], k); return string(b[:]) }
	for start := 0; start < len(keys); start += 10000 {
		pipe := rc.Pipeline()
		args := make([]any, 0, 2000)
		for i, k := range keys[start:min(start+10000, len(keys))] {
			var v [4]byte
			binary.LittleEndian.PutUint32(v[:], uint32(i))
			args = append(args, key(k), string(v[:]))
			if len(args) == 2000 {
				pipe.MSet(ctx, args...)
				args = make([]any, 0, 2000)
			}
		}
		if len(args) > 0 {
			pipe.MSet(ctx, args...)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return StoreResult{}, fmt.Errorf("bench: loading redis: %w", err)
		}
	}
	after, err := used()
	if err != nil {
		return StoreResult{}, err
	}
	res := StoreResult{Store: "redis MGET", Params: len(keys), BytesPerParam: (after - base) / float64(len(keys)),
		NsPerKey: map[string]float64{}, BatchP50: map[string]time.Duration{}, BatchP99: map[string]time.Duration{}}
	gen := codec.GenInfo{Seed: o.Seed, IDs: "hashed"}
	batches := max(20, o.Batches/5) // each MGET is slow; fewer batches
	for _, d := range Distributions {
		qs := idsOf(queryBatches(d, len(keys), o.Batch, batches, o.Seed), gen)
		var ferr error
		lat := timeBatches(qs, func(b []uint64) {
			ks := make([]string, len(b))
			for j, k := range b {
				ks[j] = key(k)
			}
			got, err := rc.MGet(ctx, ks...).Result()
			if err == nil && len(got) != len(b) {
				err = fmt.Errorf("bench: MGET answered %d of %d keys", len(got), len(b))
			}
			if err != nil && ferr == nil {
				ferr = err
			}
		})
		if ferr != nil {
			return StoreResult{}, ferr
		}
		res.NsPerKey[d], res.BatchP50[d], res.BatchP99[d] = summarize(lat, o.Batch)
	}
	return res, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
