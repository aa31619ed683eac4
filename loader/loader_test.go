package loader

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/model"
)

func smallFM() *Sparse {
	s := &Sparse{Shape: model.Shape{Type: model.FM, Dim: 2}, Bias: 0.25}
	for i := uint64(0); i < 100; i++ {
		s.Keys = append(s.Keys, i*1000003)
		s.Values = append(s.Values, float32(i)/100, float32(i)/200, -float32(i)/300)
	}
	return s
}

func TestPublishAndRead(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	s := smallFM()
	m, err := repo.Publish("fm", s, 4, "test")
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 1 || m.Params != 100 || m.Width() != 3 {
		t.Fatalf("manifest %+v", m)
	}
	m2, err := repo.Publish("fm", s, 4, "test")
	if err != nil || m2.Version != 2 {
		t.Fatalf("second publish: v%d, %v", m2.Version, err)
	}
	got, err := repo.Manifest("fm", 2)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64][]float32{}
	for i, k := range s.Keys {
		want[k] = s.Values[3*i : 3*i+3]
	}
	n := 0
	for p := uint32(0); p < 4; p++ {
		pt, err := repo.ReadPartition(got, p)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < pt.Count; i++ {
			k := pt.Key(i)
			if partition.Of(k, 4) != p {
				t.Errorf("key %d filed in partition %d", k, p)
			}
			for j := 0; j < 3; j++ {
				if pt.Value(i, j) != want[k][j] {
					t.Errorf("key %d value %d = %v, want %v", k, j, pt.Value(i, j), want[k][j])
				}
			}
			n++
		}
	}
	if n != 100 {
		t.Errorf("read %d keys, want 100", n)
	}
	if err := repo.Verify(got); err != nil {
		t.Fatal(err)
	}
}

// Versions being written are invisible; concurrent publishers each get
// their own version number.
func TestPublishAtomic(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	w, err := repo.NewVersion(Spec{Name: "m", Shape: model.Shape{Type: model.LR}, Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WritePartition(0, []uint64{1}, []float32{1}); err != nil {
		t.Fatal(err)
	}
	if vs, _ := repo.Versions("m"); len(vs) != 0 {
		t.Fatalf("uncommitted version visible: %v", vs)
	}
	var wg sync.WaitGroup
	versions := make([]uint64, 8)
	for i := range versions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := repo.Publish("m", tinyLR(uint64(i)), 2, "")
			if err != nil {
				t.Error(err)
				return
			}
			versions[i] = m.Version
		}()
	}
	wg.Wait()
	m, err := w.Commit()
	if err != nil {
		t.Fatal(err)
	}
	wantVersions1ToN(t, repo, append(versions, m.Version), 9)
}

// tinyLR is a one-feature model, quick to publish.
func tinyLR(id uint64) *Sparse {
	return &Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{id}, Values: []float32{1}}
}

