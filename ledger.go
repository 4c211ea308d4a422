package berth

import "time"

// Reservation is one entry of the reservation ledger (LED-1…4): MiB charged against an agent
// for a create that the agent has not yet netted out on a heartbeat. Owner names the server
// replica that took it; every reservation expires at ExpiresAt (LED-2).
type Reservation struct {
	ID        string    `json:"id"`
	AgentID   string    `json:"agent_id"`
	SandboxID string    `json:"sandbox_id"`
	MiB       int64     `json:"mb"`
	Owner     string    `json:"owner"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}
