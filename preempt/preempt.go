// Package preempt watches a cloud's metadata service for preemption notices (SPOT-1): GCP's
// hanging GET on instance/preempted, AWS's IMDSv2 spot/instance-action and rebalance
// recommendation, Azure's Scheduled Events. Each watcher sends Notices on a channel until its
// context ends; base URLs are configurable so tests serve the documented formats on
// loopback. Every metadata call has a deadline, and a watcher keeps polling through any one
// failure (C28). The agent reacts (cordon first, SPOT-2) and deduplicates by Notice.ID (C13).
package preempt

import (
	"context"
	"net/http"
	"time"
)

// Notice kinds.
const (
	KindPreempt     = "preempt"     // the host will be taken away at Deadline
	KindTerminate   = "terminate"   // likewise (AWS terminate/stop/hibernate, Azure Terminate)
	KindMaintenance = "maintenance" // GCP TERMINATE_ON_HOST_MAINTENANCE
	KindRebalance   = "rebalance"   // AWS early warning: cordon softly, for a bounded time (C15)
)

// Notice is one notice from the cloud. ID is stable across repeated polls of the same notice
// (C13): built from the provider's raw text, so a notice whose fields cannot be parsed keeps
// one ID too (C29). Deadline is when the host goes; a hard notice whose time cannot be read
// gets the provider's documented minimum window from first sight (C29); it is zero for a soft
// notice. Soft marks an early warning. Watchers send only notices for this host (C27).
type Notice struct {
	Provider string
	Kind     string
	ID       string
	Deadline time.Time
	Soft     bool
}

// Watcher is one provider's watcher (SPOT-1).
type Watcher interface {
	// Watch sends notices until ctx ends, re-trying its metadata service after errors with a
	// short capped backoff (C17); it returns ctx.Err().
	Watch(ctx context.Context, out chan<- Notice) error
}

// sleep waits d or until ctx ends, and reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backoff doubles d up to limit.
func backoff(d, limit time.Duration) time.Duration { return min(max(d*2, 50*time.Millisecond), limit) }

// send delivers n unless ctx ends first.
func send(ctx context.Context, out chan<- Notice, n Notice) bool {
	select {
	case out <- n:
		return true
	case <-ctx.Done():
		return false
	}
}

// defaultClient reaches metadata servers directly: they answer only on the host's own link,
// so an HTTP_PROXY from the environment must never carry (or hold up) these calls.
var defaultClient = &http.Client{Transport: &http.Transport{Proxy: nil}}
