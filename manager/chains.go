// Delta chains: the versions a chain needs, and what breaks it.

package manager

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strings"
)

// breakChains marks Broken the versions whose chains need damaged
// version c (checkChains clears the mark on a scan once c is repaired).
func (m *ModelState) breakChains(c uint64) {
	for i := range m.Versions {
		if v := &m.Versions[i]; v.Version != c && v.Info != nil && slices.Contains(v.Info.Chain, c) {
			v.Broken = fmt.Sprintf("the files of version %d of its chain changed after validation", c)
		}
	}
}

// checkChains marks Broken the validated versions whose chain needs a
// version that listed (the repository, as scanned) no longer holds, or
// holds with other files than validated (a version in the state:
// Damaged); and clears the mark once it is back as it was. A version gone
// from the state whose fingerprint changed is validated again (a touch
// changes a fingerprint, not the content): checked marks what it breaks,
// or takes the new fingerprint.
func (m *ModelState) checkChains(listed map[uint64]string) []Action {
	var acts []Action
	for c, kept := range m.Chained {
		switch got := listed[c]; {
		case got == "" || m.version(c) != nil:
		case got != chainedPrint(kept):
			acts = append(acts, Validate{Model: m.Name, Version: c})
		case strings.HasSuffix(kept, brokenMark):
			m.Chained[c] = strings.TrimSuffix(kept, brokenMark) // back as validated
		}
	}
	slices.SortFunc(acts, func(a, b Action) int { return cmp.Compare(a.(Validate).Version, b.(Validate).Version) })
	for i := range m.Versions {
		v := &m.Versions[i]
		if !v.Phase.valid() || v.Info == nil {
			continue
		}
		v.Broken = ""
		for _, c := range v.Info.Chain {
			if c == v.Version {
				continue
			}
			_, ok := listed[c]
			x := m.version(c)
			switch {
			case !ok:
				v.Broken = fmt.Sprintf("version %d of its chain was removed from the repository", c)
			case x != nil && x.Damaged || x == nil && strings.HasSuffix(m.Chained[c], brokenMark):
				v.Broken = fmt.Sprintf("the files of version %d of its chain changed after validation", c)
			}
			if v.Broken != "" {
				break
			}
		}
	}
	return acts
}

// A Chained entry is "FINGERPRINT IDS" — the files' fingerprint and a
// digest of the partition identities, as validated — with brokenMark
// appended once a validation found the files no longer hold that.
const brokenMark = " broken"

func chainedEntry(files string, ids []string) string {
	return files + " " + idsDigest(ids)
}

func chainedPrint(entry string) string { p, _, _ := strings.Cut(entry, " "); return p }

func idsDigest(ids []string) string {
	h := sha256.New()
	for _, id := range ids {
		io.WriteString(h, id+"\n")
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// checkedChained records a validation of c, a version gone from the
// state that kept chains need: the same content (by identities) under a
// new fingerprint is taken; anything else breaks the versions built on
// it.
func (m *ModelState) checkedChained(ev Checked) {
	entry := m.Chained[ev.Version]
	_, ids, _ := strings.Cut(strings.TrimSuffix(entry, brokenMark), " ")
	if ev.Err == "" && ev.Info != nil && idsDigest(ev.Info.IDs) == ids {
		m.Chained[ev.Version] = ev.Files + " " + ids
		for i := range m.Versions {
			if v := &m.Versions[i]; v.Info != nil && slices.Contains(v.Info.Chain, ev.Version) && strings.Contains(v.Broken, fmt.Sprintf("version %d of", ev.Version)) {
				v.Broken = ""
			}
		}
		return
	}
	m.Chained[ev.Version] = strings.TrimSuffix(entry, brokenMark) + brokenMark
	m.breakChains(ev.Version)
}

// base is the full version under v's chain (v itself when unknown).
func (m *ModelState) base(v uint64) uint64 {
	if x := m.version(v); x != nil && x.Info != nil && len(x.Info.Chain) > 0 {
		return x.Info.Chain[len(x.Info.Chain)-1]
	}
	for range len(m.Versions) {
		x := m.version(v)
		if x == nil || x.Kind != "delta" {
			return v
		}
		v = x.Parent
	}
	return v
}