// readHighWater returns the content of a model's high-water file.
func readHighWater(t *testing.T, repo Repo, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo.Dir, name, highWaterName))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A deleted version's number is never given out again, and the files
// kept beside the versions are never taken for versions or models.
func TestVersionNumbersNotReused(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	publish := func() uint64 {
		t.Helper()
		m, err := repo.Publish("m", tinyLR(1), 1, "")
		if err != nil {
			t.Fatal(err)
		}
		return m.Version
	}
	publish()
	publish()
	if err := os.RemoveAll(repo.VersionDir("m", 2)); err != nil {
		t.Fatal(err)
	}
	if v := publish(); v != 3 {
		t.Fatalf("after deleting version 2, published version %d, want 3", v)
	}
	if vs, err := repo.Versions("m"); err != nil || !slices.Equal(vs, []uint64{1, 3}) {
		t.Fatalf("versions %v, %v; want [1 3]", vs, err)
	}
	if ms, err := repo.Models(); err != nil || !slices.Equal(ms, []string{"m"}) {
		t.Fatalf("models %v, %v; want [m]", ms, err)
	}
	if hw := readHighWater(t, repo, "m"); hw != "3\n" {
		t.Fatalf("high-water file holds %q, want %q", hw, "3\n")
	}
	for _, f := range []string{highWaterName, lockName} {
		if _, err := os.Stat(filepath.Join(repo.Dir, "m", f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}

	// With every version gone the mark alone decides.
	os.RemoveAll(repo.VersionDir("m", 1))
	os.RemoveAll(repo.VersionDir("m", 3))
	if _, err := repo.Latest("m"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Latest with no versions: %v", err)
	}
	if v := publish(); v != 4 {
		t.Fatalf("after deleting every version, published version %d, want 4", v)
	}
}

// A repository written before the high-water file existed carries on
// after its latest version.
func TestHighWaterMissing(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	for range 2 {
		if _, err := repo.Publish("m", tinyLR(1), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(repo.Dir, "m", highWaterName)); err != nil {
		t.Fatal(err)
	}
	m, err := repo.Publish("m", tinyLR(1), 1, "")
	if err != nil || m.Version != 3 {
		t.Fatalf("published %+v, %v; want version 3", m, err)
	}
	if hw := readHighWater(t, repo, "m"); hw != "3\n" {
		t.Fatalf("high-water file holds %q after publishing version 3", hw)
	}
}

// A high-water file that does not hold a number stops publishing, naming
// the file, instead of counting as 0 and reusing numbers.
func TestHighWaterGarbage(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	if _, err := repo.Publish("m", tinyLR(1), 1, ""); err != nil {
		t.Fatal(err)
	}
	hw := filepath.Join(repo.Dir, "m", highWaterName)
	for _, garbage := range []string{"", "seven\n", "-1\n", "3 4\n", "18446744073709551616\n"} {
		if err := os.WriteFile(hw, []byte(garbage), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := repo.Publish("m", tinyLR(1), 1, "")
		if !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), hw) {
			t.Errorf("high-water %q: err = %v, want corruption naming %s", garbage, err, hw)
		}
	}
	if vs, err := repo.Versions("m"); err != nil || !slices.Equal(vs, []uint64{1}) {
		t.Fatalf("versions %v, %v; want [1]", vs, err)
	}
	ents, _ := os.ReadDir(filepath.Join(repo.Dir, "m"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".writing-") {
			t.Errorf("refused publish left %s behind", e.Name())
		}
	}
	// Tolerates the whitespace a person editing it may leave.
	os.WriteFile(hw, []byte(" 7 \n\n"), 0o644)
	if m, err := repo.Publish("m", tinyLR(1), 1, ""); err != nil || m.Version != 8 {
		t.Fatalf("high-water 7: published %+v, %v; want version 8", m, err)
	}
}

// wantVersions1ToN checks that got holds exactly 1..n and that the
// repository's versions and high-water mark agree.
func wantVersions1ToN(t *testing.T, repo Repo, got []uint64, n int) {
	t.Helper()
	got = slices.Sorted(slices.Values(got))
	want := make([]uint64, n)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("published versions %v, want 1..%d each once", got, n)
	}
	if vs, err := repo.Versions("m"); err != nil || !slices.Equal(vs, want) {
		t.Fatalf("repository versions %v, %v; want 1..%d", vs, err, n)
	}
	if hw := readHighWater(t, repo, "m"); hw != fmt.Sprintf("%d\n", n) {
		t.Fatalf("high-water file holds %q, want %d", hw, n)
	}
}

// Publishers in other processes take distinct numbers too. The test
// re-runs its own binary as the publishers: with LOADER_TEST_PUBLISH_DIR
// set, it publishes into that repository and prints each version.
func TestPublishAcrossProcesses(t *testing.T) {
	const procs, each = 3, 10
	if dir := os.Getenv("LOADER_TEST_PUBLISH_DIR"); dir != "" {
		repo := Repo{Dir: dir}
		for i := range each {
			m, err := repo.Publish("m", tinyLR(uint64(i)), 1, "")
			if err != nil {
				t.Fatal(err)
			}
			fmt.Printf("published %d\n", m.Version)
		}
		return
	}
	repo := Repo{Dir: t.TempDir()}
	cmds := make([]*exec.Cmd, procs)
	outs := make([]strings.Builder, procs)
	for i := range cmds {
		cmds[i] = exec.Command(os.Args[0], "-test.run=^TestPublishAcrossProcesses$")
		cmds[i].Env = append(os.Environ(), "LOADER_TEST_PUBLISH_DIR="+repo.Dir)
		cmds[i].Stdout, cmds[i].Stderr = &outs[i], &outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("publisher %d: %v\n%s", i, err, outs[i].String())
		}
		for _, line := range strings.Split(outs[i].String(), "\n") {
			if v, ok := strings.CutPrefix(line, "published "); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					t.Fatalf("publisher %d printed %q", i, line)
				}
				got = append(got, n)
			}
		}
	}
	wantVersions1ToN(t, repo, got, procs*each)
}

func TestCorruptPartitionNamed(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	m, err := repo.Publish("m", smallFM(), 2, "")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(repo.VersionDir("m", 1), m.Files[1].Path)
	b, _ := os.ReadFile(p)
	b[100] ^= 1
	os.WriteFile(p, b, 0o644)
	err = repo.Verify(m)
	if !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), "part-00001.bin") {
		t.Fatalf("err = %v, want corruption naming part-00001.bin", err)
	}
	os.WriteFile(p, b[:50], 0o644)
	if err := repo.Verify(m); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("truncated file: err = %v", err)
	}
}

