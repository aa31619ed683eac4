package loader

import (
	"bytes"
	"io"
	"reflect"
	"regexp"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/model"
)

// The importers read files users hand in. Whatever the bytes, an
// importer returns a model or an error, never both; costs about what the
// input weighs; and what it accepts means what the text says, read the
// plainest way docs/model-format.md allows. The fuzz targets check that
// against small readers of their own (readTSVText, readLIBLINEARText)
// and small writers (writeTSV, writeLIBLINEAR) for round trips.

// FuzzParseTSV: an accepted TSV file is the model its lines spell, one
// feature per feature line in order, that Publish takes and that reads
// back the same after writing it out; a refused one yields no model and
// an error naming the line.
func FuzzParseTSV(f *testing.F) {
	f.Add([]byte(tsvGood))
	for _, c := range tsvRejects {
		f.Add([]byte(c.text))
	}
	f.Add([]byte("type lr\nbias 0.125\n7 1.5\n3 -2.25e-3\n18446744073709551615 0\n"))
	f.Add([]byte("# exported by a trainer\r\ntype fm\r\ndim 4\r\nbias -1.75\r\n\r\n" +
		"1001\t0.5\t0.01\t-0.02\t0.03\t-0.04\r\n1002\t-0.5\t1e-3\t2e-3\t3e-3\t4e-3 # last\r\n"))
	f.Add([]byte("type lr\n"))
	f.Add([]byte("type fm\ndim 1024\n"))
	f.Add([]byte("type ffm\nfields 2\ndim 2\nbias 0.1\n7 0.5 0.1 0.2 0.3 0.4\n"))
	f.Add([]byte("type ffm\nfields 3\ndim 1\nmax_row_features 9\n1 0 1 2 3\n"))
	f.Add([]byte("type ffm\ndim 2\n1 0 1 2\n"))
	f.Add([]byte("type ffm\nfields 2\nfields 3\ndim 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		before := heapAllocs()
		s, err := ParseTSV(bytes.NewReader(b))
		if used := heapAllocs() - before; used > allocBudget(len(b)) {
			t.Fatalf("parsing %d bytes allocated %d bytes", len(b), used)
		}
		text := readTSVText(b)
		if err != nil {
			checkRefusal(t, s, err, "loader: tsv: ", text.lines, `no "type" header`)
			return
		}
		checkTSVModel(t, s, text)
		checkStorable(t, s)
		again, err := ParseTSV(bytes.NewReader(b))
		if err != nil || !reflect.DeepEqual(s, again) {
			t.Fatalf("the same bytes parsed twice differ: %+v, then %+v, %v", s, again, err)
		}
		out := writeTSV(s)
		back, err := ParseTSV(bytes.NewReader(out))
		if err != nil || !reflect.DeepEqual(s, back) {
			t.Fatalf("written back and parsed again, %+v became %+v, %v\n%s", s, back, err, out)
		}
	})
}

// FuzzImportLIBLINEAR: an accepted LIBLINEAR file is the model its
// weight lines spell (feature i for the i-th line, zeros dropped, the
// bias feature folded into the bias), with as many weight lines as
// nr_feature and bias promise; the other label gives exactly the negated
// model; it reads back the same after writing it out. A refused one
// yields no model and an error naming the line or the file's problem.
func FuzzImportLIBLINEAR(f *testing.F) {
	valid := []string{
		liblinearHeader + "0.5\n-0.25\n",
		"solver_type L2R_LR\nnr_class 2\nlabel 1 -1\nnr_feature 3\nbias 1\nw\n0.040991278432079961 \n0 \n1.2586468136559708 \n-0.72147165152891468 \n",
		"solver_type L1R_LR\nnr_class 2\nlabel 0 1\nnr_feature 4\nbias 2.5\nw\n0 \n-0.24605905871397554 \n0 \n1e-3 \n0.5 \n\n",
		"solver_type L2R_LR_DUAL\nnr_class 2\nlabel -1 1\nnr_feature 0\nbias -1\nw\n",
	}
	for _, text := range valid {
		f.Add([]byte(text), "1")
		f.Add([]byte(text), "-1")
	}
	for _, c := range liblinearRejects {
		f.Add([]byte(c.text), "1")
	}
	f.Fuzz(func(t *testing.T, b []byte, positive string) {
		before := heapAllocs()
		s, err := ImportLIBLINEAR(bytes.NewReader(b), positive)
		if used := heapAllocs() - before; used > allocBudget(len(b)) {
			t.Fatalf("importing %d bytes allocated %d bytes", len(b), used)
		}
		text := readLIBLINEARText(b)
		if err != nil {
			checkRefusal(t, s, err, "loader: liblinear: ", text.lines, liblinearWholeFile...)
			if m := classesRE.FindStringSubmatch(err.Error()); m != nil && m[1] == "2" {
				t.Fatalf("a two-class model refused as not binary: %v", err)
			}
			return
		}
		other := checkLIBLINEARModel(t, s, text, positive)
		checkStorable(t, s)
		again, err := ImportLIBLINEAR(bytes.NewReader(b), positive)
		if err != nil || !reflect.DeepEqual(s, again) {
			t.Fatalf("the same bytes imported twice differ: %+v, then %+v, %v", s, again, err)
		}
		neg, err := ImportLIBLINEAR(bytes.NewReader(b), other)
		if err != nil || !isNegation(s, neg) {
			t.Fatalf("for label %q, %+v; for label %q, %+v, %v: not its negation", positive, s, other, neg, err)
		}
		out := writeLIBLINEAR(s)
		back, err := ImportLIBLINEAR(bytes.NewReader(out), "1")
		if err != nil || !reflect.DeepEqual(s, back) {
			t.Fatalf("written back and imported again, %+v became %+v, %v\n%s", s, back, err, out)
		}
	})
}

