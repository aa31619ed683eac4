package manager

import (
	"slices"
)

// Shards that report a memory budget (topo.ShardInfo.Budget) are given
// no more than fits in it while another shard has room. Each model gets
// a slice of every shard's budget in proportion to its size among all
// the models: its room on a shard does not depend on where the other
// models are placed, so where one model is placed never moves another
// (rooms that followed the other models' placements could chase each
// other for ever), and when every model fits the cluster's budgets, every shard's
// slices add up to its budget. A partition's size is its share of the
// files of the live and canary versions' chains: what a shard keeps
// resident (a staged or standby version beyond the budget is mapped).
// A model's size changes as versions go live, and with it every model's
// slice: the next event that places every model moves what must move.

// partitionBytes is the resident bytes one replica of one partition of
// m takes: the live and canary chains' files, an equal part per
// partition; with nothing live, the newest verified version's chain
// (the first version is loaded resident). 0 when m has no partitions or
// no verified version.
func (m *ModelState) partitionBytes() int64 {
	if m.Partitions == 0 {
		return 0
	}
	sized := []uint64{m.Live, m.canaryVersion()}
	if m.Live == 0 {
		for _, v := range slices.Backward(m.Versions) {
			if v.Info != nil && v.Phase != PhaseRejected {
				sized = append(sized, v.Version)
				break
			}
		}
	}
	var total int64
	var seen []uint64
	for _, k := range sized {
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

// budgetTotal is the bytes of one replica of every model. Within Decide
// it is computed once, when the first model is placed (models settled
// after count as they were then, the same on every manager).
func (s *State) budgetTotal() int64 {
	if !s.deciding {
		return s.computeReplicaBytes()
	}
	if s.replicaBytes == 0 {
		s.replicaBytes = max(s.computeReplicaBytes(), 0)
		if s.replicaBytes == 0 {
			s.replicaBytes = -1
		}
	}
	return max(s.replicaBytes, 0)
}

func (s *State) computeReplicaBytes() int64 {
	var total int64
	for _, m := range s.Models {
		total += m.partitionBytes() * int64(m.Partitions)
	}
	return total
}

// fit is what m's placement must fit: the zero Fit (no bound) when no
// shard reports a budget or m has no verified version to size it by.
func (s *State) fit(m *ModelState) Fit {
	for _, si := range s.Shards {
		if si.Budget > 0 {
			if m.partitionBytes() == 0 {
				return Fit{} // nothing of it resident yet
			}
			return Fit{ReplicaBytes: s.budgetTotal()}
		}
	}
	return Fit{}
}

// assigned is, per shard, the partition replicas every model's placement
// assigns it, and their resident bytes.
func (s *State) assigned() (replicas map[string]int, bytes map[string]int64) {
	replicas, bytes = map[string]int{}, map[string]int64{}
	for _, m := range s.Models {
		b := m.partitionBytes()
		for _, reps := range m.Replicas {
			for _, id := range reps {
				replicas[id]++
				bytes[id] += b
			}
		}
	}
	return replicas, bytes
}

// overBudget lists the shards assigned more bytes than their budget, with
// the bytes assigned: the models on them do not fit the budgets.
func (s *State) overBudget() map[string]int64 {
	out := map[string]int64{}
	_, bytes := s.assigned()
	for id, b := range bytes {
		if budget := s.Shards[id].Budget; budget > 0 && b > budget {
			out[id] = b
		}
	}
	return out
}
