// Package inflight bounds the bytes of requests a process holds while they run: per key (a
// tenant, a sandbox) and in all. An exec holds its request — the caller's stdin, decoded and
// re-encoded — for as long as its command runs (up to an hour), so without a bound a
// tenant's burst of long execs with large stdin pins memory in the replica and the agent
// until the host runs out (measured: 150 concurrent execs of 900 KB stdin took `berth dev`
// from 37 MB to 522 MB of RSS; docs/DECISIONS.md "Execs in flight"). Slots bounds how many
// requests of a kind run at once, with a bounded wait for a turn (an agent's starts, ADM-10; a
// replica's agent joins). Both are safe for concurrent use.
package inflight

import (
	"context"
	"errors"
	"sync"
	"time"
)

// MiB is n mebibytes in bytes, saturating at 2^50 (1 PiB) so that no configured bound
// overflows; n ≤ 0 stays a bound of none.
func MiB(n int64) int64 {
	return min(n, 1<<30) << 20
}

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

// Held returns the bytes held under key.
func (b *Bytes) Held(key string) int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held[key]
}

// Slots bounds the requests of one kind that run at once: a buffered channel, one token per
// running request.
type Slots chan struct{}

// NewSlots returns room for n requests at once (n ≥ 1).
func NewSlots(n int) Slots { return make(Slots, max(n, 1)) }

// ErrNoSlot is Take's answer when no slot came free within its wait.
var ErrNoSlot = errors.New("no slot came free")

// Take waits at most wait (and no longer than ctx) for a slot and returns the function that
// gives it back. Errors: ErrNoSlot, or ctx's error; callers turn them into their refusal.
func (s Slots) Take(ctx context.Context, wait time.Duration) (release func(), err error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s <- struct{}{}:
		return func() { <-s }, nil
	case <-t.C:
		return nil, ErrNoSlot
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