// allocBudget is what importing n bytes may allocate: the scanner's
// buffer and some slack, plus a constant factor of the input. No number
// inside the input (nr_feature, dim) may size an allocation.
func allocBudget(n int) uint64 { return 1<<20 + 128*uint64(n) }

// heapAllocs returns the bytes this process has allocated so far.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// textLines splits b into lines as bufio.ScanLines does.
func textLines(b []byte) []string {
	lines := strings.Split(string(b), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

var lineRE = regexp.MustCompile(`\bline (\d+)\b`)

// checkRefusal checks a refused input: no model comes back, and the error
// says which importer refused and where, as a line of the input or, for a
// problem no one line holds, one of the phrases in wholeFile.
func checkRefusal(t *testing.T, s *Sparse, err error, prefix string, lines int, wholeFile ...string) {
	t.Helper()
	msg := err.Error()
	if s != nil {
		t.Fatalf("refused (%s), yet returned a model %+v", msg, s)
	}
	if !strings.HasPrefix(msg, prefix) {
		t.Fatalf("error %q does not start with %q", msg, prefix)
	}
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		if n, _ := strconv.Atoi(m[1]); n < 1 || n > lines {
			t.Fatalf("error %q names line %s of %d", msg, m[1], lines)
		}
		return
	}
	for _, w := range wholeFile {
		if strings.Contains(msg, w) {
			return
		}
	}
	t.Fatalf("error %q names no line, and no problem of the whole file", msg)
}

// checkStorable checks that Publish would take s: a valid version header,
// no duplicate id, every number finite.
func checkStorable(t *testing.T, s *Sparse) {
	t.Helper()
	m := codec.Manifest{Format: 1, Name: "m", Version: 1, Kind: codec.KindFull, Shape: s.Shape, Bias: s.Bias,
		Partitions: 1, Hash: partition.HashName}
	if err := m.ValidateHeader(); err != nil {
		t.Fatalf("accepted a model no version can hold: %v", err)
	}
	if err := s.check(); err != nil {
		t.Fatalf("accepted a model Publish refuses: %v", err)
	}
}

// tsvText is what a TSV file says, read the plainest way: the value of
// each header, and the fields of each feature line (its first field
// starts with a digit), in order.
type tsvText struct {
	headers  map[string]string
	features [][]string
	lines    int
}

func readTSVText(b []byte) tsvText {
	lines := textLines(b)
	text := tsvText{headers: map[string]string{}, lines: len(lines)}
	for _, l := range lines {
		l, _, _ = strings.Cut(l, "#")
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case f[0][0] >= '0' && f[0][0] <= '9':
			text.features = append(text.features, f)
		case len(f) == 2:
			text.headers[f[0]] = f[1]
		}
	}
	return text
}

