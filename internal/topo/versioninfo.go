package topo

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cumulus-serving/cumulus/model"
)

// A serving map record lists every kept version's identities and chain:
// written naively, a 64-partition model with 60 versions kept and chains
// of hundreds of deltas passes 256 KiB. So a VersionInfo's JSON form
// stores identities that are SHA-256 hex digests (all of them, in
// practice) as their bytes, base64 (43 characters instead of 64 and no
// quotes), and a chain as runs of consecutive versions: a chain of 1,000
// deltas published one after another is one run.
//
// Readers take either form (schema 1 records have "ids" and "chain" as
// lists); writers write the compact one when it applies.

// versionInfoJSON is VersionInfo as stored.
type versionInfoJSON struct {
	Version uint64 `json:"version"`
	model.Shape
	Bias     float64 `json:"bias"`
	Dense    string  `json:"dense,omitempty"`
	Encoding string  `json:"encoding,omitempty"`
	Hash     string  `json:"hash"`
	// IDs lists identities that are not all SHA-256 hex digests.
	IDs []string `json:"ids,omitempty"`
	// Digests is every identity's 32 bytes, in partition order, base64
	// (standard alphabet, no padding).
	Digests string `json:"digests,omitempty"`
	// Chain is the schema 1 form of the chain.
	Chain []uint64 `json:"chain,omitempty"`
	// Runs is the chain, newest first, as [newest, oldest] pairs of
	// versions each one below the one before: [[9,7],[4,4]] is 9, 8, 7, 4.
	Runs [][2]uint64 `json:"runs,omitempty"`
}

// MaxChainLen bounds a chain a record may describe: runs expand to at
// most this many versions, so a hostile record cannot make a reader
// allocate without bound. (The repository refuses chains far shorter.)
const MaxChainLen = 1 << 16

// MaxPartitions bounds the identities a record may list.
const MaxPartitions = 1 << 20

// MarshalJSON writes the compact form.
func (v VersionInfo) MarshalJSON() ([]byte, error) {
	j := versionInfoJSON{Version: v.Version, Shape: v.Shape, Bias: v.Bias, Dense: v.Dense, Encoding: v.Encoding, Hash: v.Hash,
		Runs: runs(v.Chain)}
	if raw, ok := digests(v.IDs); ok {
		j.Digests = base64.RawStdEncoding.EncodeToString(raw)
	} else {
		j.IDs = v.IDs
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads either form, refusing one that names both or runs
// that do not descend.
func (v *VersionInfo) UnmarshalJSON(b []byte) error {
	var j versionInfoJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*v = VersionInfo{Version: j.Version, Shape: j.Shape, Bias: j.Bias, Dense: j.Dense, Encoding: j.Encoding, Hash: j.Hash}
	switch {
	case j.IDs != nil && j.Digests != "":
		return errors.New("version info has both ids and digests")
	case j.Chain != nil && j.Runs != nil:
		return errors.New("version info has both chain and runs")
	case len(j.IDs) > MaxPartitions || len(j.Chain) > MaxChainLen:
		return errors.New("version info is too large")
	}
	v.IDs, v.Chain = j.IDs, j.Chain
	if j.Digests != "" {
		if len(j.Digests) > base64.RawStdEncoding.EncodedLen(32*MaxPartitions) {
			return errors.New("version info: too many digests")
		}
		raw, err := base64.RawStdEncoding.DecodeString(j.Digests)
		if err != nil || len(raw)%32 != 0 {
			return fmt.Errorf("version info: digests are not whole SHA-256 values in base64")
		}
		v.IDs = make([]string, len(raw)/32)
		for i := range v.IDs {
			v.IDs[i] = hex.EncodeToString(raw[32*i : 32*i+32])
		}
	}
	if j.Runs != nil {
		chain, err := expand(j.Runs)
		if err != nil {
			return fmt.Errorf("version info: %w", err)
		}
		v.Chain = chain
	}
	return nil
}

// digests returns ids as their bytes, when every one is a lowercase hex
// SHA-256 (what codec.PartitionIdentity gives).
func digests(ids []string) ([]byte, bool) {
	if len(ids) == 0 {
		return nil, false
	}
	raw := make([]byte, 32*len(ids))
	for i, id := range ids {
		if len(id) != 64 || !lowerHex(id) {
			return nil, false // not one, or uppercase: it would not read back the same
		}
		hex.Decode(raw[32*i:], []byte(id))
	}
	return raw, true
}

// runs groups a chain into runs of consecutive descending versions.
func runs(chain []uint64) [][2]uint64 {
	var out [][2]uint64
	for _, c := range chain {
		if n := len(out); n > 0 && out[n-1][1] > 0 && c == out[n-1][1]-1 {
			out[n-1][1] = c
			continue
		}
		out = append(out, [2]uint64{c, c})
	}
	return out
}

// expand is the chain runs describe, refusing runs that ascend, overlap
// or describe more than MaxChainLen versions.
func expand(rs [][2]uint64) ([]uint64, error) {
	n := uint64(0)
	for i, r := range rs {
		if r[0] < r[1] || r[1] == 0 || i > 0 && r[0] >= rs[i-1][1] {
			return nil, errors.New("chain runs must descend, over versions ≥ 1")
		}
		n += r[0] - r[1] + 1
		if n > MaxChainLen || r[0]-r[1] >= MaxChainLen {
			return nil, fmt.Errorf("chain longer than %d versions", MaxChainLen)
		}
	}
	out := make([]uint64, 0, n)
	for _, r := range rs {
		for c := r[0]; ; c-- {
			out = append(out, c)
			if c == r[1] {
				break
			}
		}
	}
	return out, nil
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
