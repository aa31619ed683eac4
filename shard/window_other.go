//go:build !amd64

package shard

var (
	hashGroup   = hashGroupGo
	placeGroup  = placeGroupGo
	settleGroup = settleGroupGo
)
