// The body of scanWindows and scanWindowsQ (window_amd64.s), included
// once for each: QUOTIENT defined assembles the one for quotiented keys
// (format 4), whose windows stay inside their key's bucket and whose key
// words are compared masked. scanWindowsGo in window.go is the
// reference; the stages and their comments match.
//
// Registers: SI the argument block, BX the key being settled (i), R8 n,
// R9 dir, R10 rec, R11 record size rs, R12 keys, R13 3×rs (with rs, 2rs,
// 4rs and 8rs, x86 addressing reaches each of a window's records from two
// base registers). A record's key word is compared whole (CMPQ): in
// format 4 its low bits are the end of the record's value, but the
// probe's are zero, so the word is below the probe exactly when its key
// bits are; the key's place is then checked masked.
	MOVQ a+0(FP), SI
	MOVQ windowScan_n(SI), R8
	MOVQ windowScan_dir(SI), R9
	MOVQ windowScan_rec(SI), R10
	MOVQ windowScan_rs(SI), R11
	MOVQ windowScan_keys(SI), R12
	LEAQ (R11)(R11*2), R13
	MOVQ $-const_hashAhead, BX

loop:
	// Key i+hashAhead: h = KeyHash(key) (splitmix64's finalizer);
	// bucket, frac = h × nb (high, low); probe = h, or in format 4
	// frac & mask; prefetch the directory entry.
	LEAQ const_hashAhead(BX), CX
	CMPQ CX, R8
	JGE place
	MOVQ (R12)(CX*8), AX
	MOVQ AX, DX
	SHRQ $30, DX
	XORQ DX, AX
	MOVQ $0xbf58476d1ce4e5b9, DX
	IMULQ DX, AX
	MOVQ AX, DX
	SHRQ $27, DX
	XORQ DX, AX
	MOVQ $0x94d049bb133111eb, DX
	IMULQ DX, AX
	MOVQ AX, DX
	SHRQ $31, DX
	XORQ DX, AX
	ANDQ $(const_ringSize-1), CX
#ifndef QUOTIENT
	MOVQ AX, windowScan_probe(SI)(CX*8)
#endif
	MULQ windowScan_nb(SI)
	MOVQ AX, windowScan_frac(SI)(CX*8)
	MOVQ DX, windowScan_bucket(SI)(CX*8)
#ifdef QUOTIENT
	ANDQ windowScan_mask(SI), AX
	MOVQ AX, windowScan_probe(SI)(CX*8)
#endif
	PREFETCHT0 (R9)(DX*4)

place:
	// Key i+placeAhead: lo, hi = the bucket's directory entries in one
	// load; start = clamp(lo + high(frac × (hi-lo)) - window/2) to the
	// records the window may cover: the bucket's in format 4 (or -1,
	// none, if fewer than window), else the table's; prefetch the
	// window's first line into L1, its second and last into L2 (measured
	// faster at 10M keys than all into L1, and no slower in cache;
	// docs/storage.md).
	LEAQ const_placeAhead(BX), CX
	CMPQ CX, R8
	JGE settle
	TESTQ CX, CX
	JLT next
	ANDQ $(const_ringSize-1), CX
	MOVQ CX, DI
	MOVQ windowScan_bucket(SI)(DI*8), AX
	MOVQ (R9)(AX*4), CX
	MOVL CX, R14
	SHRQ $32, CX
#ifdef QUOTIENT
	MOVQ CX, R15
	SUBQ $const_window, R15 // the bucket's last window start
#endif
	SUBQ R14, CX
	MOVQ windowScan_frac(SI)(DI*8), AX
	MULQ CX
	LEAQ -4(R14)(DX*1), AX // -window/2
#ifdef QUOTIENT
	CMPQ R15, R14
	JLT nowindow
#else
	MOVQ windowScan_count(SI), R15
	SUBQ $const_window, R15 // the table's last window start
	XORL R14, R14
#endif
	CMPQ AX, R15
	CMOVQGT R15, AX
	CMPQ AX, R14
	CMOVQLT R14, AX
	MOVQ AX, windowScan_start(SI)(DI*8)
	IMULQ R11, AX
	ADDQ R10, AX
	PREFETCHT0 (AX)
	PREFETCHT1 64(AX)
	PREFETCHT1 -1(AX)(R11*8)

