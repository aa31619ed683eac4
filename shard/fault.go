package shard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Faults are failures a shard injects into its own lookups on purpose,
// for tests, benchmarks and operators' drills (--fault, PUT
// /admin/v1/fault). A spec is one or more ";"-separated faults, each
// KIND[=ARG],fraction=F (F defaults to 1), each drawn independently per
// lookup, in order:
//
//	delay=50ms,fraction=0.01     answer 50ms late
//	error=unavailable,fraction=0.1  fail with that gRPC code (lower_snake)
//	stall,fraction=0.001         never answer: ends when the caller cancels
//	diskdelay=5ms,fraction=0.5   each read from disk (of a partition over
//	                             the memory budget) waits 5ms first
//
// They apply after admission, as a real slow lookup would; diskdelay
// applies to each read, as a slow disk would, and only lookups that read
// from disk see it.
type Faults struct {
	spec   string
	faults []fault
}

type fault struct {
	kind     string // delay, error, stall, diskdelay
	delay    time.Duration
	code     codes.Code
	fraction float64
}

// maxFaultSpec bounds a spec's length: it arrives over the network.
const maxFaultSpec = 1024

// ParseFaults reads a fault spec; an empty one is no faults (nil).
func ParseFaults(spec string) (*Faults, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	if len(spec) > maxFaultSpec {
		return nil, fmt.Errorf("fault spec of %d bytes is over the limit of %d", len(spec), maxFaultSpec)
	}
	f := &Faults{spec: spec}
	for _, one := range strings.Split(spec, ";") {
		ft, err := parseFault(strings.TrimSpace(one))
		if err != nil {
			return nil, fmt.Errorf("fault %q: %w", one, err)
		}
		f.faults = append(f.faults, ft)
	}
	return f, nil
}

func parseFault(s string) (fault, error) {
	ft := fault{fraction: 1}
	fields := strings.Split(s, ",")
	kind, arg, hasArg := strings.Cut(strings.TrimSpace(fields[0]), "=")
	ft.kind = kind
	switch kind {
	case "delay", "diskdelay":
		d, err := time.ParseDuration(arg)
		if !hasArg || err != nil || d <= 0 {
			return ft, fmt.Errorf("%s needs a positive duration: %s=50ms", kind, kind)
		}
		ft.delay = d
	case "error":
		c, ok := codeNames[arg]
		if !hasArg || !ok {
			return ft, fmt.Errorf("error needs a gRPC code in lower_snake case (one of %s): error=unavailable", strings.Join(codeList, ", "))
		}
		ft.code = c
	case "stall":
		if hasArg {
			return ft, errors.New("stall takes no argument")
		}
	default:
		return ft, errors.New("unknown kind: want delay=DURATION, error=CODE, stall or diskdelay=DURATION")
	}
	seen := false
	for _, kv := range fields[1:] {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		if k != "fraction" || seen {
			return ft, fmt.Errorf("unknown or repeated option %q: the only one is fraction=F", kv)
		}
		seen = true
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || !(x > 0 && x <= 1) {
			return ft, fmt.Errorf("fraction %q: want a number in (0, 1]", v)
		}
		ft.fraction = x
	}
	return ft, nil
}

// codeNames maps each gRPC error code's lower_snake name to it.
var codeNames, codeList = func() (map[string]codes.Code, []string) {
	m := map[string]codes.Code{}
	var l []string
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		var b strings.Builder
		for i, r := range c.String() {
			if unicode.IsUpper(r) && i > 0 {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
		}
		m[b.String()] = c
		l = append(l, b.String())
	}
	return m, l
}()

// faultCounter tallies faults by kind (a Shard).
type faultCounter interface{ countFault(kind string) }

// diskReads is r with f's diskdelay, if it has one, each read it
// delays counted by c. (An interface, not a method value: that would
// be allocated at every lookup.)
func (f *Faults) diskReads(r *ColdReads, c faultCounter) *ColdReads {
	if f == nil {
		return r
	}
	for _, ft := range f.faults {
		if ft.kind == "diskdelay" {
			return r.withDelay(ft.delay, ft.fraction, func() { c.countFault("diskdelay") })
		}
	}
	return r
}

// String is the spec f was parsed from; "" for none.
func (f *Faults) String() string {
	if f == nil {
		return ""
	}
	return f.spec
}

// apply draws each fault for one lookup and acts out those drawn: it
// returns when the delays have passed, or with the error a fault (or
// the caller's giving up) makes. count tallies the faults drawn by kind.
func (f *Faults) apply(ctx context.Context, count func(kind string)) error {
	if f == nil {
		return nil
	}
	for _, ft := range f.faults {
		if ft.kind == "diskdelay" {
			continue // diskReads
		}
		if ft.fraction < 1 && rand.Float64() >= ft.fraction {
			continue
		}
		count(ft.kind)
		switch ft.kind {
		case "delay":
			t := time.NewTimer(ft.delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return status.FromContextError(ctx.Err()).Err()
			}
		case "error":
			return status.Errorf(ft.code, "injected fault: error=%s", codeList[ft.code-1])
		case "stall":
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}
