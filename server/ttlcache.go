package server

import (
	"sync"
	"time"
)

// ttlCache keeps positive answers of store reads for a while (API keys, templates and quotas
// for seconds; heartbeat credentials' agent ids, which never change, for an hour), so the
// create and heartbeat paths do not read the store for facts that rarely change. Misses are
// never cached. It holds at most max entries and starts over when full. Safe for concurrent use.
type ttlCache[V any] struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	entries map[string]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v   V
	exp time.Time
}

// get returns the value cached for key if it has not expired at now.
func (c *ttlCache[V]) get(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || !now.Before(e.exp) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// put caches v for key until now + ttl.
func (c *ttlCache[V]) put(key string, v V, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= c.max {
		c.entries = map[string]ttlEntry[V]{}
	}
	c.entries[key] = ttlEntry[V]{v, now.Add(c.ttl)}
}

// forget drops key (after a write through this replica).
func (c *ttlCache[V]) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}
