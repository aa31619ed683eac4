module github.com/cumulus-serving/cumulus

go 1.26.8

require github.com/cespare/xxhash/v2 v2.3.0

require golang.org/x/sync v0.24.0 // indirect
