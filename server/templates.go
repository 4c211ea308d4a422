package server

import (
	"context"
	"sync"
	"time"

	"github.com/berth-dev/berth"
)

// templateCache keeps templates read on the create path for a few seconds: they change
// rarely (an admin PUT), and a create should not pay a store read for them. A template
// put through this replica is visible at once; through another, within ttl.
type templateCache struct {
	store berth.TemplateStore
	ttl   time.Duration
	clock func() time.Time

	mu      sync.Mutex
	entries map[string]cachedTemplate
}

type cachedTemplate struct {
	t   berth.Template
	exp time.Time
}

// get returns the named template, from the cache when fresh. Misses are not cached, so a
// new template is usable as soon as it is stored. Errors are the store's.
func (c *templateCache) get(ctx context.Context, name string) (berth.Template, error) {
	now := c.clock()
	c.mu.Lock()
	e, ok := c.entries[name]
	c.mu.Unlock()
	if ok && now.Before(e.exp) {
		return e.t, nil
	}
	t, err := c.store.Template(ctx, name)
	if err != nil {
		return t, err
	}
	c.mu.Lock()
	if c.entries == nil || len(c.entries) > 1000 {
		c.entries = map[string]cachedTemplate{}
	}
	c.entries[name] = cachedTemplate{t, now.Add(c.ttl)}
	c.mu.Unlock()
	return t, nil
}

// forget drops name after a PUT through this replica.
func (c *templateCache) forget(name string) {
	c.mu.Lock()
	delete(c.entries, name)
	c.mu.Unlock()
}
