package loader

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cumulus-serving/cumulus/codec"
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
// Zero weights are dropped, as an absent feature scores zero.
func ImportLIBLINEAR(r io.Reader, positiveLabel string) (*Sparse, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	var (
		solver    string
		nrClass   = -1
		labels    []string
		nrFeature = -1
		bias      = -1.0
		line      int
	)
	for {
		if !sc.Scan() {
			return nil, fmt.Errorf("loader: liblinear: no weights (missing \"w\" line)")
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
				return nil, fmt.Errorf("loader: liblinear: line %d: bad solver_type", line)
			}
			solver = f[1]
		case "nr_class":
			if len(f) != 2 {
				return nil, fmt.Errorf("loader: liblinear: line %d: bad nr_class", line)
			}
			nrClass, err = strconv.Atoi(f[1])
		case "label":
			labels = f[1:]
		case "nr_feature":
			if len(f) != 2 {
				return nil, fmt.Errorf("loader: liblinear: line %d: bad nr_feature", line)
			}
			nrFeature, err = strconv.Atoi(f[1])
		case "bias":
			if len(f) != 2 {
				return nil, fmt.Errorf("loader: liblinear: line %d: bad bias", line)
			}
			bias, err = strconv.ParseFloat(f[1], 64)
		case "rho":
			// One-class SVM only; not a probability model.
		default:
			return nil, fmt.Errorf("loader: liblinear: line %d: unknown header %q", line, f[0])
		}
		if err != nil {
			return nil, fmt.Errorf("loader: liblinear: line %d: %w", line, err)
		}
	}
	switch {
	case !liblinearLR[solver]:
		return nil, fmt.Errorf("loader: liblinear: solver %q gives no probabilities; use -s 0, 6 or 7 (logistic regression)", solver)
	case nrClass != 2 || len(labels) != 2:
		return nil, fmt.Errorf("loader: liblinear: %d classes; only binary models are supported", nrClass)
	case nrFeature < 0:
		return nil, fmt.Errorf("loader: liblinear: missing nr_feature")
	}
	sign := 0.0
	switch positiveLabel {
	case labels[0]:
		sign = 1
	case labels[1]:
		sign = -1
	default:
		return nil, fmt.Errorf("loader: liblinear: positive label %q is not one of the model's labels %v", positiveLabel, labels)
	}
	n := nrFeature
	if bias >= 0 {
		n++
	}
	m := &Sparse{Type: codec.TypeLR}
	for i := 0; i < n; i++ {
		if !sc.Scan() {
			if err := sc.Err(); err != nil {
				return nil, fmt.Errorf("loader: liblinear: %w", err)
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
		case i == nrFeature:
			m.Bias = bias * w
		case w != 0:
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
		return nil, fmt.Errorf("loader: liblinear: %w", err)
	}
	return m, m.check()
}
