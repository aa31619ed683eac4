package shard

import "unsafe"

// Implemented in window_amd64.s; see the Go reference in window.go.

//go:noescape
func hashGroup(s *winGroup, keys *uint64, n int, nb uint64, dir unsafe.Pointer)

//go:noescape
func placeGroup(s *winGroup, n int, dir, rec unsafe.Pointer, rs uintptr, last int64)

//go:noescape
func settleGroup(s *winGroup, n int, rec unsafe.Pointer, rs uintptr, count int64, out *int32, w *float32) (miss uint64)
