package loader

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/cumulus-serving/cumulus/model"
)

// LIBLINEAR solvers whose models give probabilities (`predict -b 1`).
var liblinearLR = map[string]bool{"L2R_LR": true, "L1R_LR": true, "L2R_LR_DUAL": true}

// ImportLIBLINEAR reads a LIBLINEAR model file (the text `train` writes)
// for a binary logistic-regression model (solvers 0, 6 and 7) and returns
// a model whose score is the probability of positiveLabel, exactly what
// `predict -b 1` prints in that label's column.
//
// LIBLINEAR's decision value is w·x + bias·w_b and its probability of the
// first label on the model's `label` line is σ(decision); when
// positiveLabel is the second label the weights are negated. Feature
// index i becomes feature id i. The bias feature (index nr_feature+1 with
// value `bias`) becomes the model's bias term: callers never send it.
// Zero weights, and weights too small for a float32, are dropped, as an
// absent feature scores zero.
//
// A refused file yields no model and an error naming the line, where one
// line is at fault.
func ImportLIBLINEAR(r io.Reader, positiveLabel string) (*Sparse, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	h, line, err := readLIBLINEARHead(sc)
	if err != nil {
		return nil, err
	}
	sign := 0.0
	switch positiveLabel {
	case h.labels[0]:
		sign = 1
	case h.labels[1]:
		sign = -1
	default:
		return nil, fmt.Errorf("loader: liblinear: positive label %q is not one of the model's labels %v", positiveLabel, h.labels)
	}
	// nr_feature is at most 2^31-1, so this cannot overflow.
	n := h.nrFeature
	if h.bias >= 0 {
		n++
	}
	m := &Sparse{Shape: model.Shape{Type: model.LR}}
	for i := 0; i < n; i++ {
		if !sc.Scan() {
			if err := sc.Err(); err != nil {
				return nil, liblinearScanError(line+1, err)
			}
			return nil, fmt.Errorf("loader: liblinear: %d weights, nr_feature and bias promise %d", i, n)
		}
		line++
		f := strings.Fields(sc.Text())
		if len(f) != 1 {
			return nil, fmt.Errorf("loader: liblinear: line %d: want one weight, got %d fields", line, len(f))
		}
		w, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("loader: liblinear: line %d: %w", line, err)
		}
		w *= sign
		switch {
		case i == h.nrFeature:
			m.Bias = h.bias * w
			if math.IsNaN(m.Bias) || math.IsInf(m.Bias, 0) {
				return nil, fmt.Errorf("loader: liblinear: line %d: bias weight %s times bias %v is not finite", line, f[0], h.bias)
			}
		case math.IsNaN(w) || math.IsInf(float64(float32(w)), 0):
			return nil, fmt.Errorf("loader: liblinear: line %d: weight %s is not a finite float32", line, f[0])
		case float32(w) != 0:
			m.Keys = append(m.Keys, uint64(i+1))
			m.Values = append(m.Values, float32(w))
		}
	}
	for sc.Scan() {
		line++
		if strings.TrimSpace(sc.Text()) != "" {
			return nil, fmt.Errorf("loader: liblinear: line %d: text after the last weight", line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, liblinearScanError(line+1, err)
	}
	return m, nil
}

// liblinearHead is what a LIBLINEAR model file says before its weights.
type liblinearHead struct {
	solver    string
	nrClass   int
	labels    []string
	labelLine int
	nrFeature int
	bias      float64 // < 0: no bias feature
}

// readLIBLINEARHead reads the header lines up to and including "w",
// checks that they describe a binary logistic-regression model, and
// returns them with the number of lines read.
func readLIBLINEARHead(sc *bufio.Scanner) (h liblinearHead, line int, err error) {
	h = liblinearHead{nrClass: -1, nrFeature: -1, bias: -1}
	for {
		if !sc.Scan() {
			if err := sc.Err(); err != nil {
				return h, line, liblinearScanError(line+1, err)
			}
			return h, line, fmt.Errorf("loader: liblinear: no weights (missing \"w\" line)")
		}
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "w" {
			break
		}
		var err error
		switch f[0] {
		case "solver_type":
			if len(f) != 2 {
				return h, line, fmt.Errorf("loader: liblinear: line %d: bad solver_type", line)
			}
			h.solver = f[1]
		case "nr_class":
			if len(f) != 2 {
				return h, line, fmt.Errorf("loader: liblinear: line %d: bad nr_class", line)
			}
			h.nrClass, err = strconv.Atoi(f[1])
		case "label":
			h.labels, h.labelLine = f[1:], line
		case "nr_feature":
			if len(f) != 2 {
				return h, line, fmt.Errorf("loader: liblinear: line %d: bad nr_feature", line)
			}
			// LIBLINEAR's nr_feature is a C int. The bound also keeps
			// nr_feature+1 (with the bias feature) from overflowing.
			h.nrFeature, err = strconv.Atoi(f[1])
			if err == nil && (h.nrFeature < 0 || h.nrFeature > math.MaxInt32) {
				err = fmt.Errorf("nr_feature %d outside 0..%d", h.nrFeature, math.MaxInt32)
			}
		case "bias":
			if len(f) != 2 {
				return h, line, fmt.Errorf("loader: liblinear: line %d: bad bias", line)
			}
			h.bias, err = strconv.ParseFloat(f[1], 64)
			if err == nil && (math.IsNaN(h.bias) || math.IsInf(h.bias, 0)) {
				err = fmt.Errorf("bias %v is not finite", h.bias)
			}
		case "rho":
			// One-class SVM only; not a probability model.
		default:
			return h, line, fmt.Errorf("loader: liblinear: line %d: unknown header %q", line, f[0])
		}
		if err != nil {
			return h, line, fmt.Errorf("loader: liblinear: line %d: %w", line, err)
		}
	}
	switch {
	case !liblinearLR[h.solver]:
		return h, line, fmt.Errorf("loader: liblinear: solver %q gives no probabilities; use -s 0, 6 or 7 (logistic regression)", h.solver)
	case h.nrClass == -1:
		return h, line, fmt.Errorf("loader: liblinear: missing nr_class")
	case h.nrClass != 2:
		return h, line, fmt.Errorf("loader: liblinear: %d classes; only binary models are supported", h.nrClass)
	case h.labelLine == 0:
		return h, line, fmt.Errorf("loader: liblinear: missing label line")
	case len(h.labels) != 2:
		return h, line, fmt.Errorf("loader: liblinear: line %d: %d labels for 2 classes", h.labelLine, len(h.labels))
	case h.labels[0] == h.labels[1]:
		return h, line, fmt.Errorf("loader: liblinear: line %d: both labels are %q", h.labelLine, h.labels[0])
	case h.nrFeature < 0:
		return h, line, fmt.Errorf("loader: liblinear: missing nr_feature")
	}
	return h, line, nil
}

// liblinearScanError reports a read error met reading line n.
func liblinearScanError(n int, err error) error {
	if errors.Is(err, bufio.ErrTooLong) {
		return fmt.Errorf("loader: liblinear: line %d: longer than 1 MiB", n)
	}
	return fmt.Errorf("loader: liblinear: line %d: %w", n, err)
}
