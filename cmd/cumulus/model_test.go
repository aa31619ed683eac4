package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/loader"
)

func TestModelCommands(t *testing.T) {
	repo := t.TempDir()
	out, err := cumulus("model", "gen", "--name", "g", "--type", "fm", "--dim", "3", "--params", "5000", "--partitions", "3", "--repo", repo).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "published g version 1: fm dim 3, 5000 features, 3 partitions") {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	out, err = cumulus("model", "gen", "--name", "f", "--type", "ffm", "--fields", "4", "--dim", "2", "--encoding", "int8", "--params", "3000", "--partitions", "2", "--repo", repo).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "published f version 1: ffm fields 4 dim 2, 3000 features, 2 partitions") {
		t.Fatalf("gen ffm: %v\n%s", err, out)
	}
	out, err = cumulus("model", "gen", "--name", "x", "--type", "lr", "--fields", "4", "--repo", repo).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "an lr model takes no fields") {
		t.Fatalf("gen lr with fields: %v\n%s", err, out)
	}
	tsv := filepath.Join(t.TempDir(), "m.tsv")
	os.WriteFile(tsv, []byte("type fm\ndim 2\nbias 0.5\n1 0.1 0.2 0.3\n2 -0.1 0.2 -0.3\n"), 0o644)
	out, err = cumulus("model", "import", "--format", "tsv", "--name", "t", "--repo", repo, tsv).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "published t version 1: fm dim 2, 2 features") {
		t.Fatalf("tsv import: %v\n%s", err, out)
	}
	ffm := filepath.Join(t.TempDir(), "ffm.tsv")
	os.WriteFile(ffm, []byte("type ffm\nfields 2\ndim 2\nbias 0.1\n7 0.5 0.1 0.2 0.3 0.4\n"), 0o644)
	out, err = cumulus("model", "import", "--format", "tsv", "--name", "tf", "--repo", repo, ffm).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "published tf version 1: ffm fields 2 dim 2, 1 features") {
		t.Fatalf("ffm tsv import: %v\n%s", err, out)
	}
	os.WriteFile(tsv, []byte("type fm\ndim 2\n1 0.1 0.2\n"), 0o644)
	out, err = cumulus("model", "import", "--format", "tsv", "--name", "t", "--repo", repo, tsv).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "line 3") {
		t.Fatalf("bad tsv accepted or unclear: %v\n%s", err, out)
	}

	// A delta on t: change feature 1, delete feature 2, new bias.
	up := filepath.Join(t.TempDir(), "up.tsv")
	os.WriteFile(up, []byte("type fm\ndim 2\n1 0.9 0.1 0.1\n"), 0o644)
	del := filepath.Join(t.TempDir(), "del.txt")
	os.WriteFile(del, []byte("2\n"), 0o644)
	out, err = cumulus("model", "delta", "--name", "t", "--repo", repo, "--upserts", up, "--deletes", del, "--bias", "0.25").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "published t version 2: delta on 1, 2 records") {
		t.Fatalf("delta: %v\n%s", err, out)
	}
	// Packed (format 3) by default, a file per partition with --unpacked.
	for v, want := range map[int]int{2: codec.PackedFormat, 3: 2} {
		if v == 3 {
			mustRun(t, "model", "delta", "--name", "t", "--repo", repo, "--upserts", up, "--unpacked")
		}
		m, err := loader.Repo{Dir: repo}.Manifest("t", uint64(v))
		if err != nil {
			t.Fatal(err)
		}
		if m.Format != want {
			t.Errorf("delta version %d: format %d, want %d", v, m.Format, want)
		}
	}
	out, err = cumulus("model", "delta", "--name", "t", "--repo", repo, "--deletes", up).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "line 1") {
		t.Fatalf("bad deletes file accepted or unclear: %v\n%s", err, out)
	}

	out, err = cumulus("model", "inspect", "--repo", repo, "g").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "checksums: all ok") || !strings.Contains(string(out), `"params": 5000`) {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	p := filepath.Join(repo, "g", "1", "part-00002.bin")
	b, _ := os.ReadFile(p)
	b[len(b)/2] ^= 1
	os.WriteFile(p, b, 0o644)
	out, err = cumulus("model", "inspect", "--repo", repo, "g", "1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "DAMAGED") || !strings.Contains(string(out), "part-00002.bin") {
		t.Fatalf("inspect of a damaged version: %v\n%s", err, out)
	}
}

func TestPredictParsers(t *testing.T) {
	ids, vals, err := parseJSONRow(`{"ids": [18446744073709551615, 3]}`, nil, nil)
	if err != nil || !slices.Equal(ids, []uint64{1<<64 - 1, 3}) || !slices.Equal(vals, []float32{1, 1}) {
		t.Errorf("jsonl: %v %v %v", ids, vals, err)
	}
	if _, _, err := parseJSONRow(`{"ids": [1], "values": [1, 2]}`, nil, nil); err == nil {
		t.Error("jsonl with mismatched values accepted")
	}
	ids, vals, err = parseLibsvmRow("-1 4:0.5 9:2", nil, nil)
	if err != nil || !slices.Equal(ids, []uint64{4, 9}) || !slices.Equal(vals, []float32{0.5, 2}) {
		t.Errorf("libsvm: %v %v %v", ids, vals, err)
	}
	for bad, says := range map[string]string{"1 4": "not ID:VALUE", "1 x:1": "feature id", "1 4:y": "value",
		`{"ids":[1,2,3]}`: "--format jsonl", "yes 4:1": "label"} {
		if _, _, err := parseLibsvmRow(bad, nil, nil); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("libsvm %q: %v, want an error saying %q", bad, err, says)
		}
	}
}
