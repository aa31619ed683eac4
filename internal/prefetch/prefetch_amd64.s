#include "textflag.h"

// func Line(addr uintptr)
TEXT ·Line(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ addr+0(FP), AX
	PREFETCHT0 (AX)
	RET

// func Range(addr, n uintptr)
// Counts the lines (from addr's to the last byte's), so that a range at
// the top of the address space does not wrap around.
TEXT ·Range(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ addr+0(FP), AX
	MOVQ n+8(FP), CX
	TESTQ CX, CX
	JZ   done
	LEAQ -1(AX)(CX*1), CX // the last byte
	SHRQ $6, CX
	MOVQ AX, DX
	SHRQ $6, DX
	SUBQ DX, CX
	INCQ CX               // lines
	ANDQ $~63, AX
loop:
	PREFETCHT0 (AX)
	ADDQ $64, AX
	DECQ CX
	JNZ  loop
done:
	RET
