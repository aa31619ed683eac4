package shard

// scanWindows is scanWindowsGo in assembly (window_amd64.s), for whole
// keys (formats 2 and 3).
//
//go:noescape
func scanWindows(a *windowScan)

// scanWindowsQ is scanWindows for quotiented keys (format 4): the same
// code assembled with its windows inside their key's bucket and its key
// words masked, so neither pays the other's branches.
//
//go:noescape
func scanWindowsQ(a *windowScan)
