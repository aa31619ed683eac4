package router_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
)

// TestRecordsAsStored: for every type and encoding, the records a router
// fetches from real shards are the partition files' records decoded bit
// for bit as codec.DecodeRecord decodes them: sent as stored (fp16, int8)
// by shards that offer the encoding, as float32s by one that does not (an
// older shard, whose registration lists none).
func TestRecordsAsStored(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	type entry struct {
		name string
		enc  codec.Encoding
		m    *loader.Sparse
	}
	var all []entry
	dnn := randomShaped(model.Shape{Type: model.DNN, Fields: 4, Dim: 8, Pooling: "sum"}, 3000, 13)
	dnn.Dense = loader.GenDense(13, dnn.DenseIn(), []int{16})
	all = append(all, entry{"lr-fp32", codec.EncFP32, randomModel(model.LR, 0, 3000, 11)})
	for kind, m := range map[string]*loader.Sparse{
		"fm":  randomModel(model.FM, 16, 3000, 12),
		"ffm": randomShaped(model.Shape{Type: model.FFM, Fields: 4, Dim: 4}, 3000, 14),
		"dnn": dnn,
	} {
		for _, enc := range []codec.Encoding{codec.EncFP32, codec.EncFP16, codec.EncInt8} {
			all = append(all, entry{kind + "-" + enc.String(), enc, m})
		}
	}
	for _, e := range all {
		if _, err := repo.PublishEncoded(e.name, e.m, 4, e.enc.String(), "test"); err != nil {
			t.Fatal(err)
		}
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour})
	r := c.Router
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, e := range all { // all loaded first: fewer shard reports while fetching
		if err := r.WaitRoutable(ctx, e.name, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range all {
		chain, err := repo.Chain(e.name, 1)
		if err != nil {
			t.Fatal(err)
		}
		ids := append(append([]uint64(nil), e.m.Keys...), 1<<62, 1<<62+1) // and two the model lacks
		want, err := repo.Lookup(chain, ids)                              // codec.DecodeRecord of the files
		if err != nil {
			t.Fatal(err)
		}
		for _, older := range []bool{false, true} {
			uniq, vals, seen, err := router.FetchRecords(ctx, r, e.name, ids, older)
			if err != nil {
				t.Fatal(err)
			}
			width := e.m.Width()
			for u, id := range uniq {
				got, exp := vals[u*width:(u+1)*width], want[id]
				if exp == nil {
					exp = make([]float32, width) // absent: zeros
				}
				for j := range got {
					if math.Float32bits(got[j]) != math.Float32bits(exp[j]) {
						t.Fatalf("%s (older shards %v): id %d value %d: %v fetched, %v stored", e.name, older, id, j, got[j], exp[j])
					}
				}
			}
			stored := e.enc != codec.EncFP32 && !older
			if seen[2] > 0 != stored || seen[1] > 0 == stored {
				t.Errorf("%s (older shards %v): request formats %v, want records as stored: %v", e.name, older, seen, stored)
			}
		}
	}
}
