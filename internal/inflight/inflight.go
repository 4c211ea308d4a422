// Package inflight bounds the bytes of requests a process holds while they run: per key (a
// tenant, a sandbox) and in all. An exec holds its request — the caller's stdin, decoded and
// re-encoded — for as long as its command runs (up to an hour), so without a bound a
// tenant's burst of long execs with large stdin pins memory in the replica and the agent
// until the host runs out (measured: 150 concurrent execs of 900 KB stdin took `berth dev`
// from 37 MB to 522 MB of RSS; docs/DECISIONS.md "Execs in flight"). A Bytes is safe for
// concurrent use.
package inflight

import "sync"

// Bytes counts the bytes held under each key and in all, against a bound on the sum and a
// bound per key that each Take names; a bound of 0 or less is no bound.
type Bytes struct {
	total int64
	mu    sync.Mutex
	held  map[string]int64
	sum   int64
}

// New returns a Bytes whose sum over keys is bounded by total, in bytes.
func New(total int64) *Bytes {
	return &Bytes{total: total, held: map[string]int64{}}
}

// Take holds n bytes (n < 0 counts as 0) under key until release is called; release may be
// called more than once, only the first call counts. When holding them would take key past
// keyBound or the sum past its bound, nothing is held and ok is false — except that a
// request alone under a bound always fits, so a bound smaller than one request slows a
// caller down to one request at a time instead of refusing it forever. A nil Bytes bounds
// nothing.
func (b *Bytes) Take(key string, n, keyBound int64) (release func(), ok bool) {
	if b == nil {
		return func() {}, true
	}
	n = max(n, 0)
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.held[key]
	if over(k, n, keyBound) || over(b.sum, n, b.total) {
		return nil, false
	}
	b.held[key] = k + n
	b.sum += n
	var once sync.Once
	return func() { once.Do(func() { b.give(key, n) }) }, true
}

// over reports whether holding n more on top of held passes bound (none when bound ≤ 0); a
// first holder always fits.
func over(held, n, bound int64) bool {
	return bound > 0 && held > 0 && held+n > bound
}

func (b *Bytes) give(key string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sum -= n
	if k := b.held[key] - n; k > 0 {
		b.held[key] = k
	} else {
		delete(b.held, key) // the map holds only keys with requests in flight
	}
}

// Held returns the bytes held under key and in all.
func (b *Bytes) Held(key string) (underKey, all int64) {
	if b == nil {
		return 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held[key], b.sum
}
