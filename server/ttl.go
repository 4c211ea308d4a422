package server

import (
	"time"

	"github.com/berth-dev/berth"
)

// withTTLLeft stamps ac with the time its sandbox has left at now on this server's clock
// (berth.AgentCreate.TTLMS), so the agent counts the TTL on its own monotonic clock instead
// of comparing its wall clock with the server's ExpiresAt (C32). A TTL already over is sent
// as 1 ms (stop at once); no ExpiresAt sends none.
func withTTLLeft(ac berth.AgentCreate, now time.Time) berth.AgentCreate {
	if !ac.ExpiresAt.IsZero() {
		ac.TTLMS = max(ac.ExpiresAt.Sub(now).Milliseconds(), 1)
	}
	return ac
}