// checkTSVModel checks an accepted model against its text.
func checkTSVModel(t *testing.T, s *Sparse, text tsvText) {
	t.Helper()
	num := func(h string) int { n, _ := strconv.Atoi(text.headers[h]); return n }
	bias, _ := strconv.ParseFloat(text.headers["bias"], 64)
	if s.Type != text.headers["type"] || s.Dim != num("dim") || s.Fields != num("fields") || s.MaxRowFeatures != num("max_row_features") || s.Bias != bias {
		t.Fatalf("%s bias %v; the headers say %q", s.Shape, s.Bias, text.headers)
	}
	if len(s.Keys) != len(text.features) || len(s.Values) != len(s.Keys)*s.Width() {
		t.Fatalf("%d features, %d values of width %d from %d feature lines", len(s.Keys), len(s.Values), s.Width(), len(text.features))
	}
	for i, f := range text.features {
		if id, err := strconv.ParseUint(f[0], 10, 64); err != nil || id != s.Keys[i] {
			t.Fatalf("feature %d is id %d; its line says %q", i, s.Keys[i], f[0])
		}
		if len(f) != 1+s.Width() {
			t.Fatalf("feature %d has %d values; its line has %d", s.Keys[i], s.Width(), len(f)-1)
		}
		for j, field := range f[1:] {
			v, err := strconv.ParseFloat(field, 32)
			if got := s.Values[i*s.Width()+j]; err != nil || float32(v) != got {
				t.Fatalf("feature %d value %d is %v; its line says %q", s.Keys[i], j, got, field)
			}
		}
	}
}

