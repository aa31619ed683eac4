// Package buildinfo describes the running binary in one line, for
// `cumulus --version` and bug reports: the module version, the commit it
// was built from and whether the work tree had changes, the commit time
// and the Go version, all read from what the Go toolchain embeds
// (runtime/debug.ReadBuildInfo), so no linker flags are needed.
//
// Fields the toolchain did not record are left out rather than guessed:
// test binaries and builds with -buildvcs=false carry no VCS settings,
// and a build outside a module has no version. The formatting is a pure
// function of a debug.BuildInfo, tested with table cases.
package buildinfo
