package manager

import (
	"slices"
)

// Shards that report a memory budget (topo.ShardInfo.Budget) are given
// no more partitions than fit in it while another shard has room. A
// partition's size is its share of the files of every version the
// shards keep loaded (live, staged, canary and standby, with the
// versions their chains stack on): what a shard holding it keeps
// resident, as near as the manager knows without asking.

// partitionBytes is the bytes one replica of one partition of m takes on
// a shard: the kept versions' chains' files, an equal part per
// partition. 0 when m has no partitions or no verified version kept.
func (m *ModelState) partitionBytes() int64 {
	if m.Partitions == 0 {
		return 0
	}
	var total int64
	var seen []uint64
	for _, k := range m.kept() {
		v := m.version(k)
		if v == nil || v.Info == nil {
			continue
		}
		for _, c := range v.Info.Chain {
			if x := m.version(c); x != nil && !slices.Contains(seen, c) {
				seen = append(seen, c)
				total += x.Bytes
			}
		}
	}
	return total / int64(m.Partitions)
}

// assignedBytes is, per shard, the bytes the placements of every model
// but except assign to it.
func (s *State) assignedBytes(except string) map[string]int64 {
	out := map[string]int64{}
	for name, m := range s.Models {
		if name == except {
			continue
		}
		b := m.partitionBytes()
		if b == 0 {
			continue
		}
		for _, reps := range m.Replicas {
			for _, id := range reps {
				out[id] += b
			}
		}
	}
	return out
}

// fit is what m's placement must fit beside; the zero Fit when no
// shard reports a budget (nothing to compute).
func (s *State) fit(m *ModelState) Fit {
	for _, si := range s.Shards {
		if si.Budget > 0 {
			return Fit{PartitionBytes: m.partitionBytes(), Used: s.assignedBytes(m.Name)}
		}
	}
	return Fit{}
}

// overBudget lists the shards assigned more bytes than their budget, with
// the bytes assigned: the models on them do not fit the budgets.
func (s *State) overBudget() map[string]int64 {
	out := map[string]int64{}
	for id, b := range s.assignedBytes("") {
		if budget := s.Shards[id].Budget; budget > 0 && b > budget {
			out[id] = b
		}
	}
	return out
}
