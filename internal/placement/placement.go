package placement

import (
	"cmp"
	"maps"
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
	// (a shard past its budget serves from disk): the caller
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
	if len(shards) == 0 || partitions == 0 {
		return make([][]string, partitions)
	}
	c := newPlacer(model, partitions, replicas, shards)
	// One pass may leave a zone-forced replica on a shard past its quota,
	// which the next pass trims, moving another partition: passes are
	// repeated until the answer stands (it always does at once without
	// zones), so that placing again moves nothing.
	// Passes after the first change only what they trim (again).
	out := c.place(c.grid(current))
	load := make([]int, len(c.shards))
	for _, i := range out {
		load[i]++
	}
	for range maxPasses {
		if !c.again(out, load) {
			break
		}
	}
	return c.names(out)
}

// maxPasses bounds Place's repeated passes.
const maxPasses = 16

// placer places one model's partitions. It works on a grid: a row of
// replicas slots per partition, each a shard's index in shards (sorted by
// ID, so that sorting indexes sorts IDs) or none (-1), where a
// placement of names would cost a slice per partition per pass and a map
// lookup per replica.
type placer struct {
	model      string
	partitions int
	replicas   int
	shards     []Shard
	index      map[string]int32
	zone       []int32 // each shard's zone, numbered
	// Zones count only when every shard names one (a shard without one
	// would be a zone of its own, and take a replica of every partition),
	// and there are as many as replicas.
	zoned bool
	quota []int
	// seed is each shard's hash of the model and its ID, from which its
	// ranks are drawn.
	seed []uint64
}

// rank is partition p's place in shard i's order of its own (rendezvous
// hashing): deterministic, and spread. It mixes the shard's seed with p
// (the finaliser of SplitMix64), where hashing the model, the shard and
// p anew for each pair cost most of a placement: a tie among a few
// hundred shards ranks every one of them.
func (c *placer) rank(p int, i int32) uint64 {
	z := c.seed[i] + uint64(p+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func newPlacer(model string, partitions, replicas int, shards []Shard) *placer {
	shards = slices.Clone(shards)
	slices.SortFunc(shards, func(a, b Shard) int { return cmp.Compare(a.ID, b.ID) })
	c := &placer{model: model, partitions: partitions, replicas: max(1, min(replicas, len(shards))), shards: shards,
		index: make(map[string]int32, len(shards)), zone: make([]int32, len(shards))}
	zones := map[string]int32{}
	for i, s := range shards {
		c.index[s.ID] = int32(i)
		z, ok := zones[s.Zone]
		if !ok {
			z = int32(len(zones))
			zones[s.Zone] = z
		}
		c.zone[i] = z
	}
	_, unzoned := zones[""]
	c.zoned = len(zones) >= c.replicas && !unzoned
	c.quota = quotas(model, shards, partitions*c.replicas, partitions)
	c.seed = make([]uint64, len(shards))
	for i, s := range shards {
		c.seed[i] = xxhash.Sum64String(model + "\x00" + s.ID)
	}
	return c
}

// none marks an empty slot of a grid.
const none = -1

// grid is current as a grid: per partition, the replicas that may be
// kept (see keepable), in current's order.
func (c *placer) grid(current [][]string) []int32 {
	r := c.replicas
	g := slices.Repeat([]int32{none}, c.partitions*r)
	for p := 0; p < c.partitions && p < len(current); p++ {
		row, k := g[p*r:(p+1)*r], 0
		for _, id := range current[p] {
			if i, ok := c.index[id]; ok && k < r && c.keepable(row[:k], i) {
				row[k] = i
				k++
			}
		}
	}
	return g
}

// keepable says a replica on shard i may join those of row: not twice on
// one shard, nor (zoned) twice in one zone.
func (c *placer) keepable(row []int32, i int32) bool {
	for _, j := range row {
		if j == i || c.zoned && c.zone[j] == c.zone[i] {
			return false
		}
	}
	return true
}

// names is a grid as shard IDs, every row full.
func (c *placer) names(g []int32) [][]string {
	r := c.replicas
	all := make([]string, len(g))
	for k, i := range g {
		all[k] = c.shards[i].ID
	}
	out := make([][]string, c.partitions)
	for p := range out {
		out[p] = all[p*r : (p+1)*r : (p+1)*r]
	}
	return out
}

// place is one pass: from the grid cur, where each partition's replicas
// go.
func (c *placer) place(cur []int32) []int32 {
	r, shards, quota := c.replicas, c.shards, c.quota
	out := slices.Repeat([]int32{none}, len(cur))
	load := make([]int, len(shards))

	// Keep what may stay: a current replica on a shard still here, not
	// twice on one shard or (zoned) in one zone, while its shard is within
	// quota. Partitions are visited in an order of their own per shard
	// (a hash), so that which replicas an over-full shard gives up is
	// spread, and the same on every manager.
	type held struct {
		p    int32
		rank uint64
	}
	keep := slices.Repeat([]int32{none}, len(cur)) // cur, less what may not stay
	start := make([]int, len(shards)+1)            // shard i's kept replicas are byShard[start[i]:start[i+1]]
	for p := range c.partitions {
		row, k := keep[p*r:(p+1)*r], 0
		for _, i := range cur[p*r : (p+1)*r] {
			if i != none && c.keepable(row[:k], i) {
				row[k] = i
				k++
				start[i+1]++
			}
		}
	}
	for i := range shards {
		start[i+1] += start[i]
	}
	byShard := make([]held, start[len(shards)])
	next := slices.Clone(start[:len(shards)])
	for k, i := range keep {
		if i != none {
			byShard[next[i]] = held{p: int32(k / r)}
			next[i]++
		}
	}
	n := make([]int, c.partitions) // replicas placed per partition
	for i := range shards {
		hs := byShard[start[i]:start[i+1]]
		// Only a shard over its quota gives replicas up, in rank order:
		// the others keep all theirs, in any order.
		if len(hs) > quota[i] {
			for j := range hs {
				hs[j].rank = c.rank(int(hs[j].p), int32(i))
			}
			slices.SortFunc(hs, func(a, b held) int { return cmp.Compare(a.rank, b.rank) })
		}
		for _, h := range hs[:min(len(hs), quota[i])] {
			out[int(h.p)*r+n[h.p]] = int32(i)
			n[h.p]++
			load[i]++
		}
	}

	// Fill: each missing replica goes to the shard with the most room
	// (quota - load, then weight, then a hash) that does not hold the
	// partition already and, zoned, is in a zone the partition does not
	// use — or, failing that, any shard not holding it.
	for p := range c.partitions {
		c.fill(p, out[p*r:(p+1)*r], n[p], load)
	}
	return out
}

// fill gives partition p's row its missing replicas (those from k on):
// each goes to the shard with the most room (quota - load, then weight,
// then its rank) that does not hold the partition already and, zoned, is
// in a zone the partition does not use — or, failing that, any shard not
// holding it. It counts them in load, and sorts the row.
func (c *placer) fill(p int, row []int32, k int, load []int) {
	shards, quota := c.shards, c.quota
	for ; k < len(row); k++ {
		best, bestZoned := -1, false
		var bestRank uint64 // rank(model, p, best), once computed
		ranked := false
		for i, s := range shards {
			if slices.Contains(row[:k], int32(i)) {
				continue
			}
			zoneOK := !c.zoned || !slices.ContainsFunc(row[:k], func(j int32) bool { return c.zone[j] == c.zone[i] })
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
					bestRank, ranked = c.rank(p, int32(best)), true
				}
				if r := c.rank(p, int32(i)); r < bestRank {
					best, bestZoned, bestRank = i, zoneOK, r
				}
			}
		}
		row[k] = int32(best)
		load[best]++
	}
	slices.Sort(row) // one order, however the row was made
}