// writeTSV writes s in the TSV format, every number exactly.
func writeTSV(s *Sparse) []byte {
	var b bytes.Buffer
	b.WriteString("type " + s.Type + "\n")
	for h, n := range map[string]int{"dim": s.Dim, "fields": s.Fields, "max_row_features": s.MaxRowFeatures} {
		if n != 0 {
			b.WriteString(h + " " + strconv.Itoa(n) + "\n")
		}
	}
	if s.HasBias {
		b.WriteString("bias " + strconv.FormatFloat(s.Bias, 'g', -1, 64) + "\n")
	}
	for i, k := range s.Keys {
		b.WriteString(strconv.FormatUint(k, 10))
		for _, v := range s.Values[i*s.Width() : (i+1)*s.Width()] {
			b.WriteString("\t" + strconv.FormatFloat(float64(v), 'g', -1, 32))
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Refusals of a LIBLINEAR file that no one line holds.
var liblinearWholeFile = []string{`missing "w" line`, "gives no probabilities", "missing nr_class", "only binary models", "missing label line", "missing nr_feature",
	"not one of the model's labels", "nr_feature and bias promise"}

var classesRE = regexp.MustCompile(`(-?\d+) classes; only binary`)

// liblinearText is what a LIBLINEAR file says, read the plainest way:
// the fields of each header line before "w" (the last line of each
// name), and the non-blank lines after it.
type liblinearText struct {
	headers map[string][]string
	weights []string
	lines   int
}

func readLIBLINEARText(b []byte) liblinearText {
	lines := textLines(b)
	text := liblinearText{headers: map[string][]string{}, lines: len(lines)}
	inWeights := false
	for _, l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case inWeights:
			text.weights = append(text.weights, strings.TrimSpace(l))
		case f[0] == "w":
			inWeights = true
		default:
			text.headers[f[0]] = f[1:]
		}
	}
	return text
}

// checkLIBLINEARModel checks an accepted model against its text and
// returns the other label.
func checkLIBLINEARModel(t *testing.T, s *Sparse, text liblinearText, positive string) (other string) {
	t.Helper()
	if s.Type != model.LR || s.Dim != 0 {
		t.Fatalf("a LIBLINEAR model imported as %s dim %d", s.Type, s.Dim)
	}
	if solver := text.headers["solver_type"]; len(solver) != 1 || !liblinearLR[solver[0]] {
		t.Fatalf("accepted solver %q", solver)
	}
	labels := text.headers["label"]
	sign := 1.0
	switch {
	case len(labels) != 2:
		t.Fatalf("accepted labels %q", labels)
	case positive == labels[0]:
		other = labels[1]
	case positive == labels[1]:
		other, sign = labels[0], -1
	default:
		t.Fatalf("accepted positive label %q, not among %q", positive, labels)
	}
	nrFeature, bias := 0, -1.0
	if v := text.headers["nr_feature"]; len(v) == 1 {
		nrFeature, _ = strconv.Atoi(v[0])
	}
	if v := text.headers["bias"]; len(v) == 1 {
		bias, _ = strconv.ParseFloat(v[0], 64)
	}
	if nrFeature < 0 || nrFeature > len(text.weights) {
		t.Fatalf("accepted nr_feature %d with %d weight lines", nrFeature, len(text.weights))
	}
	want := nrFeature
	if bias >= 0 {
		want++
	}
	if len(text.weights) != want {
		t.Fatalf("accepted %d weight lines; nr_feature %d and bias %v promise %d", len(text.weights), nrFeature, bias, want)
	}
	k := 0
	for i, line := range text.weights[:nrFeature] {
		w, err := strconv.ParseFloat(line, 64)
		if err != nil {
			t.Fatalf("weight line %q accepted: %v", line, err)
		}
		if float32(sign*w) == 0 {
			continue
		}
		if k >= len(s.Keys) || s.Keys[k] != uint64(i+1) || s.Values[k] != float32(sign*w) {
			t.Fatalf("weight %d is %q; the model's feature %d of %d is not %v: %+v", i+1, line, k, len(s.Keys), float32(sign*w), s)
		}
		k++
	}
	if k != len(s.Keys) {
		t.Fatalf("%d non-zero weights; the model has %d features", k, len(s.Keys))
	}
	wantBias := 0.0
	if bias >= 0 {
		w, _ := strconv.ParseFloat(text.weights[nrFeature], 64)
		wantBias = bias * sign * w
	}
	if s.Bias != wantBias {
		t.Fatalf("bias %v; bias %v and its weight %q make %v", s.Bias, bias, text.weights[nrFeature], wantBias)
	}
	return other
}

// isNegation reports whether b is a with every number negated.
func isNegation(a, b *Sparse) bool {
	if b == nil || a.Type != b.Type || a.Dim != b.Dim || a.Bias != -b.Bias ||
		!reflect.DeepEqual(a.Keys, b.Keys) || len(a.Values) != len(b.Values) {
		return false
	}
	for i, v := range a.Values {
		if v != -b.Values[i] {
			return false
		}
	}
	return true
}

// writeLIBLINEAR writes an LR model as LIBLINEAR's train would, with
// labels 1 and -1 (so 1 is the positive label) and the model's bias as
// the weight of a bias feature of value 1.
func writeLIBLINEAR(s *Sparse) []byte {
	var b bytes.Buffer
	n := uint64(0)
	if len(s.Keys) > 0 {
		n = s.Keys[len(s.Keys)-1]
	}
	bias := "-1"
	if s.Bias != 0 {
		bias = "1"
	}
	b.WriteString("solver_type L2R_LR\nnr_class 2\nlabel 1 -1\nnr_feature " + strconv.FormatUint(n, 10) + "\nbias " + bias + "\nw\n")
	k := 0
	for i := uint64(1); i <= n; i++ {
		w := 0.0
		if k < len(s.Keys) && s.Keys[k] == i {
			w = float64(s.Values[k])
			k++
		}
		b.WriteString(strconv.FormatFloat(w, 'g', -1, 64) + " \n")
	}
	if s.Bias != 0 {
		b.WriteString(strconv.FormatFloat(s.Bias, 'g', -1, 64) + " \n")
	}
	return b.Bytes()
}

// A count in a header never sizes an allocation: a file claiming 2^31-1
// features, or a width of 1025 values, costs about what its bytes weigh.
func TestImportCostFollowsInput(t *testing.T) {
	huge := strings.Replace(strings.Replace(liblinearHeader, "nr_feature 2", "nr_feature 2147483647", 1), "bias -1", "bias 1", 1) + "0.5\n0.25\n"
	liblinear := func(r io.Reader) (*Sparse, error) { return ImportLIBLINEAR(r, "1") }
	for _, c := range []struct {
		name, text string
		parse      func(io.Reader) (*Sparse, error)
	}{
		{"nr_feature 2^31-1", huge, liblinear},
		{"nr_feature 2^40", strings.Replace(huge, "2147483647", "1099511627776", 1), liblinear},
		{"dim 1024", "type fm\ndim 1024\n1" + strings.Repeat(" 0.5", 1025) + "\n2 0.5\n", ParseTSV},
	} {
		before := heapAllocs()
		s, err := c.parse(strings.NewReader(c.text))
		if used := heapAllocs() - before; used > allocBudget(len(c.text)) {
			t.Errorf("%s: importing %d bytes allocated %d bytes", c.name, len(c.text), used)
		}
		if err == nil {
			t.Errorf("%s: accepted as %+v", c.name, s)
		}
	}
}
