#include "textflag.h"
#include "go_asm.h"

// The stages of findWindow (window.go, where the Go reference of each
// function below lives). Registers only, no calls, no stack frame.

// func hashGroup(s *winGroup, keys *uint64, n int, nb uint64, dir unsafe.Pointer)
TEXT ·hashGroup(SB), NOSPLIT|NOFRAME, $0-40
	MOVQ s+0(FP), DI
	MOVQ keys+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ nb+24(FP), R8
	MOVQ dir+32(FP), R9
	MOVQ $0xbf58476d1ce4e5b9, R10
	MOVQ $0x94d049bb133111eb, R11
	XORL BX, BX
	TESTQ CX, CX
	JLE hdone

hloop:
	// h = codec.KeyHash(keys[j]), splitmix64's finalizer
	MOVQ (SI)(BX*8), AX
	MOVQ AX, DX
	SHRQ $30, DX
	XORQ DX, AX
	IMULQ R10, AX
	MOVQ AX, DX
	SHRQ $27, DX
	XORQ DX, AX
	IMULQ R11, AX
	MOVQ AX, DX
	SHRQ $31, DX
	XORQ DX, AX
	MOVQ AX, winGroup_hs(DI)(BX*8)
	// bucket, frac = h × nb (high, low)
	MULQ R8
	MOVQ AX, winGroup_frac(DI)(BX*8)
	MOVQ DX, winGroup_bucket(DI)(BX*8)
	PREFETCHT0 (R9)(DX*4)
	INCQ BX
	CMPQ BX, CX
	JLT hloop

hdone:
	RET

// func placeGroup(s *winGroup, n int, dir, rec unsafe.Pointer, rs uintptr, last int64)
TEXT ·placeGroup(SB), NOSPLIT|NOFRAME, $0-48
	MOVQ s+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ dir+16(FP), R9
	MOVQ rec+24(FP), R10
	MOVQ rs+32(FP), R11
	MOVQ last+40(FP), R12
	MOVQ R11, R13
	SHLQ $3, R13
	DECQ R13 // window*rs - 1: the window's last byte
	XORL BX, BX
	TESTQ CX, CX
	JLE pdone

ploop:
	// lo, hi = the bucket's directory entries, in one load
	MOVQ winGroup_bucket(DI)(BX*8), AX
	MOVQ (R9)(AX*4), SI
	MOVL SI, R8 // lo
	SHRQ $32, SI
	SUBQ R8, SI // hi - lo
	// start = clamp(lo + high(frac × (hi-lo)) - window/2, 0, last)
	MOVQ winGroup_frac(DI)(BX*8), AX
	MULQ SI
	LEAQ -4(R8)(DX*1), AX
	CMPQ AX, R12
	CMOVQGT R12, AX
	XORL DX, DX
	TESTQ AX, AX
	CMOVQLT DX, AX
	MOVL AX, winGroup_start(DI)(BX*4)
	// prefetch the window's lines
	IMULQ R11, AX
	ADDQ R10, AX
	PREFETCHT0 (AX)
	PREFETCHT0 64(AX)
	PREFETCHT0 (AX)(R13*1)
	INCQ BX
	CMPQ BX, CX
	JLT ploop

pdone:
	RET

// func settleGroup(s *winGroup, n int, rec unsafe.Pointer, rs uintptr, count int64, out *int32, w *float32) (miss uint64)
TEXT ·settleGroup(SB), NOSPLIT|NOFRAME, $0-64
	MOVQ s+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ rec+16(FP), R9
	MOVQ rs+24(FP), R11
	MOVQ count+32(FP), R10
	MOVQ out+40(FP), R12
	MOVQ w+48(FP), R13
	XORL AX, AX
	MOVQ AX, miss+56(FP)
	XORL BX, BX
	TESTQ CX, CX
	JLE sdone

sloop:
	MOVQ winGroup_hs(DI)(BX*8), R8
	MOVLQSX winGroup_start(DI)(BX*4), DX
	MOVQ DX, SI
	IMULQ R11, SI
	ADDQ R9, SI // the window's first record
	// AX = how many of the window's 8 records are below h (unsigned):
	// CMPQ sets the carry exactly when the record is below h.
	XORL AX, AX
	MOVQ SI, CX
	CMPQ (CX), R8
	ADCQ $0, AX
	ADDQ R11, CX
	CMPQ (CX), R8
	ADCQ $0, AX
	ADDQ R11, CX
	CMPQ (CX), R8
	ADCQ $0, AX
	ADDQ R11, CX
	CMPQ (CX), R8
	ADCQ $0, AX
	ADDQ R11, CX
	CMPQ (CX), R8
	ADCQ $0, AX
	ADDQ R11, CX
	CMPQ (CX), R8
	ADCQ $0, AX
	ADDQ R11, CX
	CMPQ (CX), R8
	ADCQ $0, AX
	ADDQ R11, CX
	CMPQ (CX), R8
	ADCQ $0, AX
	// the key's place: record start+AX at SI + AX*rs
	ADDQ AX, DX
	MOVQ AX, CX
	IMULQ R11, CX
	ADDQ SI, CX
	CMPQ DX, R10
	JGE absent
	CMPQ (CX), R8
	JNE absent
	MOVL DX, (R12)(BX*4)
	TESTQ R13, R13
	JEQ next
	MOVL 8(CX), DX // the record's fp32 weight
	MOVL DX, (R13)(BX*4)
	JMP next

absent:
	// A count of 0 or 8 does not prove h absent: its place may lie
	// outside the window. Leave it to the caller.
	TESTQ AX, AX
	JEQ outside
	CMPQ AX, $8
	JEQ outside
	MOVL $-1, (R12)(BX*4)
	TESTQ R13, R13
	JEQ next
	MOVL $0, (R13)(BX*4)
	JMP next

outside:
	MOVQ miss+56(FP), AX
	BTSQ BX, AX
	MOVQ AX, miss+56(FP)

next:
	INCQ BX
	CMPQ BX, n+8(FP)
	JLT sloop

sdone:
	RET
