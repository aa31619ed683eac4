package main

import (
	"github.com/dustin/go-humanize"
)

// byteSize is a flag taking sizes like 1.5GB or 512MiB.
type byteSize int64

func (b *byteSize) String() string {
	if *b == 0 {
		return "0"
	}
	return humanize.IBytes(uint64(*b))
}

func (b *byteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func (b *byteSize) Type() string { return "bytes" }