func TestPublishRefusesBadModels(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	// Each refused for its own reason: the error names it.
	cases := map[string]struct {
		s    *Sparse
		says string
	}{
		"duplicate": {&Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{5, 5}, Values: []float32{1, 2}}, "feature id 5 appears twice"},
		"nan":       {&Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{5}, Values: []float32{float32(math.NaN())}}, "feature id 5 has a non-finite value"},
		"inf bias":  {&Sparse{Shape: model.Shape{Type: model.LR}, Bias: math.Inf(1), Keys: []uint64{5}, Values: []float32{1}}, "bias +Inf is not finite"},
		"width":     {&Sparse{Shape: model.Shape{Type: model.FM, Dim: 2}, Keys: []uint64{5}, Values: []float32{1}}, "1 values for 1 keys of width 3"},
	}
	for name, c := range cases {
		if _, err := repo.Publish("m", c.s, 1, ""); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
	}
	if _, err := repo.Publish("../x", smallFM(), 1, ""); err == nil {
		t.Error("bad name accepted")
	}
}

func TestGenerate(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	var progress int64
	var mu sync.Mutex
	m, err := repo.Generate(GenSpec{Name: "g", Shape: model.Shape{Type: model.FM, Dim: 4}, Params: 200000, Partitions: 3, Seed: 7,
		Progress: func(n int64) { mu.Lock(); progress += n; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	if m.Params != 200000 || progress != 200000 || m.Generator == nil || m.Generator.IDs != "hashed" {
		t.Fatalf("params %d, progress %d, generator %+v", m.Params, progress, m.Generator)
	}
	inModel := map[uint64]bool{}
	for p := uint32(0); p < 3; p++ {
		pt, err := repo.ReadPartition(m, p)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < pt.Count; i++ {
			inModel[pt.Key(i)] = true
		}
	}
	for _, r := range []uint64{0, 1, 199999} {
		if !inModel[GenID(*m.Generator, r)] {
			t.Errorf("rank %d's id missing from the model", r)
		}
	}
	if len(inModel) != 200000 {
		t.Errorf("%d distinct ids, want 200000", len(inModel))
	}

	// Deltas on it: each on the one before, of ids the model has.
	ds, err := repo.GenerateDeltas("g", 3, 50, 9)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		if d.Kind != codec.KindDelta || d.Parent != m.Version+uint64(i) {
			t.Errorf("delta %d: kind %s on %d, want a delta on %d", i, d.Kind, d.Parent, m.Version+uint64(i))
		}
		n := 0
		for _, f := range d.Files {
			pt, err := repo.ReadPartition(d, f.Partition)
			if err != nil {
				t.Fatal(err)
			}
			for j := range pt.Count {
				if !inModel[pt.Key(j)] {
					t.Errorf("delta %d changes feature %d, which the model does not have", i, pt.Key(j))
				}
			}
			n += pt.Count
		}
		if n != 50 {
			t.Errorf("delta %d changes %d features, want 50", i, n)
		}
	}
	if _, err := repo.GenerateDeltas("g", 1, 200001, 9); err == nil || !strings.Contains(err.Error(), "1 to 200000") {
		t.Errorf("more keys a delta than features: %v", err)
	}

	// A next full version: the same features, other values.
	m2, err := repo.Generate(GenSpec{Name: "g", Shape: model.Shape{Type: model.FM, Dim: 4}, Params: 200000, Partitions: 3, Seed: 7, ValueSeed: 8})
	if err != nil {
		t.Fatal(err)
	}
	a, err := repo.ReadPartition(m, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := repo.ReadPartition(m2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.Count != b.Count || a.Hash(0) != b.Hash(0) || a.Hash(a.Count-1) != b.Hash(b.Count-1) || slices.Equal(a.ValueBytes(0), b.ValueBytes(0)) {
		t.Errorf("--value-seed: %d and %d features, first %x and %x, values %x and %x", a.Count, b.Count, a.Hash(0), b.Hash(0), a.ValueBytes(0), b.ValueBytes(0))
	}
}

// TestChainCap: deltas stack up to MaxChain on a full version; a delta
// past it is refused when published, not when a reader meets it.
func TestChainCap(t *testing.T) {
	chain := []*codec.Manifest{{Name: "c", Version: 1, Kind: codec.KindFull}}
	for len(chain)-1 < MaxChain {
		if err := roomOnChain(chain); err != nil {
			t.Fatalf("a chain of %d deltas refused another: %v", len(chain)-1, err)
		}
		v := chain[0].Version + 1
		chain = append([]*codec.Manifest{{Name: "c", Version: v, Kind: codec.KindDelta, Parent: v - 1}}, chain...)
	}
	if err := roomOnChain(chain); err == nil || !strings.Contains(err.Error(), "compact the chain first") {
		t.Errorf("a delta on %d deltas: %v", MaxChain, err)
	}
	repo := Repo{Dir: t.TempDir()}
	if _, err := repo.Generate(GenSpec{Name: "c", Shape: model.Shape{Type: model.LR}, Params: 10, Partitions: 1, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.GenerateDeltas("c", MaxChain+1, 1, 2); err == nil || !strings.Contains(err.Error(), "a chain holds") {
		t.Errorf("more deltas than a chain holds: %v", err)
	}
}

// tsvGood is a valid TSV model: TestParseTSV checks what it parses to,
// and FuzzParseTSV starts from it.
const tsvGood = "# an fm model\ntype fm\ndim 2\nbias -0.5\n1\t0.5\t0.1\t0.2\n18446744073709551615 1 2 3 # max id\n"

// tsvRejects are TSV files each refused for its own reason: the error
// names it. FuzzParseTSV starts from them too.
var tsvRejects = map[string]struct{ text, says string }{
	"no type":       {"1 0.5\n", "no \"type\" header before the first feature"},
	"wrong width":   {"type fm\ndim 2\n1 0.5 0.1\n", "feature 1 has 2 values, want 3"},
	"lr with dim":   {"type lr\ndim 2\n1 0.5\n", "line 2: an lr model takes no dim"},
	"fm no dim":     {"type fm\n1 0.5\n", "line 1: an fm model needs a \"dim\" header"},
	"header late":   {"type lr\n1 0.5\nbias 1\n", "\"bias\" is not a feature id (headers come first)"},
	"bad number":    {"type lr\n1 abc\n", "parsing \"abc\""},
	"duplicate":     {"type lr\n1 0.5\n1 0.6\n", "line 3: feature id 1 appears twice (first on line 2)"},
	"nan":           {"type lr\n1 NaN\n", "line 2: feature 1 has a non-finite value NaN"},
	"unknown":       {"type lr\ncolor red\n", "unknown header \"color\""},
	"negative id":   {"type lr\n-1 0.5\n", "feature id \"-1\" is not an integer"},
	"overflow f32":  {"type lr\n1 1e39\n", "parsing \"1e39\""},
	"unknown type":  {"type svm\n", "type \"svm\" is not one of dnn, ffm, fm, lr"},
	"huge dim":      {"type fm\ndim 100000\n", "dim 100000 outside 1..1024"},
	"empty":         {"", "no \"type\" header"},
	"bias not num":  {"type lr\nbias x\n", "parsing \"x\""},
	"id too large":  {"type lr\n18446744073709551616 1\n", "feature id \"18446744073709551616\" is not an integer"},
	"header arity":  {"type lr fm\n", "header \"type\" wants one value"},
	"only comments": {"# nothing\n", "no \"type\" header"},
	// Accepted before: with no feature line the headers' shape went
	// unchecked, so an lr model with a dim or an fm model without one
	// passed, for Publish to refuse.
	"lr with dim, no features": {"type lr\ndim 2\n", "line 2: an lr model takes no dim"},
	"fm no dim, no features":   {"type fm\nbias 1\n", "line 1: an fm model needs a \"dim\" header"},
	// Refused without their line before, and "bias nan" accepted.
	"inf factor": {"type fm\ndim 1\n1 0.5 -Inf\n", "line 3: feature 1 has a non-finite value -Inf"},
	"nan bias":   {"type lr\nbias nan\n1 0.5\n", "line 2: bias NaN is not finite"},
}

func TestParseTSV(t *testing.T) {
	s, err := ParseTSV(strings.NewReader(tsvGood))
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != model.FM || s.Dim != 2 || s.Bias != -0.5 || len(s.Keys) != 2 || s.Keys[1] != math.MaxUint64 || s.Values[5] != 3 {
		t.Fatalf("parsed %+v", s)
	}
	for name, c := range tsvRejects {
		s, err := ParseTSV(strings.NewReader(c.text))
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
		if s != nil {
			t.Errorf("%s: refused, yet returned a model %+v", name, s)
		}
	}
	long := "type lr\n1 " + strings.Repeat("0", 17<<20) + "\n"
	if _, err := ParseTSV(strings.NewReader(long)); err == nil || !strings.Contains(err.Error(), "line 2: longer than 16 MiB") {
		t.Errorf("a 17 MiB line: %v, want an error naming line 2", err)
	}
}

// writeSVM writes a random binary classification set in libsvm format.
func writeSVM(t *testing.T, path string, rows, features int, labels [2]string, seed uint64) {
	t.Helper()
	var b strings.Builder
	x := seed
	next := func() uint64 { x = splitmix64(x); return x }
	for i := 0; i < rows; i++ {
		label := labels[next()%2]
		b.WriteString(label)
		idx := uint64(0)
		for j := 0; j < 8; j++ {
			idx += 1 + next()%uint64(features/8)
			v := float64(next()%2000)/1000 - 1
			if label == labels[0] && idx%3 == 0 {
				v += 0.8
			}
			fmt.Fprintf(&b, " %d:%.3f", idx, v)
		}
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// scoreLR is the plain definition: σ(bias + Σ w_i x_i).
func scoreLR(s *Sparse, ids []uint64, vals []float64) float64 {
	w := map[uint64]float64{}
	for i, k := range s.Keys {
		w[k] = float64(s.Values[i])
	}
	z := s.Bias
	for i, id := range ids {
		z += w[id] * vals[i]
	}
	return 1 / (1 + math.Exp(-z))
}

// TestImportLIBLINEAR checks the importer against the real LIBLINEAR
// tools, for each supported solver, with and without bias, and both
// label orders.
func TestImportLIBLINEAR(t *testing.T) {
	train := testenv.Tool(t, "liblinear-train")
	predict := testenv.Tool(t, "liblinear-predict")
	dir := t.TempDir()
	for _, c := range []struct {
		solver string
		bias   string
		labels [2]string
	}{
		{"0", "1", [2]string{"1", "-1"}},
		{"0", "-1", [2]string{"-1", "1"}},
		{"6", "2.5", [2]string{"0", "1"}},
		{"7", "1", [2]string{"1", "0"}},
	} {
		name := fmt.Sprintf("s%s-B%s-%s%s", c.solver, c.bias, c.labels[0], c.labels[1])
		t.Run(name, func(t *testing.T) {
			data := filepath.Join(dir, name+".svm")
			model := filepath.Join(dir, name+".model")
			out := filepath.Join(dir, name+".out")
			writeSVM(t, data, 300, 64, c.labels, 11)
			if b, err := exec.Command(train, "-q", "-s", c.solver, "-B", c.bias, data, model).CombinedOutput(); err != nil {
				t.Fatalf("liblinear-train: %v\n%s", err, b)
			}
			if b, err := exec.Command(predict, "-b", "1", data, model, out).CombinedOutput(); err != nil {
				t.Fatalf("liblinear-predict: %v\n%s", err, b)
			}
			f, _ := os.Open(model)
			s, err := ImportLIBLINEAR(f, "1")
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			checkAgainstPredict(t, s, data, out, "1")
		})
	}
}

// checkAgainstPredict compares the model's scores with the column of
// `predict -b 1` output for label positive.
func checkAgainstPredict(t *testing.T, s *Sparse, data, out, positive string) {
	t.Helper()
	outText, _ := os.ReadFile(out)
	lines := strings.Split(strings.TrimSpace(string(outText)), "\n")
	col := -1
	for i, l := range strings.Fields(lines[0])[1:] {
		if l == positive {
			col = i + 1
		}
	}
	dataText, _ := os.ReadFile(data)
	rows := strings.Split(strings.TrimSpace(string(dataText)), "\n")
	if len(rows) != len(lines)-1 {
		t.Fatalf("%d rows, %d predictions", len(rows), len(lines)-1)
	}
	for i, row := range rows {
		var ids []uint64
		var vals []float64
		for _, kv := range strings.Fields(row)[1:] {
			k, v, _ := strings.Cut(kv, ":")
			id, _ := strconv.ParseUint(k, 10, 64)
			x, _ := strconv.ParseFloat(v, 64)
			ids, vals = append(ids, id), append(vals, x)
		}
		want, _ := strconv.ParseFloat(strings.Fields(lines[i+1])[col], 64)
		if got := scoreLR(s, ids, vals); !(math.Abs(got-want) <= 1e-5) {
			t.Fatalf("row %d: score %.7f, liblinear-predict says %.7f", i, got, want)
		}
	}
}

// liblinearHeader heads a LIBLINEAR model file with two features, no
// bias feature, and labels 1 and -1.
const liblinearHeader = "solver_type L2R_LR\nnr_class 2\nlabel 1 -1\nnr_feature 2\nbias -1\nw\n"

// liblinearRejects are LIBLINEAR files each refused, for positive label
// 1, for its own reason: the error names it. FuzzImportLIBLINEAR starts
// from them.
var liblinearRejects = map[string]struct{ text, says string }{
	"svm solver":     {strings.Replace(liblinearHeader, "L2R_LR", "L2R_L2LOSS_SVC_DUAL", 1) + "1\n2\n", "gives no probabilities"},
	"multiclass":     {strings.Replace(strings.Replace(liblinearHeader, "nr_class 2", "nr_class 3", 1), "label 1 -1", "label 1 2 3", 1) + "1 2 3\n1 2 3\n", "3 classes; only binary models"},
	"short weights":  {liblinearHeader + "1\n", "1 weights, nr_feature and bias promise 2"},
	"extra text":     {liblinearHeader + "1\n2\n3\n", "text after the last weight"},
	"no w":           {"solver_type L2R_LR\nnr_class 2\n", "missing \"w\" line"},
	"bad weight":     {liblinearHeader + "1\nx\n", "line 8: strconv.ParseFloat: parsing \"x\""},
	"wrong label":    {strings.Replace(liblinearHeader, "label 1 -1", "label 2 4", 1) + "1\n2\n", "positive label \"1\" is not one of the model's labels"},
	"unknown header": {"colour blue\n" + liblinearHeader + "1\n2\n", "unknown header \"colour\""},
	// Found by FuzzImportLIBLINEAR: a missing label line was called "2
	// classes; only binary models are supported".
	"no label line": {strings.Replace(liblinearHeader, "label 1 -1\n", "", 1) + "1\n2\n", "missing label line"},
	"one label":     {strings.Replace(liblinearHeader, "label 1 -1", "label 1", 1) + "1\n2\n", "line 3: 1 labels for 2 classes"},
	"equal labels":  {strings.Replace(liblinearHeader, "label 1 -1", "label 1 1", 1) + "1\n2\n", "line 3: both labels are \"1\""},
	"no nr_class":   {strings.Replace(liblinearHeader, "nr_class 2\n", "", 1) + "1\n2\n", "missing nr_class"},
	// nr_feature+1 overflowed: no weight was read, and the file accepted.
	"nr_feature overflow": {strings.Replace(strings.Replace(liblinearHeader, "nr_feature 2", "nr_feature 9223372036854775807", 1), "bias -1", "bias 1", 1),
		"line 4: nr_feature 9223372036854775807 outside 0..2147483647"},
	"negative nr_feature": {strings.Replace(liblinearHeader, "nr_feature 2", "nr_feature -3", 1), "line 4: nr_feature -3 outside 0..2147483647"},
	// Non-finite numbers were refused without their line, and a NaN bias
	// was taken as "no bias feature".
	"nan weight":     {liblinearHeader + "1\nnan\n", "line 8: weight nan is not a finite float32"},
	"float32 weight": {liblinearHeader + "1e300\n2\n", "line 7: weight 1e300 is not a finite float32"},
	"nan bias":       {strings.Replace(liblinearHeader, "bias -1", "bias nan", 1) + "1\n2\n", "line 5: bias NaN is not finite"},
	"inf bias":       {strings.Replace(liblinearHeader, "bias -1", "bias inf", 1) + "1\n2\n0\n", "line 5: bias +Inf is not finite"},
	"bias product": {strings.Replace(liblinearHeader, "bias -1", "bias 1e300", 1) + "1\n2\n1e300\n",
		"line 9: bias weight 1e300 times bias 1e+300 is not finite"},
}

func TestImportLIBLINEARRejects(t *testing.T) {
	for name, c := range liblinearRejects {
		s, err := ImportLIBLINEAR(strings.NewReader(c.text), "1")
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
		if s != nil {
			t.Errorf("%s: refused, yet returned a model %+v", name, s)
		}
	}
	long := liblinearHeader + "1\n" + strings.Repeat("0", 2<<20) + "\n"
	if _, err := ImportLIBLINEAR(strings.NewReader(long), "1"); err == nil || !strings.Contains(err.Error(), "line 8: longer than 1 MiB") {
		t.Errorf("a 2 MiB line: %v, want an error naming line 8", err)
	}
}

// A weight too small for a float32 is dropped like a zero weight, not
// kept as a feature of weight 0.
func TestImportLIBLINEARDropsZeros(t *testing.T) {
	s, err := ImportLIBLINEAR(strings.NewReader(liblinearHeader+"1e-50\n-0\n"), "1")
	if err != nil || len(s.Keys) != 0 {
		t.Fatalf("imported %+v, %v; want no features", s, err)
	}
}

func TestPublishDelta(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	if _, err := repo.PublishDelta("m", Delta{Deletes: []uint64{1}}); err == nil {
		t.Error("delta on a model with no version accepted")
	}
	if _, err := repo.Publish("m", smallFM(), 3, ""); err != nil {
		t.Fatal(err)
	}
	m, err := repo.PublishDelta("m", Delta{Deletes: []uint64{1000003, 77}})
	if err != nil || m.Kind != codec.KindDelta || m.Parent != 1 || m.Params != 2 || m.Bias != 0.25 {
		t.Fatalf("delta: %+v, %v", m, err)
	}
	chain, err := repo.Chain("m", 2)
	if err != nil || len(chain) != 2 || chain[1].Version != 1 {
		t.Fatalf("chain: %v, %v", chain, err)
	}
	// The deletion is a tombstone record, in the files of the partitions
	// it touches; the delta leaves the others to its parent (format 2).
	found := 0
	if len(m.Files) == 3 || m.Format != 2 || len(m.Unchanged) == 0 {
		t.Errorf("a delta of 2 keys in 3 partitions: format %d, files for %v, unchanged %v; want only the touched partitions' files", m.Format, m.Touched(), m.Unchanged)
	}
	for p := uint32(0); p < 3; p++ {
		if _, ok := m.File(p); !ok {
			if _, err := repo.ReadPartition(m, p); err == nil || !strings.Contains(err.Error(), "leaves it as its parent has it") {
				t.Errorf("partition %d, unchanged: read %v", p, err)
			}
			continue
		}
		pt, err := repo.ReadPartition(m, p)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < pt.Count; i++ {
			if !codec.IsTombstone(pt.Value(i, 0)) {
				t.Errorf("key %d is not a tombstone", pt.Key(i))
			}
			found++
		}
	}
	if found != 2 {
		t.Errorf("%d records, want 2", found)
	}
	refusals := map[string]struct {
		d    Delta
		says string
	}{
		"shape":          {Delta{Upserts: &Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{1}, Values: []float32{1}}}, "delta is lr; m version 2 is fm dim 2"},
		"change+delete":  {Delta{Upserts: &Sparse{Shape: model.Shape{Type: model.FM, Dim: 2}, Keys: []uint64{5}, Values: []float32{1, 2, 3}}, Deletes: []uint64{5}}, "both changes and deletes feature 5"},
		"non-finite":     {Delta{Upserts: &Sparse{Shape: model.Shape{Type: model.FM, Dim: 2}, Keys: []uint64{5}, Values: []float32{float32(math.NaN()), 0, 0}}}, "non-finite value"},
		"duplicate keys": {Delta{Upserts: &Sparse{Shape: model.Shape{Type: model.FM, Dim: 2}, Keys: []uint64{5, 5}, Values: make([]float32, 6)}}, "feature id 5 appears twice"},
	}
	two := -1.0
	refusals["two biases"] = struct {
		d    Delta
		says string
	}{Delta{Upserts: &Sparse{Shape: model.Shape{Type: model.FM, Dim: 2}, Bias: 0.5, HasBias: true}, Bias: &two}, "names two biases"}
	for name, c := range refusals {
		if _, err := repo.PublishDelta("m", c.d); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
	}
	// The upserts' bias header is the new bias; without one, the parent's
	// is kept.
	up, err := ParseTSV(strings.NewReader("type fm\ndim 2\nbias 0.75\n5 1 2 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := repo.PublishDelta("m", Delta{Upserts: up}); err != nil || m.Bias != 0.75 {
		t.Errorf("upserts with a bias header: bias %v, %v; want 0.75", m.Bias, err)
	}
	up, _ = ParseTSV(strings.NewReader("type fm\ndim 2\n6 1 2 3\n"))
	if m, err := repo.PublishDelta("m", Delta{Upserts: up}); err != nil || m.Bias != 0.75 {
		t.Errorf("upserts without one: bias %v, %v; want the parent's 0.75", m.Bias, err)
	}
	// A broken chain is refused, naming the missing parent.
	os.RemoveAll(repo.VersionDir("m", 1))
	if _, err := repo.Chain("m", 2); err == nil || !strings.Contains(err.Error(), "parent 1") {
		t.Errorf("broken chain: %v", err)
	}
}

// TestPublishSplitDelta: a delta given split by partition writes the
// same files as the same rows given as upserts and deletions, packed or
// not; and rows of the wrong partition, non-finite values, rows given
// both ways and partitions out of order are refused.
func TestPublishSplitDelta(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	if _, err := repo.Publish("m", smallFM(), 5, ""); err != nil {
		t.Fatal(err)
	}
	shape := model.Shape{Type: model.FM, Dim: 2}
	up := &Sparse{Shape: shape, Keys: []uint64{5, 6, 7, 3000009}, Values: []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}
	deletes := []uint64{1000003, 88}
	split := func() *Split {
		s := &Split{}
		keys, values, dels := map[uint32][]uint64{}, map[uint32][]float32{}, map[uint32][]uint64{}
		for i, k := range up.Keys {
			p := partition.Of(k, 5)
			keys[p] = append(keys[p], k)
			values[p] = append(values[p], up.Values[3*i:3*i+3]...)
		}
		for _, k := range deletes {
			p := partition.Of(k, 5)
			dels[p] = append(dels[p], k)
		}
		for p := range uint32(5) {
			if len(keys[p])+len(dels[p]) > 0 {
				s.Touched = append(s.Touched, p)
			}
		}
		s.Rows = func(p uint32) ([]uint64, []float32, []uint64) { return keys[p], values[p], dels[p] }
		return s
	}
	for _, pack := range []bool{false, true} {
		want, err := repo.PublishDelta("m", Delta{Upserts: up, Deletes: deletes, Parent: 1, Pack: pack})
		if err != nil {
			t.Fatal(err)
		}
		got, err := repo.PublishDelta("m", Delta{Split: split(), Parent: 1, Pack: pack})
		if err != nil {
			t.Fatal(err)
		}
		if got.Params != want.Params || got.Format != want.Format || len(got.Files) != len(want.Files) || got.Bias != want.Bias {
			t.Fatalf("packed %v: split delta %+v; as upserts %+v", pack, got, want)
		}
		for i := range got.Files {
			if g, w := got.Files[i], want.Files[i]; g.Partition != w.Partition || g.SHA256 != w.SHA256 || g.Keys != w.Keys {
				t.Fatalf("packed %v: partition %d's file differs: %+v, as upserts %+v", pack, g.Partition, g, w)
			}
		}
	}
	wrong := split()
	rows := wrong.Rows
	wrong.Rows = func(p uint32) ([]uint64, []float32, []uint64) {
		k, v, d := rows(p)
		return append(slices.Clone(k), 1000003*3+1), append(slices.Clone(v), 0, 0, 0), d
	}
	nan := split()
	nan.Rows = func(p uint32) ([]uint64, []float32, []uint64) {
		k, v, d := rows(p)
		return k, slices.Repeat([]float32{float32(math.Inf(1))}, len(v)), d
	}
	unordered := split()
	slices.Reverse(unordered.Touched)
	for name, c := range map[string]struct {
		d    Delta
		says string
	}{
		"wrong partition": {Delta{Split: wrong}, "of partition"},
		"non-finite":      {Delta{Split: nan}, "non-finite"},
		"both ways":       {Delta{Split: split(), Deletes: []uint64{3}}, "not both"},
		"unordered":       {Delta{Split: unordered}, "not ascending"},
	} {
		if _, err := repo.PublishDelta("m", c.d); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
	}
}

// TestPublishRefusesAnotherPartitionCount: a model's partition count is
// fixed by its first version; a version with another is refused before
// anything is written.
func TestPublishRefusesAnotherPartitionCount(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	if _, err := repo.Publish("m", smallFM(), 3, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Publish("m", smallFM(), 4, ""); err == nil || !strings.Contains(err.Error(), "has 3 partitions (fixed by version 1)") {
		t.Errorf("4 partitions after 3: %v", err)
	}
	if vs, _ := repo.Versions("m"); len(vs) != 1 {
		t.Errorf("versions after the refusal: %v", vs)
	}
	if _, err := repo.Publish("m", smallFM(), 3, ""); err != nil {
		t.Errorf("3 partitions again: %v", err)
	}
}

// TestDeltaParent: a delta builds on the newest version that passes the
// local checks, passing over a damaged one and saying why; --parent
// chooses, and a damaged parent chosen is refused.
func TestDeltaParent(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	for range 2 {
		if _, err := repo.Publish("m", smallFM(), 3, ""); err != nil {
			t.Fatal(err)
		}
	}
	m2, _ := repo.Manifest("m", 2)
	f := filepath.Join(repo.VersionDir("m", 2), m2.Files[0].Path)
	b, _ := os.ReadFile(f)
	b[len(b)/2] ^= 0xff
	os.WriteFile(f, b, 0o644)
	v, skipped, err := repo.DeltaParent("m")
	if err != nil || v != 1 || len(skipped) != 1 || !strings.Contains(skipped[0].Error(), "version 2") {
		t.Fatalf("parent with version 2 damaged: %d, skipped %v, %v; want 1, skipping 2", v, skipped, err)
	}
	m, err := repo.PublishDelta("m", Delta{Deletes: []uint64{77}})
	if err != nil || m.Parent != 1 {
		t.Fatalf("delta by default: %+v %v; want on 1", m, err)
	}
	if _, err := repo.PublishDelta("m", Delta{Deletes: []uint64{77}, Parent: 2}); err == nil || !strings.Contains(err.Error(), "parent 2") {
		t.Errorf("delta on the damaged 2, chosen: %v", err)
	}
	if m, err := repo.PublishDelta("m", Delta{Deletes: []uint64{78}, Parent: 1}); err != nil || m.Parent != 1 {
		t.Errorf("delta on 1, chosen: %+v %v", m, err)
	}
}

// TestLookupOnAPartialDelta: a delta that leaves partitions as its parent
// has them has no file for them; a lookup through its chain reads those
// partitions from the parent (it used to fail on the missing file, and
// with it the golden requests of any delta published on such a chain).
func TestLookupOnAPartialDelta(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	full := &Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= 1000; k++ {
		full.Keys, full.Values = append(full.Keys, k), append(full.Values, float32(k))
	}
	if _, err := repo.Publish("m", full, 4, "test"); err != nil {
		t.Fatal(err)
	}
	d, err := repo.PublishDelta("m", Delta{Upserts: &Sparse{Shape: full.Shape, Keys: []uint64{7}, Values: []float32{-7}}, Deletes: []uint64{8}})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Files) == 4 {
		t.Fatal("the delta writes every partition: the test needs one it leaves alone")
	}
	chain, err := repo.Chain("m", d.Version)
	if err != nil {
		t.Fatal(err)
	}
	got, err := repo.Lookup(chain, []uint64{1, 2, 3, 4, 5, 7, 8, 2000})
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64]float32{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 7: -7}
	if len(got) != len(want) {
		t.Errorf("%d ids found, want %d: %v", len(got), len(want), got)
	}
	for id, w := range want {
		if v := got[id]; len(v) != 1 || v[0] != w {
			t.Errorf("id %d: %v, want %v", id, v, w)
		}
	}
}
