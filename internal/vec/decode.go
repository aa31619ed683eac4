package vec

import (
	"encoding/binary"

	"github.com/x448/float16"
)

// The decoders turn factors as a partition file stores them (and a shard
// sends them, codec's stored records) into the float32s scorers read.
// Both are exact: a half converts to the float32 of the same value, and
// an int8 factor is float32(q)·scale rounded once, as codec.DecodeRecord
// computes it; the assembly and the Go twins agree bit for bit.

// FromHalf converts len(dst) IEEE half floats, little-endian in src
// (2·len(dst) bytes), to float32.
func FromHalf(dst []float32, src []byte) {
	if len(dst) == 0 {
		return
	}
	_ = src[2*len(dst)-1]
	if useF16C {
		n := len(dst) &^ 7
		if n > 0 {
			fromHalfAVX(&dst[0], &src[0], n)
		}
		fromHalfGo(dst[n:], src[2*n:])
		return
	}
	fromHalfGo(dst, src)
}

// FromInt8 sets dst[i] = float32(int8(src[i]))·scale for i < len(dst).
func FromInt8(dst []float32, src []byte, scale float32) {
	if len(dst) == 0 {
		return
	}
	_ = src[len(dst)-1]
	if useAVX {
		n := len(dst) &^ 7
		if n > 0 {
			fromInt8AVX(&dst[0], &src[0], scale, n)
		}
		fromInt8Go(dst[n:], src[n:], scale)
		return
	}
	fromInt8Go(dst, src, scale)
}

func fromHalfGo(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = float16.Frombits(binary.LittleEndian.Uint16(src[2*i:])).Float32()
	}
}

func fromInt8Go(dst []float32, src []byte, scale float32) {
	src = src[:len(dst)]
	for i, q := range src {
		dst[i] = float32(int8(q)) * scale
	}
}
