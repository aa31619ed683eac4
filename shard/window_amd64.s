#include "textflag.h"
#include "go_asm.h"

// func scanWindows(a *windowScan)
TEXT ·scanWindows(SB), NOSPLIT|NOFRAME, $0-8
#include "window_amd64.h"

// func scanWindowsQ(a *windowScan)
#define QUOTIENT
TEXT ·scanWindowsQ(SB), NOSPLIT|NOFRAME, $0-8
#include "window_amd64.h"
