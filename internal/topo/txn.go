package topo

import (
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxTxnOps is etcd's default limit on operations in one transaction.
const MaxTxnOps = 128

// MaxTxnBytes bounds the keys and values of one transaction: etcd refuses
// requests over --max-request-bytes (default 1.5 MiB), and this leaves
// room for the request's own framing. MaxRecordBytes bounds one record.
// Cumulus's records stay far below (a model's state and map records
// under 256 KiB); these bounds turn a record that does not into a clear
// error before anything is written.
const (
	MaxTxnBytes    = 1 << 20
	MaxRecordBytes = MaxTxnBytes - 4<<10
)

// ErrTooLarge is returned for a record etcd would refuse.
var ErrTooLarge = errors.New("record too large for etcd")

// Txn is writes to make in as few etcd transactions as its limits allow
// (MaxTxnOps, MaxTxnBytes), leaving room in each for one more operation
// of the writer's own (a guard, a fence). Ops and Sizes (each
// operation's key and value bytes) are in order.
type Txn struct {
	Ops   []clientv3.Op
	Sizes []int
	// joined[i]: Ops[i] goes in the transaction of Ops[i-1] (a group:
	// see Together), unless they cannot fit one.
	joined []bool
}

// Together marks the operations added from now on until done is
// called as one group, written in one transaction where one can hold
// them.
func (t *Txn) Together() (done func()) {
	first := len(t.Ops)
	return func() {
		for len(t.joined) < len(t.Ops) {
			t.joined = append(t.joined, len(t.joined) > first)
		}
	}
}

// Add appends u's operations.
func (t *Txn) Add(u Txn) {
	for len(t.joined) < len(t.Ops) {
		t.joined = append(t.joined, false)
	}
	t.Ops, t.Sizes = append(t.Ops, u.Ops...), append(t.Sizes, u.Sizes...)
	for i := range u.Ops {
		t.joined = append(t.joined, i < len(u.joined) && u.joined[i])
	}
}

// isJoined reports whether Ops[i] must follow Ops[i-1] in its transaction.
func (t *Txn) isJoined(i int) bool { return i < len(t.joined) && t.joined[i] }

// Put adds a write of value at key, refusing a record etcd would refuse.
func (t *Txn) Put(key string, value []byte, opts ...clientv3.OpOption) error {
	if n := len(key) + len(value); n > MaxRecordBytes {
		return fmt.Errorf("%w: %s is %d bytes, over the %d a write may carry; nothing written", ErrTooLarge, key, n, MaxRecordBytes)
	}
	t.Ops, t.Sizes = append(t.Ops, clientv3.OpPut(key, string(value), opts...)), append(t.Sizes, len(key)+len(value))
	return nil
}

// Delete adds the deletion of key.
func (t *Txn) Delete(key string) {
	t.Ops, t.Sizes = append(t.Ops, clientv3.OpDelete(key)), append(t.Sizes, len(key))
}

// DeletePrefix adds the deletion of every key under prefix.
func (t *Txn) DeletePrefix(prefix string) {
	t.Ops, t.Sizes = append(t.Ops, clientv3.OpDelete(prefix, clientv3.WithPrefix())), append(t.Sizes, len(prefix))
}

// Each calls write with the operations in order, in batches that fit one
// transaction each, at least once (with none when there are none), and
// stops at the first error.
//
// A group (Together) is not split across transactions unless it alone
// cannot fit one: a transaction ends before a group that would not fit.
func (t *Txn) Each(write func(batch []clientv3.Op) error) error {
	ops, sizes, at := t.Ops, t.Sizes, 0
	for first := true; first || len(ops) > 0; first = false {
		n, bytes := 0, 0
		for n < len(ops) && n < MaxTxnOps-1 && (n == 0 || bytes+sizes[n] <= MaxTxnBytes) {
			bytes += sizes[n]
			n++
		}
		whole := n
		for n < len(ops) && n > 0 && t.isJoined(at+n) {
			n-- // back to the start of the group the limit cut
		}
		if n == 0 {
			n = whole // a group larger than a transaction: split after all
		}
		if err := write(ops[:n:n]); err != nil {
			return err
		}
		ops, sizes, at = ops[n:], sizes[n:], at+n
	}
	return nil
}
