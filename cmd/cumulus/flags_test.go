package main

import (
	"strings"
	"testing"
)

// TestByteSize: sizes parse as humanize reads them; 0 only when it is
// said, never from a fraction of a byte rounded down (0 means "no
// bound" to --memory-budget); what is not a size is refused with a
// reason a user can read.
func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "0MB": 0, "0.0 GiB": 0, "4096": 4096, "512MiB": 512 << 20, "1.5GB": 1_500_000_000, "2mb": 2_000_000,
		"0.4KiB": 409, // 409.6 bytes, rounded down: a size still
	} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("%q: %d, %v; want %d", in, b, err, want)
		}
	}
	for in, reason := range map[string]string{
		"0.5":   "less than a byte",
		"-5":    "not a size",
		"bogus": "not a size",
		"":      "not a size",
		"10EB":  "too large",
		"20EB":  "too large",
	} {
		var b byteSize
		if err := b.Set(in); err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("%q: %d, %v; want an error saying %q", in, b, err, reason)
		}
	}
}
