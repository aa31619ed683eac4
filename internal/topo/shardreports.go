package topo

import (
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
)

// A shard's report of what it holds, in records that change with what
// changed (ShardInfoSchema 4). Listing every identity of every version
// held, as schema 1 did, made each shard rewrite kilobytes per delta
// (hundreds of bytes per version kept), all shards together megabytes at
// 4,096 partitions. Under the shard's registration, on its lease:
//
//	/cumulus/CLUSTER/shards/ID                ShardInfo: where it is, its
//	                                          weight, errors, mismatches
//	/cumulus/CLUSTER/shards/ID/parts/MODEL    PartsRecord: the partitions of
//	                                          MODEL it holds; rewritten when
//	                                          they change
//	/cumulus/CLUSTER/shards/ID/held/MODEL     HeldRecord: the Seq of the map
//	                                          record it has applied, and
//	                                          what of it is missing; a few
//	                                          bytes per map change
//
// A shard rewrites its HeldRecord only when what it says changes: when
// the map keeps a version it did not (KeptSince above the record's Seq),
// moves partitions (PlaceSeq above it), or what is missing changes. A
// map record that only moves a version from staged to live, or retires
// one, costs the shards nothing.
//
// A HeldRecord of Seq says: every version the map record of Seq keeps is
// held on every partition of Parts, except those listed, each verified
// against the identity the map names for it (a partition whose content
// differs is refused, and listed in ShardInfo.Mismatched with what it
// found). Version numbers never change meaning, so a version kept since
// a Seq at most the report's (Assignment.KeptSince) is held as reported
// as long as the map keeps it.

// PartsRecord lists, ascending, the partitions of one model a shard
// holds (of any version the map keeps).
type PartsRecord struct {
	Schema int      `json:"schema"`
	Parts  []uint32 `json:"parts"`
}

// HeldRecord is what a shard holds of one model, relative to the map
// record of Seq and its PartsRecord.
type HeldRecord struct {
	Schema int      `json:"schema"`
	Seq    uint64   `json:"seq"`
	Except []Except `json:"except,omitempty"`
}

// Except is a version a shard lacks on some of its partitions (loading
// it, or refused).
type Except struct {
	Version uint64   `json:"version"`
	Missing []uint32 `json:"missing"` // ascending
}

// Held is a shard's report of one model, assembled.
type Held struct {
	Seq    uint64
	Parts  []uint32 // ascending
	Except []Except
}

// Holds reports whether the report says partition p of version v is
// held, v having been kept since keptSince: only a report that follows a
// map record from keptSince on speaks of v.
func (h *Held) Holds(v uint64, keptSince uint64, p uint32) bool {
	if h == nil || h.Seq < keptSince {
		return false
	}
	if _, ok := slices.BinarySearch(h.Parts, p); !ok {
		return false
	}
	for _, e := range h.Except {
		if e.Version == v {
			_, missing := slices.BinarySearch(e.Missing, p)
			return !missing
		}
	}
	return true
}

// Count is how many partitions of v the report says are held.
func (h *Held) Count(v uint64, keptSince uint64) int {
	if h == nil || h.Seq < keptSince {
		return 0
	}
	n := len(h.Parts)
	for _, e := range h.Except {
		if e.Version == v {
			for _, p := range e.Missing {
				if _, ok := slices.BinarySearch(h.Parts, p); ok {
					n--
				}
			}
		}
	}
	return n
}

// KeptSinceOf is the Seq since which a keeps version v (KeptFrom).
func (a *Assignment) KeptSinceOf(v uint64) uint64 { return KeptFrom(a.KeptSince[v], a.Seq) }

// KeptFrom is the Seq since which a map of Seq seq keeps a version it
// records kept since recorded: recorded, or, for a version kept without
// saying since when (0), seq itself (only reports that follow it speak
// of it). The manager and the map's readers follow this one rule.
func KeptFrom(recorded, seq uint64) uint64 {
	if recorded != 0 {
		return recorded
	}
	return seq
}

