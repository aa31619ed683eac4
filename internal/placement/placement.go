package placement

import (
	"cmp"
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Shard is a place replicas can go.
type Shard struct {
	ID string
	// Weight is the shard's share of the work: its memory budget, or an
	// operator's --weight. Must be positive.
	Weight float64
	// Zone, if set, is the failure domain the shard is in: a partition's
	// replicas go to distinct zones where there are enough.
	Zone string
	// Bounded says Room bounds the replicas of this model the shard may
	// take: what fits in its memory budget beside what other models take
	// there. Replicas beyond every shard's room go by weight all the same
	// (a shard past its budget serves from mapped files): the caller
	// shows the model as not fitting.
	Bounded bool
	Room    int
}

// Place returns, for each of partitions partitions, the shards holding its
// replicas (replicas of them, or as many as there are shards), given the
// current placement (partition → shard IDs; may be shorter, or name
// shards that are gone). shards must have distinct IDs; their order does
// not matter.
func Place(model string, current [][]string, partitions, replicas int, shards []Shard) [][]string {
	// One pass may leave a zone-forced replica on a shard past its quota,
	// which the next pass trims, moving another partition: passes are
	// repeated until the answer stands (it always does at once without
	// zones), so that placing again moves nothing.
	out := place(model, current, partitions, replicas, shards)
	for range maxPasses {
		next := place(model, out, partitions, replicas, shards)
		if slices.EqualFunc(next, out, slices.Equal) {
			break
		}
		out = next
	}
	return out
}

// maxPasses bounds Place's repeated passes.
const maxPasses = 16

func place(model string, current [][]string, partitions, replicas int, shards []Shard) [][]string {
	out := make([][]string, partitions)
	if len(shards) == 0 || partitions == 0 {
		return out
	}
	shards = slices.Clone(shards)
	slices.SortFunc(shards, func(a, b Shard) int { return cmp.Compare(a.ID, b.ID) })
	replicas = max(1, min(replicas, len(shards)))
	// Zones count only when every shard names one (a shard without one
	// would be a zone of its own, and take a replica of every partition),
	// and there are as many as replicas.
	zones := map[string]bool{}
	for _, s := range shards {
		zones[s.Zone] = true
	}
	zoned := len(zones) >= replicas && !zones[""]
	quota := quotas(model, shards, partitions*replicas, partitions)
	index := make(map[string]int, len(shards))
	for i, s := range shards {
		index[s.ID] = i
	}
	load := make([]int, len(shards))

	// Keep what may stay: a current replica on a shard still here, not
	// twice on one shard or (zoned) in one zone, while its shard is within
	// quota. Partitions are visited in an order of their own per shard
	// (a hash), so that which replicas an over-full shard gives up is
	// spread, and the same on every manager.
	type held struct {
		p    int
		rank uint64
	}
	byShard := make([][]held, len(shards))
	var seen []int        // shards of the partition kept so far
	var seenZone []string // and their zones
	for p := 0; p < partitions && p < len(current); p++ {
		seen, seenZone = seen[:0], seenZone[:0]
		for _, id := range current[p] {
			i, ok := index[id]
			if !ok || slices.Contains(seen, i) || zoned && slices.Contains(seenZone, shards[i].Zone) || len(seen) == replicas {
				continue
			}
			seen, seenZone = append(seen, i), append(seenZone, shards[i].Zone)
			byShard[i] = append(byShard[i], held{p: p})
		}
	}
	for i, hs := range byShard {
		// Only a shard over its quota gives replicas up, in rank order:
		// the others keep all theirs, in any order.
		if len(hs) > quota[i] {
			for j := range hs {
				hs[j].rank = rank(model, hs[j].p, shards[i].ID)
			}
			slices.SortFunc(hs, func(a, b held) int { return cmp.Compare(a.rank, b.rank) })
		}
		for _, h := range hs[:min(len(hs), quota[i])] {
			out[h.p] = append(out[h.p], shards[i].ID)
			load[i]++
		}
	}

	// Fill: each missing replica goes to the shard with the most room
	// (quota - load, then weight, then a hash) that does not hold the
	// partition already and, zoned, is in a zone the partition does not
	// use — or, failing that, any shard not holding it.
	for p := range out {
		var used []string // zones of the partition's replicas so far
		for len(out[p]) < replicas {
			if zoned {
				used = used[:0]
				for _, id := range out[p] {
					used = append(used, shards[index[id]].Zone)
				}
			}
			best, bestZoned := -1, false
			var bestRank uint64 // rank(model, p, best), once computed
			ranked := false
			for i, s := range shards {
				if slices.Contains(out[p], s.ID) {
					continue
				}
				zoneOK := !zoned || !slices.Contains(used, s.Zone)
				if best >= 0 && bestZoned && !zoneOK {
					continue
				}
				if best < 0 || zoneOK && !bestZoned {
					best, bestZoned, ranked = i, zoneOK, false
					continue
				}
				// better(model, p, i, best, …), with best's rank kept.
				ri, rb := quota[i]-load[i], quota[best]-load[best]
				switch {
				case ri != rb:
					if ri > rb {
						best, bestZoned, ranked = i, zoneOK, false
					}
				case s.Weight != shards[best].Weight:
					if s.Weight > shards[best].Weight {
						best, bestZoned, ranked = i, zoneOK, false
					}
				default:
					if !ranked {
						bestRank, ranked = rank(model, p, shards[best].ID), true
					}
					if r := rank(model, p, s.ID); r < bestRank {
						best, bestZoned, bestRank = i, zoneOK, r
					}
				}
			}
			out[p] = append(out[p], shards[best].ID)
			load[best]++
		}
		slices.Sort(out[p]) // one order, however the list was made
	}
	return out
}

// rank is a partition's place in a shard's order of its own (rendezvous
// hashing): deterministic, and spread.
func rank(model string, p int, shard string) uint64 {
	var b [8]byte
	for i := range b {
		b[i] = byte(p >> (8 * i))
	}
	// xxh64 of model, 0, shard, 0, p's 8 bytes, made on the stack (no
	// string made per pair) when they fit.
	var buf [160]byte
	k := append(buf[:0], model...)
	k = append(k, 0)
	k = append(k, shard...)
	k = append(k, 0)
	k = append(k, b[:]...)
	return xxhash.Sum64(k)
}

// quotas splits slots among shards by weight, each at most perShard (a
// shard holds one replica of a partition) and, first, at most its Room
// where Bounded: the largest remainder method, ties broken by a hash of
// the model and the shard. A shard's quota capped gives its excess to
// the others, by weight; what no shard has room for is then split by
// weight up to perShard.
func quotas(model string, shards []Shard, slots, perShard int) []int {
	q := make([]int, len(shards))
	limit := make([]int, len(shards))
	for i, s := range shards {
		limit[i] = perShard
		if s.Bounded {
			limit[i] = max(0, min(perShard, s.Room))
		}
	}
	left := slots - share(model, shards, q, slots, limit)
	if left > 0 {
		for i := range limit {
			limit[i] = perShard
		}
		share(model, shards, q, left, limit)
	}
	return q
}

// share adds slots to q by weight, each q[i] at most limit[i] (water
// filling: a shard whose share would pass its limit takes its limit, and
// the rest is shared again among the others), and returns how many it
// placed: fewer than slots only when every shard is at its limit.
func share(model string, shards []Shard, q []int, slots int, limit []int) int {
	capped := make([]bool, len(shards))
	for {
		rest, total := slots, 0.0
		for i, s := range shards {
			if capped[i] || q[i] >= limit[i] {
				capped[i] = true
				rest -= limit[i] - q[i]
			} else {
				total += s.Weight
			}
		}
		if rest <= 0 || total <= 0 {
			// Whoever is capped takes its limit; anything beyond fits nowhere.
			placed := 0
			for i := range shards {
				if capped[i] {
					placed += limit[i] - q[i]
					q[i] = limit[i]
				}
			}
			return placed
		}
		more := false
		for i, s := range shards {
			if !capped[i] && float64(rest)*s.Weight/total >= float64(limit[i]-q[i]) {
				capped[i], more = true, true
			}
		}
		if more {
			continue
		}
		// Every uncapped share is below its limit: the largest remainder
		// method among them, ties by a hash of the model and the shard.
		type rem struct {
			i    int
			frac float64
			tie  uint64
		}
		var rems []rem
		given := 0
		add := make([]int, len(shards))
		for i, s := range shards {
			if capped[i] {
				add[i] = limit[i] - q[i]
				continue
			}
			exact := float64(rest) * s.Weight / total
			add[i] = int(math.Floor(exact))
			given += add[i]
			rems = append(rems, rem{i, exact - float64(add[i]), xxhash.Sum64String(model + "\x00" + s.ID)})
		}
		slices.SortFunc(rems, func(a, b rem) int {
			if c := cmp.Compare(b.frac, a.frac); c != 0 {
				return c
			}
			return cmp.Compare(a.tie, b.tie)
		})
		for k := 0; k < rest-given && k < len(rems); k++ {
			add[rems[k].i]++
		}
		for i := range shards {
			q[i] += add[i]
		}
		return slots
	}
}
