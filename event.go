package berth

import "time"

// Event is one append-only record of a state transition (LIF-3): time, entity, from, to,
// reason and actor. Entity is "<kind>/<id>", e.g. "sandbox/sb-1", "agent/a1",
// "reservation/r-9".
type Event struct {
	ID     int64     `json:"id,omitempty"`
	At     time.Time `json:"at"`
	Entity string    `json:"entity"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
	Actor  string    `json:"actor"`
}

// EventFilter selects events: every set field must match. Entity matches exactly, or as a
// prefix when it ends in "/" (e.g. "sandbox/"). Since is inclusive, Until exclusive; To
// selects transitions into one state (e.g. "lost"). Limit 0 means the store's default.
type EventFilter struct {
	Entity string
	Since  time.Time
	Until  time.Time
	To     string
	Limit  int
}
