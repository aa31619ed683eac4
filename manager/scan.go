package manager

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
)

// scanRepo lists every version of every model with a fingerprint of its
// files, cheaply (directory listings and stats, no file contents but the
// manifests). A manifest that cannot be read or is invalid is reported on
// its version, never skipped. Versions that have left the state (mode
// says) are only listed, with their fingerprint when a kept chain needs
// them: a scan costs what is kept, not the repository's history.
func scanRepo(repo loader.Repo, mode func(model string, v uint64) (scanMode, *Found)) (Scanned, error) {
	names, err := repo.Models()
	if err != nil {
		return Scanned{}, err
	}
	ev := Scanned{Models: map[string][]Found{}, Listed: map[string]map[uint64]string{}}
	for _, name := range names {
		vs, err := repo.Versions(name)
		if errors.Is(err, loader.ErrNotFound) {
			continue // removed since it was listed: it left the repository
		}
		if err != nil {
			return Scanned{}, err
		}
		found := make([]Found, 0, len(vs))
		listed := make(map[uint64]string, len(vs))
		ev.Listed[name] = listed
		for _, v := range vs {
			how, known := mode(name, v)
			switch how {
			case scanSkip:
				listed[v] = ""
				continue
			case scanPrint:
				listed[v] = fingerprint(repo.VersionDir(name, v))
				continue
			case scanKnownPrint:
				listed[v] = known.Files
				continue
			case scanKnown:
				listed[v] = known.Files
				found = append(found, *known)
				continue
			}
			f := Found{Version: v, Files: fingerprint(repo.VersionDir(name, v))}
			listed[v] = f.Files
			if m, err := repo.Manifest(name, v); err != nil {
				f.Err = err.Error()
			} else {
				f.Kind, f.Parent, f.Pushed = m.Kind, m.Parent, m.Pushed
			}
			found = append(found, f)
		}
		ev.Models[name] = found
	}
	return ev, nil
}

// scanMode is how much a scan reads of one version directory.
type scanMode int

const (
	scanFull       scanMode = iota // fingerprint and manifest: a version in the state
	scanPrint                      // fingerprint: a version gone from the state that a kept chain needs
	scanSkip                       // its number: a version gone from the state
	scanKnown                      // as the state has it (a quick scan: nothing read)
	scanKnownPrint                 // scanPrint, with the fingerprint the state has
)

// fingerprint identifies a version directory's files by name, size and
// modification time.
func fingerprint(dir string) string {
	ents, err := os.ReadDir(dir)
	h := sha256.New()
	if err != nil {
		fmt.Fprintf(h, "error %v", err)
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			fmt.Fprintf(h, "%s ?\n", e.Name())
			continue
		}
		fmt.Fprintf(h, "%s %d %d\n", e.Name(), info.Size(), info.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// validate checks one version: its chain's manifests agree, its own
// files match its manifest (size, SHA-256, block checksums). Its parents'
// files are validated as versions of their own.
//
// sealed, if not "", is the fingerprint of the version's files as this
// manager wrote them, sealing pushes: if they are still those, they are
// not read back. The leader hashed what it wrote, every pushed value was
// checked finite as it came, and each shard checks a partition's
// SHA-256 as it loads it; reading a delta a second back cost a third of
// the leader's CPU at a million keys a second.
//
// ids computes the partition identities: the validators' shared cache,
// so that a delta's extend its parent's.
func validate(repo loader.Repo, v Validate, sealed string, ids *codec.IdentityCache) Checked {
	out := Checked{Model: v.Model, Version: v.Version, Files: fingerprint(repo.VersionDir(v.Model, v.Version))}
	chain, err := repo.Chain(v.Model, v.Version)
	if err == nil && sealed != "" && sealed == out.Files {
		out.Gates = append(out.Gates, GateResult{Gate: GateFinite, Outcome: "passed", Reason: "sealed by this manager from pushes checked finite as they came", At: time.Now().UTC()})
	} else if err == nil {
		err = repo.Verify(chain[0])
		// The finite gate ran with the verification (codec.VerifyStream).
		switch {
		case errors.Is(err, codec.ErrNotFinite):
			out.Gates = append(out.Gates, GateResult{Gate: GateFinite, Outcome: "failed", Reason: err.Error(), At: time.Now().UTC()})
		case err == nil:
			out.Gates = append(out.Gates, GateResult{Gate: GateFinite, Outcome: "passed", At: time.Now().UTC()})
		}
	}
	if err != nil {
		out.Err = err.Error()
		return out
	}
	// The manifests are valid (Repo.Chain parses them): their type is one
	// routers score.
	m := chain[0]
	_, dense, _ := codec.ChainExtra(chain, codec.RoleDense)
	out.Info = &topo.VersionInfo{Version: m.Version, Shape: m.Shape, Bias: m.Bias, Encoding: m.Encoding,
		Hash: m.Hash, Chain: codec.ChainVersions(chain), Dense: dense.SHA256}
	out.Info.IDs = ids.Identities(chain)
	for _, f := range m.Files {
		out.Bytes += f.Size
	}
	_, out.Golden = m.Extra(codec.RoleGolden)
	// When it was published, as its publisher says (shown, not trusted:
	// a time that does not parse, or from the future, is left out).
	if t, err := time.Parse(time.RFC3339, m.Created); err == nil && !t.After(time.Now().Add(time.Minute)) {
		out.Created = t.UTC()
	}
	return out
}