settle:
	// Key i: AX = how many of the window's 8 records are below h
	// (CMPQ sets the carry exactly when the record is below h); the
	// key's place is start+AX, checked there unless AX is window.
	TESTQ BX, BX
	JLT next
	MOVQ BX, DI
	ANDQ $(const_ringSize-1), DI
	MOVQ windowScan_probe(SI)(DI*8), R14
	MOVQ windowScan_start(SI)(DI*8), R15
#ifdef QUOTIENT
	TESTQ R15, R15
	JLT outside
#endif
	MOVQ R15, CX
	IMULQ R11, CX
	ADDQ R10, CX
	XORL AX, AX
	LEAQ (CX)(R13*1), DX // record 3
	CMPQ (CX), R14
	ADCQ $0, AX
	CMPQ (CX)(R11*1), R14
	ADCQ $0, AX
	CMPQ (CX)(R11*2), R14
	ADCQ $0, AX
	CMPQ (DX), R14
	ADCQ $0, AX
	CMPQ (CX)(R11*4), R14
	ADCQ $0, AX
	CMPQ (DX)(R11*2), R14
	ADCQ $0, AX
	CMPQ (DX)(R13*1), R14
	ADCQ $0, AX
	CMPQ (DX)(R11*4), R14
	ADCQ $0, AX
	CMPQ AX, $const_window
	JEQ full
	ADDQ AX, R15 // the key's place
	MOVQ R15, CX
	IMULQ R11, CX
	ADDQ R10, CX

check:
	// CX: the key word at place R15, a record the window may cover.
#ifdef QUOTIENT
	MOVQ (CX), DX
	ANDQ windowScan_mask(SI), DX
	CMPQ DX, R14
#else
	CMPQ (CX), R14
#endif
	JNE absent
	MOVQ windowScan_out(SI), DX
	MOVL R15, (DX)(BX*4)
	MOVQ windowScan_w(SI), DX
	TESTQ DX, DX
	JEQ next
#ifdef QUOTIENT
	MOVQ windowScan_woff(SI), R14
	MOVL (CX)(R14*1), CX // the record's fp32 weight
#else
	MOVL 8(CX), CX // the record's fp32 weight
#endif
	MOVL CX, (DX)(BX*4)
	JMP next

full:
	// All the window's records are below h: its place, start + window,
	// is just past the window. If the records the window may cover end
	// there, the key is absent; else it is checked there, and if it is
	// not there it lies outside the window (AX stays window).
	ADDQ AX, R15
#ifdef QUOTIENT
	MOVQ windowScan_bucket(SI)(DI*8), DX
	MOVL 4(R9)(DX*4), DX
#else
	MOVQ windowScan_count(SI), DX
#endif
	CMPQ R15, DX
	JGE none
	MOVQ R15, CX
	IMULQ R11, CX
	ADDQ R10, CX
	JMP check

absent:
	// Not found at its place: absent, unless the count is 0 or window
	// (its place lies outside the window) and records the window does
	// not hold may hold it: below it (count 0, the window starting past
	// the first record it may cover) or above it (count window: full
	// checked that already).
	CMPQ AX, $const_window
	JEQ outside
	TESTQ AX, AX
	JNE none
#ifdef QUOTIENT
	MOVQ windowScan_bucket(SI)(DI*8), DX
	MOVL (R9)(DX*4), DX
	CMPQ R15, DX // start (AX is 0)
#else
	CMPQ R15, $0
#endif
	JGT outside

none:
	MOVQ windowScan_out(SI), DX
	MOVL $-1, (DX)(BX*4)
	MOVQ windowScan_w(SI), DX
	TESTQ DX, DX
	JEQ next
	MOVL $0, (DX)(BX*4)
	JMP next

outside:
	// Mark it, and list it while the list has room.
	MOVQ windowScan_out(SI), DX
	MOVL $const_outside, (DX)(BX*4)
	MOVQ windowScan_nout(SI), AX
	CMPQ AX, $const_outsideCap
	JGE counted
	MOVL BX, windowScan_outs(SI)(AX*4)

counted:
	INCQ AX
	MOVQ AX, windowScan_nout(SI)

next:
	INCQ BX
	CMPQ BX, R8
	JLT loop
	RET
#ifdef QUOTIENT

nowindow:
	// The key's bucket holds fewer records than a window: its key is
	// resolved outside (a bucket of 16 on average, 1% of them).
	MOVQ $-1, windowScan_start(SI)(DI*8)
	JMP settle
#endif
