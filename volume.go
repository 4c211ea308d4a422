package berth

import "time"

// Volume is a named, durable directory pinned to the host it was first placed on (POOL-2):
// every sandbox that names it lands on that host. Names are per tenant.
type Volume struct {
	Tenant    string    `json:"tenant"`
	Name      string    `json:"name"`
	AgentID   string    `json:"agent_id"`
	CreatedAt time.Time `json:"created_at"`
}
