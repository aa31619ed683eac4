package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// String describes the running binary, e.g.
//
//	v0.0.0-20261122045342-59bd63e7f2a1+dirty (rev 59bd63e, modified, 2026-11-22T04:53:42Z) go1.26.8
func String() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown) " + runtime.Version()
	}
	return format(bi)
}

// format is String for a given build: "VERSION (rev R, modified, TIME)
// GO". VERSION is "(devel)" when the toolchain recorded none; the
// parenthesis lists only the VCS settings present and is left out when
// there are none.
func format(bi *debug.BuildInfo) string {
	version := bi.Main.Version
	if version == "" {
		version = "(devel)"
	}
	var vcs []string
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		vcs = append(vcs, "rev "+rev[:min(len(rev), 7)])
	}
	if settings["vcs.modified"] == "true" {
		vcs = append(vcs, "modified")
	}
	if t := settings["vcs.time"]; t != "" {
		vcs = append(vcs, t)
	}
	goVersion := bi.GoVersion
	if goVersion == "" {
		goVersion = runtime.Version()
	}
	var b strings.Builder
	b.WriteString(version)
	if len(vcs) > 0 {
		b.WriteString(" (" + strings.Join(vcs, ", ") + ")")
	}
	b.WriteString(" " + goVersion)
	return b.String()
}
