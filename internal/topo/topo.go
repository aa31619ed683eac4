// Package topo is the cluster's shared view in etcd: the key layout, the
// records stored under it, a watcher that turns a key prefix into a
// stream of whole snapshots, and lease-backed registration.
//
// Layout (all values JSON):
//
//	/cumulus/shards/ID   ShardInfo, under the shard's lease: who is alive,
//	                     where, and which partitions it has loaded
//	/cumulus/models/NAME Assignment, written by the manager: the version
//	                     to serve and which shards should hold each partition
//
// Shards read assignments and report what they hold; routers route only
// to what shards report, so a shard still loading, or one that refused a
// damaged file, never receives traffic for what it does not have.
package topo

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
)

const (
	ShardsPrefix = "/cumulus/shards/"
	ModelsPrefix = "/cumulus/models/"
)

// ShardInfo is a live shard's registration.
type ShardInfo struct {
	ID     string   `json:"id"`
	Addr   string   `json:"addr"` // gRPC host:port
	Loaded []Loaded `json:"loaded,omitempty"`
	// Errors lists loads this shard refused (damaged or missing files),
	// newest first; the versions it already held keep serving.
	Errors []string `json:"errors,omitempty"`
}

// Loaded is one model version a shard holds, with the metadata a router
// needs to score it, so routers never read the model repository.
type Loaded struct {
	Model      string   `json:"model"`
	Version    uint64   `json:"version"`
	Type       string   `json:"type"`
	Dim        int      `json:"dim"`
	Bias       float64  `json:"bias"`
	Partitions uint32   `json:"partitions"` // the model's total
	Hash       string   `json:"hash"`
	Have       []uint32 `json:"have"` // partitions held, ascending
}

// Assignment is the manager's decision for one model. A rollout stages
// Version (shards load it beside Live), commits it (Live = Version, once
// every assigned replica holds it) and retires the old one (shards drop
// what is neither Live nor Version).
type Assignment struct {
	Model      string     `json:"model"`
	Version    uint64     `json:"version"`        // the version to load
	Live       uint64     `json:"live,omitempty"` // the committed version routers serve; 0 before the first commit
	Partitions uint32     `json:"partitions"`
	Replicas   [][]string `json:"replicas"` // partition → shard IDs
}

// ShardKey is the registration key of a shard.
func ShardKey(id string) string { return ShardsPrefix + id }

// ModelKey is the assignment key of a model.
func ModelKey(name string) string { return ModelsPrefix + name }

// Decode parses a JSON value of a snapshot, naming the key on error.
func Decode[T any](key string, value []byte) (T, error) {
	var v T
	if err := json.Unmarshal(value, &v); err != nil {
		return v, fmt.Errorf("topo: %s: %w", key, err)
	}
	return v, nil
}

// DecodeAll decodes every value of a snapshot of prefix, keyed by what
// follows the prefix. A value that does not decode is logged and left
// out: one bad record must not hide the rest.
func DecodeAll[T any](kv map[string][]byte, prefix string) map[string]T {
	out := make(map[string]T, len(kv))
	for k, v := range kv {
		t, err := Decode[T](k, v)
		if err != nil {
			slog.Warn("topo: ignoring record", "err", err)
			continue
		}
		out[Suffix(k, prefix)] = t
	}
	return out
}

// Suffix returns key without prefix.
func Suffix(key, prefix string) string { return strings.TrimPrefix(key, prefix) }
