package server

import (
	"context"
	"time"

	"github.com/berth-dev/berth"
)

// templateCache keeps templates read on the create path for a few seconds: they change
// rarely (an admin PUT), and a create should not pay a store read for them. A template put
// through this replica is visible at once; through another, within the cache's TTL.
type templateCache struct {
	store berth.TemplateStore
	clock func() time.Time
	cache ttlCache[berth.Template]
}

func newTemplateCache(st berth.TemplateStore, clock func() time.Time) *templateCache {
	return &templateCache{store: st, clock: clock, cache: ttlCache[berth.Template]{ttl: 5 * time.Second, max: 1000}}
}

// get returns the named template, from the cache when fresh. Errors are the store's.
func (c *templateCache) get(ctx context.Context, name string) (berth.Template, error) {
	if t, ok := c.cache.get(name, c.clock()); ok {
		return t, nil
	}
	t, err := c.store.Template(ctx, name)
	if err != nil {
		return t, err
	}
	c.cache.put(name, t, c.clock())
	return t, nil
}

// forget drops name after a PUT through this replica.
func (c *templateCache) forget(name string) { c.cache.forget(name) }
