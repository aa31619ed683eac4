//go:build !amd64

package shard

func scanWindows(a *windowScan)  { scanWindowsGo(a) }
func scanWindowsQ(a *windowScan) { scanWindowsGo(a) }
