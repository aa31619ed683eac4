package shard

// scanWindows is scanWindowsGo in assembly (window_amd64.s).
//
//go:noescape
func scanWindows(a *windowScan)
