// Package loader reads and writes model repositories.
//
// A repository is a directory: DIR/NAME/VERSION/{manifest.json,
// part-NNNNN.bin}. Writers (VersionWriter, Publish, Generate) build a
// version in a hidden directory and rename it into place after the
// manifest, so readers never see half a version. A version number is
// never reused: writers take the model's lock (an flock, so it holds
// across processes) and number past the model's high-water mark, a file
// kept beside the versions. ReadPartition verifies
// size, SHA-256 and structure before returning a partition and names the
// damaged file otherwise (a file whose SHA-256 matches is the one
// validated: its block checksums, checked by Verify, add nothing). MapPartitionCopy does the same for a
// partition served mapped, from a copy in a directory the caller owns:
// repository files are never mapped, since a mapping would show any later
// change to them.
//
// Importers turn other tools' models into a Sparse model: LIBLINEAR
// (ImportLIBLINEAR; tested against the real liblinear-train/predict) and
// Cumulus's TSV text format (ParseTSV). Generate writes synthetic models
// of any size one partition at a time.
//
// Nothing here starts goroutines that outlive a call; Publish and
// Generate write partitions in parallel, GOMAXPROCS at a time.
//
// The importers read what users hand in, so they are fuzzed, with
// oracles for what an accepted file must mean and what a refusal must
// say (import_fuzz_test.go); the kept corpora are in testdata/fuzz. Run
// one at a time: go test ./loader -run XXX -fuzz FuzzParseTSV -fuzztime 60s.
package loader