// HoldsIn reports whether si holds partition p of version v of a's model
// with the identity a names: by its report of that model, or, from a
// shard of schema 1, its list of identities.
func (si ShardInfo) HoldsIn(a *Assignment, v uint64, p uint32) bool {
	if h := si.Held[a.Model]; h != nil {
		return h.Holds(v, a.KeptSinceOf(v), p)
	}
	info := a.Info(v)
	return info != nil && int(p) < len(info.IDs) && si.Holds(a.Model, v, p, info.IDs[p])
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,252}$`)

// ValidID reports whether s may name a shard or router: it becomes a key
// under which others sit.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// HeldKey and PartsKey are the keys of a shard's reports of model.
func (c Cluster) HeldKey(shard, model string) string  { return c.ShardKey(shard) + "/held/" + model }
func (c Cluster) PartsKey(shard, model string) string { return c.ShardKey(shard) + "/parts/" + model }

// MaxHeldParts bounds the partitions a report may list.
const MaxHeldParts = 1 << 20

// Shards decodes a snapshot of the shards' registrations (key → value
// under ShardsPrefix) with their reports. A record that does not decode
// is logged and left out: a report lost is a shard that holds nothing of
// that model, never a wrong one.
func Shards(kv map[string][]byte, c Cluster) map[string]ShardInfo {
	return NewShardReader(c).Shards(kv)
}

// ShardReader is Shards for a watch's snapshots, decoding only the
// records that changed since its last call: each shard's report of a
// delta costs a reader that record, not every shard's. Not safe for
// concurrent use.
type ShardReader struct {
	cluster Cluster
	cache   recordCache // ShardInfo, HeldRecord, PartsRecord, or error
}

// NewShardReader returns a reader of cluster c's shard registrations.
func NewShardReader(c Cluster) *ShardReader { return &ShardReader{cluster: c, cache: recordCache{}} }

// Shards assembles the shards of kv (see Shards).
func (r *ShardReader) Shards(kv map[string][]byte) map[string]ShardInfo {
	prefix := r.cluster.ShardsPrefix()
	out := map[string]ShardInfo{}
	held := map[string]map[string]HeldRecord{}
	parts := map[string]map[string]PartsRecord{}
	for key, value := range kv {
		id, rest, _ := strings.Cut(Suffix(key, prefix), "/")
		_, model, _ := strings.Cut(rest, "/")
		switch v := r.cache.get(key, value, func() any { return decodeShardRecord(key, value, id, rest) }).(type) {
		case error:
			slog.Warn("topo: ignoring record", "err", v)
		case ShardInfo:
			out[id] = v
		case HeldRecord:
			if held[id] == nil {
				held[id] = map[string]HeldRecord{}
			}
			held[id][model] = v
		case PartsRecord:
			if parts[id] == nil {
				parts[id] = map[string]PartsRecord{}
			}
			parts[id][model] = v
		}
	}
	r.cache.sweep(kv)
	for id, models := range held {
		si, ok := out[id]
		if !ok {
			continue
		}
		si.Held = map[string]*Held{}
		for model, h := range models {
			pr, ok := parts[id][model]
			if !ok {
				continue // held without its partitions: nothing
			}
			si.Held[model] = &Held{Seq: h.Seq, Parts: pr.Parts, Except: h.Except}
		}
		out[id] = si
	}
	return out
}

// decodeShardRecord reads the record at key: shard id's registration
// (rest ""), or its report rest ("held/M", "parts/M").
func decodeShardRecord(key string, value []byte, id, rest string) any {
	if rest == "" {
		si, err := Decode[ShardInfo](key, value)
		if err == nil && si.ID != id {
			err = fmt.Errorf("topo: %s holds the registration of shard %q", key, si.ID)
		}
		if err != nil {
			return err
		}
		return si
	}
	kind, _, _ := strings.Cut(rest, "/")
	switch kind {
	case "held":
		h, err := Decode[HeldRecord](key, value)
		if err == nil {
			err = checkExcept(h.Except)
		}
		if err != nil {
			return err
		}
		return h
	case "parts":
		pr, err := Decode[PartsRecord](key, value)
		if err == nil && (len(pr.Parts) > MaxHeldParts || !ascending(pr.Parts)) {
			err = fmt.Errorf("topo: %s: partitions must ascend, at most %d", key, MaxHeldParts)
		}
		if err != nil {
			return err
		}
		return pr
	}
	return fmt.Errorf("topo: %s: not a shard record", key)
}

func checkExcept(ex []Except) error {
	for i, e := range ex {
		if i > 0 && e.Version <= ex[i-1].Version || len(e.Missing) > MaxHeldParts || !ascending(e.Missing) {
			return fmt.Errorf("topo: a held record's exceptions must ascend, by version and partition")
		}
	}
	return nil
}

func ascending(ps []uint32) bool {
	for i := 1; i < len(ps); i++ {
		if ps[i] <= ps[i-1] {
			return false
		}
	}
	return true
}
