package golden_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/golden"
	"github.com/cumulus-serving/cumulus/router"
)

// FuzzParse: a golden or hold-out file is a file of the repository or an
// operator's, trusted by nobody: Parse either refuses it (ErrFormat, or
// a request the front would refuse) or returns requests that validate,
// with a want and labels of one number per row.
func FuzzParse(f *testing.F) {
	in := `"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"data":[1,2]},{"name":"row_splits","datatype":"INT64","shape":[3],"data":[0,1,2]}]`
	for _, seed := range []string{
		`{` + in + `}`,
		`{` + in + `,"want":[0.25,0.75]}` + "\n" + `{` + in + `,"labels":[1,0]}`,
		`{` + in + `,"want":[1e400,0]}`,
		`{"parameters":{"canary_key":"u"},` + in + `,"labels":[0,2]}`,
		`{"inputs":[{"name":"ids","datatype":"UINT64","shape":[1],"data":[18446744073709551615]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]},{"name":"dense","datatype":"FP32","shape":[1,2],"data":[[0.5,1]]}]}`,
		"\n\n{}\n",
	} {
		f.Add([]byte(seed))
	}
	lim := router.Limits{MaxRows: 64, MaxIDs: 256}
	f.Fuzz(func(t *testing.T, b []byte) {
		set, err := golden.Parse(b, "m", lim)
		if err != nil {
			if set != nil {
				t.Fatal("a set with an error")
			}
			if !errors.Is(err, golden.ErrFormat) && !errors.Is(err, router.ErrInvalidArgument) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		lines := 0
		for _, l := range bytes.Split(b, []byte("\n")) {
			if len(bytes.TrimSpace(l)) > 0 {
				lines++
			}
		}
		if len(set.Cases) != lines {
			t.Fatalf("%d cases from %d lines", len(set.Cases), lines)
		}
		for _, c := range set.Cases {
			if err := c.Req.Validate(lim); err != nil {
				t.Fatalf("line %d: %v", c.Line, err)
			}
			if c.Want != nil && len(c.Want) != c.Req.Rows() || c.Labels != nil && len(c.Labels) != c.Req.Rows() {
				t.Fatalf("line %d: %d wants, %d labels for %d rows", c.Line, len(c.Want), len(c.Labels), c.Req.Rows())
			}
		}
	})
}
