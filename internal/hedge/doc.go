// Package hedge is the router's policy against slow shards: which replica
// of a partition to ask, how long to wait for an answer before asking
// another replica as well, and how many such extra calls may be spent.
//
// Everything here is a deterministic function of its inputs, with time
// passed in, so it is tested without sockets or clocks; the router owns
// the calls, this package only decides.
//
// The rules, after "The Tail at Scale" (Dean and Barroso, 2013):
//   - A call not answered after about the p95 latency of the replicas
//     that could take it over is sent to one of them too; the first answer
//     wins. The p95 is of those replicas, not of the slow shard, whose own
//     straggling would inflate it. It has a floor (Floor): below it, a
//     second call costs more than the wait it saves.
//   - That delay is scaled per replica by how its hedges fare (Scale): a
//     healthy replica's calls past the p95 are about to answer, its
//     hedges lose, and it is hedged later (up to MaxScale times); a
//     replica with stragglers has hedges that win, and is hedged at the
//     p95. So the budget goes to stragglers, not to noise.
//   - Only a request's stragglers are hedged: while more than half of its
//     calls are out, it is slow as a whole (a busy machine, a garbage
//     collection) and hedges would add to the load that slows it.
//   - Extra calls are bounded by a budget, a fraction of the calls made
//     over a sliding window: when a whole cluster slows, hedging every
//     call would double its load just when it can least take it. The
//     fraction shrinks while fewer than half the hedges win: with no slow
//     shard, a call past the p95 is usually about to answer, and its
//     hedge is pure cost.
//   - A replica is chosen by the fewest calls outstanding, rotation
//     breaking ties: a slow replica collects outstanding calls and is
//     passed over until it catches up.
package hedge