// again is place(out) for out a pass's result, made in out, at the cost
// of what it changes; it reports whether anything did. A pass's rows are
// full, their replicas on distinct shards and, zoned, in distinct zones
// (a fill always finds a zone the row does not use: there are at least
// as many zones as replicas), so another pass keeps every replica but
// those beyond the quota of a shard over it (the fill of a row whose
// free zones had no shard with room puts one there), and fills the rows
// they leave, in order, as place does.
func (c *placer) again(out []int32, load []int) (changed bool) {
	r, shards, quota := c.replicas, c.shards, c.quota
	over := make([]bool, len(shards))
	anyOver := false
	for i := range shards {
		if load[i] > quota[i] {
			over[i], anyOver = true, true
		}
	}
	if !anyOver {
		return false
	}
	// An over-full shard keeps its replicas first in rank order.
	type held struct {
		p, k int
		rank uint64
	}
	byShard := map[int32][]held{}
	for at, i := range out {
		if over[i] {
			byShard[i] = append(byShard[i], held{p: at / r, k: at % r})
		}
	}
	holes := map[int][]int32{} // the rows changed, as they were
	for i := range shards {
		hs := byShard[int32(i)]
		if len(hs) <= quota[i] {
			continue
		}
		for j := range hs {
			hs[j].rank = c.rank(hs[j].p, int32(i))
		}
		slices.SortFunc(hs, func(a, b held) int { return cmp.Compare(a.rank, b.rank) })
		for _, h := range hs[quota[i]:] {
			row := out[h.p*r : (h.p+1)*r]
			if holes[h.p] == nil {
				holes[h.p] = slices.Clone(row)
			}
			load[row[h.k]]--
			row[h.k] = none
		}
	}
	for _, p := range slices.Sorted(maps.Keys(holes)) {
		row := out[p*r : (p+1)*r]
		kept := slices.DeleteFunc(slices.Clone(row), func(i int32) bool { return i == none })
		copy(row, kept)
		c.fill(p, row, len(kept), load)
		if !slices.Equal(row, holes[p]) {
			changed = true
		}
	}
	return changed
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
