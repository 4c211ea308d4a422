package server

import (
	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/conf"
)

// Validate reports a configuration the server cannot honour, naming the flags to change
// (cmd/berth calls it before anything starts; zero fields are judged at their defaults, as
// New would set them). The error is an invalid_request *berth.Error.
//
// C31, LED-2/LED-4: ReservationTTL must be at least twice HeartbeatInterval. While a create is
// in flight its reservation is renewed, however long the start takes; once the create ends
// it still has one full TTL to live, and only the agent's next heartbeat — up to one period
// away, plus the time its POST takes — nets it. A shorter TTL drops the reservation while
// the agent's published figures do not yet count the sandbox, and the same memory is
// reserved twice.
//
// PLC-1: StaleAfter must be at least twice HeartbeatInterval too (see below).
func (c Config) Validate() error {
	def := DefaultConfig()
	ttl := conf.Or(c.ReservationTTL, def.ReservationTTL)
	hb := conf.Or(c.HeartbeatInterval, def.HeartbeatInterval)
	if ttl < 2*hb {
		return berth.Errorf(berth.EInvalidRequest,
			"--reservation-ttl (%s) must be at least twice --heartbeat-interval (%s): a reservation must outlive "+
				"the agent's next heartbeat, which takes it over (LED-4); raise --reservation-ttl to %s or more, "+
				"or lower --heartbeat-interval", ttl, hb, 2*hb)
	}
	// PLC-1: an agent whose heartbeat is older than StaleAfter gets no placements. A healthy
	// agent's last heartbeat is up to one period old (plus its POST), so a cutoff under two
	// periods calls healthy agents stale between beats and refuses creates a full fleet could
	// take.
	if stale := conf.Or(c.StaleAfter, def.StaleAfter); stale < 2*hb {
		return berth.Errorf(berth.EInvalidRequest,
			"--stale-after (%s) must be at least twice --heartbeat-interval (%s): a healthy agent's last heartbeat "+
				"is up to one interval old (PLC-1); raise --stale-after to %s or more, or lower --heartbeat-interval",
			stale, hb, 2*hb)
	}
	return nil
}
