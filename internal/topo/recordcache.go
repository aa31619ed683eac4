package topo

import "unsafe"

// recordCache keeps records as last decoded, by key, with the value each
// came from. A watch hands over snapshots whose unchanged values are the
// same slices (a value does not change in place), so a reader that keeps
// one decodes only the records that changed since its last snapshot.
// Not safe for concurrent use.
type recordCache map[string]decoded

// decoded is a record as last decoded, with the value it came from.
type decoded struct {
	at  *byte // the value's first byte
	n   int
	val any // what decode gave: a record, or an error
}

// get is the record at key: decode's, made again only when value is
// not the one last decoded there.
func (c recordCache) get(key string, value []byte, decode func() any) any {
	var at *byte
	if len(value) > 0 {
		at = unsafe.SliceData(value)
	}
	if d, ok := c[key]; ok && d.at == at && d.n == len(value) {
		return d.val
	}
	val := decode()
	c[key] = decoded{at: at, n: len(value), val: val}
	return val
}

// sweep forgets the keys a snapshot no longer has.
func (c recordCache) sweep(kv map[string][]byte) {
	for key := range c {
		if _, ok := kv[key]; !ok {
			delete(c, key)
		}
	}
}
