package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, c := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"release build",
			debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"},
				Settings: vcs("-compiler", "gc", "vcs", "git", "vcs.revision", "59bd63e7f2a1c0ffee", "vcs.time", "2026-11-22T04:53:42Z", "vcs.modified", "false")},
			"v1.2.3 (rev 59bd63e, 2026-11-22T04:53:42Z) go1.26.8"},
		{"dirty work tree",
			debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261122045342-59bd63e7f2a1+dirty"},
				Settings: vcs("vcs.revision", "59bd63e7f2a1c0ffee", "vcs.time", "2026-11-22T04:53:42Z", "vcs.modified", "true")},
			"v0.0.0-20261122045342-59bd63e7f2a1+dirty (rev 59bd63e, modified, 2026-11-22T04:53:42Z) go1.26.8"},
		{"test binary or -buildvcs=false",
			debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/cumulus-serving/cumulus", Version: "(devel)"},
				Settings: vcs("-buildmode", "exe", "GOOS", "linux")},
			"(devel) go1.26.8"},
		{"short revision kept whole",
			debug.BuildInfo{GoVersion: "go1.26.8", Settings: vcs("vcs.revision", "abc")},
			"(devel) (rev abc) go1.26.8"},
		{"nothing recorded",
			debug.BuildInfo{},
			"(devel) " + runtime.Version()},
	} {
		if got := format(&c.bi); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}

// This test binary carries real build information; String must show at
// least the toolchain that built it.
func TestString(t *testing.T) {
	s := String()
	if !strings.HasSuffix(s, " "+runtime.Version()) || strings.Contains(s, "\n") {
		t.Fatalf("String() = %q, want one line ending in %s", s, runtime.Version())
	}
}
