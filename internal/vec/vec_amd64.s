#include "textflag.h"

// func axpyAVX(y, x *float32, a float32, n int)
TEXT ·axpyAVX(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS a+16(FP), Y0
	MOVQ         n+24(FP), CX

axpy32:
	CMPQ        CX, $32
	JL          axpy8
	VMOVUPS     (DI), Y1
	VMOVUPS     32(DI), Y2
	VMOVUPS     64(DI), Y3
	VMOVUPS     96(DI), Y4
	VFMADD231PS (SI), Y0, Y1
	VFMADD231PS 32(SI), Y0, Y2
	VFMADD231PS 64(SI), Y0, Y3
	VFMADD231PS 96(SI), Y0, Y4
	VMOVUPS     Y1, (DI)
	VMOVUPS     Y2, 32(DI)
	VMOVUPS     Y3, 64(DI)
	VMOVUPS     Y4, 96(DI)
	ADDQ        $128, DI
	ADDQ        $128, SI
	SUBQ        $32, CX
	JMP         axpy32

axpy8:
	CMPQ        CX, $8
	JL          axpy1
	VMOVUPS     (DI), Y1
	VFMADD231PS (SI), Y0, Y1
	VMOVUPS     Y1, (DI)
	ADDQ        $32, DI
	ADDQ        $32, SI
	SUBQ        $8, CX
	JMP         axpy8

axpy1:
	CMPQ        CX, $0
	JE          axpydone
	VMOVSS      (DI), X1
	VFMADD231SS (SI), X0, X1
	VMOVSS      X1, (DI)
	ADDQ        $4, DI
	ADDQ        $4, SI
	DECQ        CX
	JMP         axpy1

axpydone:
	VZEROUPPER
	RET

// func dotAVX(x, y *float32, n int) float32
TEXT ·dotAVX(SB), NOSPLIT, $0-28
	MOVQ   x+0(FP), SI
	MOVQ   y+8(FP), DI
	MOVQ   n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

dot32:
	CMPQ        CX, $32
	JL          dot8
	VMOVUPS     (SI), Y4
	VMOVUPS     32(SI), Y5
	VMOVUPS     64(SI), Y6
	VMOVUPS     96(SI), Y7
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	VFMADD231PS 64(DI), Y6, Y2
	VFMADD231PS 96(DI), Y7, Y3
	ADDQ        $128, SI
	ADDQ        $128, DI
	SUBQ        $32, CX
	JMP         dot32

dot8:
	CMPQ        CX, $8
	JL          dotreduce
	VMOVUPS     (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	ADDQ        $32, SI
	ADDQ        $32, DI
	SUBQ        $8, CX
	JMP         dot8

dotreduce:
	VADDPS       Y1, Y0, Y0
	VADDPS       Y3, Y2, Y2
	VADDPS       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0

dot1:
	CMPQ        CX, $0
	JE          dotdone
	VMOVSS      (SI), X4
	VFMADD231SS (DI), X4, X0
	ADDQ        $4, SI
	ADDQ        $4, DI
	DECQ        CX
	JMP         dot1

dotdone:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func tile6x16(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k int)
//
// Y0..Y11 hold the 6×16 block of y (row r in Y(2r), Y(2r+1)); each step
// loads one row of w (Y12, Y13), broadcasts one element of each x row and
// adds their products: 12 FMAs per 2 loads and 6 broadcasts.
TEXT ·tile6x16(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ ldx+8(FP), R8
	SHLQ $2, R8
	MOVQ w+16(FP), DX
	MOVQ ldw+24(FP), R9
	SHLQ $2, R9
	MOVQ y+32(FP), DI
	MOVQ ldy+40(FP), R10
	SHLQ $2, R10
	MOVQ k+48(FP), CX

	// x row pointers: SI, R11, R12, R13, R14, BX
	LEAQ (SI)(R8*1), R11
	LEAQ (R11)(R8*1), R12
	LEAQ (R12)(R8*1), R13
	LEAQ (R13)(R8*1), R14
	LEAQ (R14)(R8*1), BX

	// y row pointers: DI and DI + n·R10, kept in AX while loading
	MOVQ    DI, AX
	VMOVUPS (AX), Y0
	VMOVUPS 32(AX), Y1
	ADDQ    R10, AX
	VMOVUPS (AX), Y2
	VMOVUPS 32(AX), Y3
	ADDQ    R10, AX
	VMOVUPS (AX), Y4
	VMOVUPS 32(AX), Y5
	ADDQ    R10, AX
	VMOVUPS (AX), Y6
	VMOVUPS 32(AX), Y7
	ADDQ    R10, AX
	VMOVUPS (AX), Y8
	VMOVUPS 32(AX), Y9
	ADDQ    R10, AX
	VMOVUPS (AX), Y10
	VMOVUPS 32(AX), Y11

	XORQ AX, AX // byte offset into the x rows

tileloop:
	VMOVUPS      (DX), Y12
	VMOVUPS      32(DX), Y13
	VBROADCASTSS (SI)(AX*1), Y14
	VBROADCASTSS (R11)(AX*1), Y15
	VFMADD231PS  Y12, Y14, Y0
	VFMADD231PS  Y13, Y14, Y1
	VFMADD231PS  Y12, Y15, Y2
	VFMADD231PS  Y13, Y15, Y3
	VBROADCASTSS (R12)(AX*1), Y14
	VBROADCASTSS (R13)(AX*1), Y15
	VFMADD231PS  Y12, Y14, Y4
	VFMADD231PS  Y13, Y14, Y5
	VFMADD231PS  Y12, Y15, Y6
	VFMADD231PS  Y13, Y15, Y7
	VBROADCASTSS (R14)(AX*1), Y14
	VBROADCASTSS (BX)(AX*1), Y15
	VFMADD231PS  Y12, Y14, Y8
	VFMADD231PS  Y13, Y14, Y9
	VFMADD231PS  Y12, Y15, Y10
	VFMADD231PS  Y13, Y15, Y11
	ADDQ         $4, AX
	ADDQ         R9, DX
	DECQ         CX
	JNZ          tileloop

	MOVQ    DI, AX
	VMOVUPS Y0, (AX)
	VMOVUPS Y1, 32(AX)
	ADDQ    R10, AX
	VMOVUPS Y2, (AX)
	VMOVUPS Y3, 32(AX)
	ADDQ    R10, AX
	VMOVUPS Y4, (AX)
	VMOVUPS Y5, 32(AX)
	ADDQ    R10, AX
	VMOVUPS Y6, (AX)
	VMOVUPS Y7, 32(AX)
	ADDQ    R10, AX
	VMOVUPS Y8, (AX)
	VMOVUPS Y9, 32(AX)
	ADDQ    R10, AX
	VMOVUPS Y10, (AX)
	VMOVUPS Y11, 32(AX)
	VZEROUPPER
	RET

// func tile12x32(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k int)
//
// The AVX-512 kernel: Z0..Z23 hold a 12×32 block of y (row r in Z(2r),
// Z(2r+1)); each step loads one row of w (Z24, Z25), broadcasts one
// element of each x row and adds their products: 24 FMAs per 2 loads and
// 12 broadcasts. x rows are addressed from four bases three rows apart.
TEXT ·tile12x32(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ ldx+8(FP), R8
	SHLQ $2, R8
	MOVQ w+16(FP), DX
	MOVQ ldw+24(FP), R9
	SHLQ $2, R9
	MOVQ y+32(FP), DI
	MOVQ ldy+40(FP), R10
	SHLQ $2, R10
	MOVQ k+48(FP), CX

	LEAQ (R8)(R8*2), BX // three rows
	LEAQ (SI)(BX*1), R11
	LEAQ (R11)(BX*1), R12
	LEAQ (R12)(BX*1), R13

	MOVQ    DI, AX
	VMOVUPS (AX), Z0
	VMOVUPS 64(AX), Z1
	ADDQ    R10, AX
	VMOVUPS (AX), Z2
	VMOVUPS 64(AX), Z3
	ADDQ    R10, AX
	VMOVUPS (AX), Z4
	VMOVUPS 64(AX), Z5
	ADDQ    R10, AX
	VMOVUPS (AX), Z6
	VMOVUPS 64(AX), Z7
	ADDQ    R10, AX
	VMOVUPS (AX), Z8
	VMOVUPS 64(AX), Z9
	ADDQ    R10, AX
	VMOVUPS (AX), Z10
	VMOVUPS 64(AX), Z11
	ADDQ    R10, AX
	VMOVUPS (AX), Z12
	VMOVUPS 64(AX), Z13
	ADDQ    R10, AX
	VMOVUPS (AX), Z14
	VMOVUPS 64(AX), Z15
	ADDQ    R10, AX
	VMOVUPS (AX), Z16
	VMOVUPS 64(AX), Z17
	ADDQ    R10, AX
	VMOVUPS (AX), Z18
	VMOVUPS 64(AX), Z19
	ADDQ    R10, AX
	VMOVUPS (AX), Z20
	VMOVUPS 64(AX), Z21
	ADDQ    R10, AX
	VMOVUPS (AX), Z22
	VMOVUPS 64(AX), Z23

tile512loop:
	VMOVUPS (DX), Z24
	VMOVUPS 64(DX), Z25
	VBROADCASTSS (SI), Z26
	VFMADD231PS  Z24, Z26, Z0
	VFMADD231PS  Z25, Z26, Z1
	VBROADCASTSS (SI)(R8*1), Z27
	VFMADD231PS  Z24, Z27, Z2
	VFMADD231PS  Z25, Z27, Z3
	VBROADCASTSS (SI)(R8*2), Z26
	VFMADD231PS  Z24, Z26, Z4
	VFMADD231PS  Z25, Z26, Z5
	VBROADCASTSS (R11), Z27
	VFMADD231PS  Z24, Z27, Z6
	VFMADD231PS  Z25, Z27, Z7
	VBROADCASTSS (R11)(R8*1), Z26
	VFMADD231PS  Z24, Z26, Z8
	VFMADD231PS  Z25, Z26, Z9
	VBROADCASTSS (R11)(R8*2), Z27
	VFMADD231PS  Z24, Z27, Z10
	VFMADD231PS  Z25, Z27, Z11
	VBROADCASTSS (R12), Z26
	VFMADD231PS  Z24, Z26, Z12
	VFMADD231PS  Z25, Z26, Z13
	VBROADCASTSS (R12)(R8*1), Z27
	VFMADD231PS  Z24, Z27, Z14
	VFMADD231PS  Z25, Z27, Z15
	VBROADCASTSS (R12)(R8*2), Z26
	VFMADD231PS  Z24, Z26, Z16
	VFMADD231PS  Z25, Z26, Z17
	VBROADCASTSS (R13), Z27
	VFMADD231PS  Z24, Z27, Z18
	VFMADD231PS  Z25, Z27, Z19
	VBROADCASTSS (R13)(R8*1), Z26
	VFMADD231PS  Z24, Z26, Z20
	VFMADD231PS  Z25, Z26, Z21
	VBROADCASTSS (R13)(R8*2), Z27
	VFMADD231PS  Z24, Z27, Z22
	VFMADD231PS  Z25, Z27, Z23
	ADDQ         $4, SI
	ADDQ         $4, R11
	ADDQ         $4, R12
	ADDQ         $4, R13
	ADDQ         R9, DX
	DECQ         CX
	JNZ          tile512loop

	MOVQ    DI, AX
	VMOVUPS Z0, (AX)
	VMOVUPS Z1, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z2, (AX)
	VMOVUPS Z3, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z4, (AX)
	VMOVUPS Z5, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z6, (AX)
	VMOVUPS Z7, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z8, (AX)
	VMOVUPS Z9, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z10, (AX)
	VMOVUPS Z11, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z12, (AX)
	VMOVUPS Z13, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z14, (AX)
	VMOVUPS Z15, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z16, (AX)
	VMOVUPS Z17, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z18, (AX)
	VMOVUPS Z19, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z20, (AX)
	VMOVUPS Z21, 64(AX)
	ADDQ    R10, AX
	VMOVUPS Z22, (AX)
	VMOVUPS Z23, 64(AX)
	VZEROUPPER
	RET

// func reluAVX(v *float32, n int): max(v, 0), branch-free (a branch per
// element would be mispredicted half the time).
TEXT ·reluAVX(SB), NOSPLIT, $0-16
	MOVQ   v+0(FP), DI
	MOVQ   n+8(FP), CX
	VXORPS Y0, Y0, Y0

relu32:
	CMPQ    CX, $32
	JL      relu8
	VMAXPS  (DI), Y0, Y1
	VMAXPS  32(DI), Y0, Y2
	VMAXPS  64(DI), Y0, Y3
	VMAXPS  96(DI), Y0, Y4
	VMOVUPS Y1, (DI)
	VMOVUPS Y2, 32(DI)
	VMOVUPS Y3, 64(DI)
	VMOVUPS Y4, 96(DI)
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     relu32

relu8:
	CMPQ    CX, $8
	JL      relu1
	VMAXPS  (DI), Y0, Y1
	VMOVUPS Y1, (DI)
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     relu8

relu1:
	CMPQ   CX, $0
	JE     reludone
	VMAXSS (DI), X0, X1
	VMOVSS X1, (DI)
	ADDQ   $4, DI
	DECQ   CX
	JMP    relu1

reludone:
	VZEROUPPER
	RET

// func fromHalfAVX(dst *float32, src *byte, n int): n a multiple of 8.
TEXT ·fromHalfAVX(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

half32:
	CMPQ      CX, $32
	JL        half8
	VCVTPH2PS (SI), Y0
	VCVTPH2PS 16(SI), Y1
	VCVTPH2PS 32(SI), Y2
	VCVTPH2PS 48(SI), Y3
	VMOVUPS   Y0, (DI)
	VMOVUPS   Y1, 32(DI)
	VMOVUPS   Y2, 64(DI)
	VMOVUPS   Y3, 96(DI)
	ADDQ      $64, SI
	ADDQ      $128, DI
	SUBQ      $32, CX
	JMP       half32

half8:
	CMPQ      CX, $0
	JE        halfdone
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JMP       half8

halfdone:
	VZEROUPPER
	RET

// func fromInt8AVX(dst *float32, src *byte, scale float32, n int): n a
// multiple of 8. Sign-extend to int32, convert (exact: |q| ≤ 128), and
// multiply once by scale, rounding as Go's float32 product does.
TEXT ·fromInt8AVX(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	VBROADCASTSS scale+16(FP), Y4
	MOVQ         n+24(FP), CX

q32:
	CMPQ      CX, $32
	JL        q8
	VPMOVSXBD (SI), Y0
	VPMOVSXBD 8(SI), Y1
	VPMOVSXBD 16(SI), Y2
	VPMOVSXBD 24(SI), Y3
	VCVTDQ2PS Y0, Y0
	VCVTDQ2PS Y1, Y1
	VCVTDQ2PS Y2, Y2
	VCVTDQ2PS Y3, Y3
	VMULPS    Y4, Y0, Y0
	VMULPS    Y4, Y1, Y1
	VMULPS    Y4, Y2, Y2
	VMULPS    Y4, Y3, Y3
	VMOVUPS   Y0, (DI)
	VMOVUPS   Y1, 32(DI)
	VMOVUPS   Y2, 64(DI)
	VMOVUPS   Y3, 96(DI)
	ADDQ      $32, SI
	ADDQ      $128, DI
	SUBQ      $32, CX
	JMP       q32

q8:
	CMPQ      CX, $0
	JE        qdone
	VPMOVSXBD (SI), Y0
	VCVTDQ2PS Y0, Y0
	VMULPS    Y4, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $8, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JMP       q8

qdone:
	VZEROUPPER
	RET
