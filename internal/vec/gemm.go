package vec

// Gemm adds the product of x (rows × k, row stride ldx) and w (k × cols,
// row stride ldw) to y (rows × cols, row stride ldy):
//
//	y[r·ldy+c] += Σ_{i<k} x[r·ldx+i] · w[i·ldw+c]
//
// Blocks of 12 rows × 32 columns run in an AVX-512 kernel, blocks of 6
// × 16 in an AVX2 one (both with FMA), the rest in Go. It allocates
// nothing. Strides are in elements; the slices must hold what they
// describe.
func Gemm(y []float32, ldy int, x []float32, ldx int, w []float32, ldw int, rows, cols, k int) {
	if rows == 0 || cols == 0 || k == 0 {
		return
	}
	_ = y[(rows-1)*ldy+cols-1]
	_ = x[(rows-1)*ldx+k-1]
	_ = w[(k-1)*ldw+cols-1]
	r := 0
	if useAVX512 {
		for ; r+12 <= rows; r += 12 {
			c := 0
			for ; c+32 <= cols; c += 32 {
				tile12x32(&x[r*ldx], ldx, &w[c], ldw, &y[r*ldy+c], ldy, k)
			}
			if c < cols {
				Gemm(y[r*ldy+c:], ldy, x[r*ldx:], ldx, w[c:], ldw, 6, cols-c, k)
				Gemm(y[(r+6)*ldy+c:], ldy, x[(r+6)*ldx:], ldx, w[c:], ldw, 6, cols-c, k)
			}
		}
	}
	if useAVX {
		for ; r+6 <= rows; r += 6 {
			c := 0
			for ; c+16 <= cols; c += 16 {
				tile6x16(&x[r*ldx], ldx, &w[c], ldw, &y[r*ldy+c], ldy, k)
			}
			if c < cols {
				gemmAxpy(y[r*ldy+c:], ldy, x[r*ldx:], ldx, w[c:], ldw, 6, cols-c, k)
			}
		}
	}
	if r < rows {
		gemmAxpy(y[r*ldy:], ldy, x[r*ldx:], ldx, w, ldw, rows-r, cols, k)
	}
}

// gemmAxpy is Gemm one row of w at a time, with Axpy: for the rows and
// columns the block kernels leave.
func gemmAxpy(y []float32, ldy int, x []float32, ldx int, w []float32, ldw int, rows, cols, k int) {
	for r := range rows {
		yr := y[r*ldy : r*ldy+cols]
		for i := range k {
			if a := x[r*ldx+i]; a != 0 {
				Axpy(yr, a, w[i*ldw:i*ldw+cols])
			}
		}
	}
}

// RowBlock is the number of rows Gemm's widest kernel takes at once: a
// caller that pads its rows to a multiple of it (with zero rows) has all
// of them multiplied by that kernel.
func RowBlock() int {
	switch {
	case useAVX512:
		return 12
	case useAVX:
		return 6
	}
	return 1
}

// gemmGo is Gemm in plain Go: the reference the kernel is tested against,
// and the kernel where there is no assembly.
func gemmGo(y []float32, ldy int, x []float32, ldx int, w []float32, ldw int, rows, cols, k int) {
	for r := range rows {
		yr := y[r*ldy : r*ldy+cols]
		for i := range k {
			if a := x[r*ldx+i]; a != 0 {
				axpyGo(yr, a, w[i*ldw:i*ldw+cols])
			}
		}
	}
}
