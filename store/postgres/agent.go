package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-dev/berth"
)

// agentColumns is the column list every agent query selects, in scanAgent's order.
const agentColumns = `id, address, region, pool, preemptible, heartbeat_at, status, cpu_total, cpu_used,
	memory_mb_total, memory_mb_used, memory_mb_committed, memory_admission, memory_mb_admittable,
	intake_open, memory_pressure, starts_in_flight, natid_free, stream_restore_enabled, sandboxes, ended,
	version, boot_id, measurement_errors, last_seen, drain_reason, create_failures, quarantined_until`

// DefaultDrainReason is the drain reason stored when an operator drains without giving one.
const DefaultDrainReason = "operator drain"

// ApplyHeartbeat records hb as received at now, in one transaction (AGT-1, LED-4, LIF-3):
//
//   - it upserts the agent with every heartbeat field and last_seen = now. The stored status
//     is draining while an operator drain is in force, else hb.Status ("" means active);
//   - it writes the agent events: "" → status on first sight (reason "registered"), old →
//     new on a status change ("heartbeat") and old → new boot id ("agent restarted"); on a
//     new boot, every live sandbox of the agent that hb does not list becomes lost (AGT-6);
//   - it applies hb.Ended: each listed sandbox that exists, belongs to hb.AgentID and is not
//     terminal moves to its (terminal) state, actor "agent/<id>". Unknown ids, other agents'
//     sandboxes and non-terminal states are ignored, so a retried list is harmless;
//   - it moves to running every starting sandbox of the agent that hb lists (LIF-1);
//   - it nets (LED-4) the agent's reservations for sandboxes hb.Sandboxes lists, and every
//     reservation, of any agent, whose sandbox is terminal, each with the event held → netted;
//   - on first sight or a status change it notifies WatchAgents listeners on commit (PLC-5).
//
// The agent row is created (if new) and locked before it is read, so concurrent heartbeats of
// one agent, and Reserves against it, run one after the other. It returns the number of
// reservations netted.
func (s *Store) ApplyHeartbeat(ctx context.Context, hb berth.Heartbeat, now time.Time) (int, error) {
	if hb.AgentID == "" {
		return 0, errors.New("postgres: heartbeat: empty agent id")
	}
	reported := hb.Status
	if reported == "" {
		reported = berth.AgentActive
	}
	held, err := listJSON(hb.Sandboxes)
	if err != nil {
		return 0, err
	}
	ended, err := listJSON(hb.Ended)
	if err != nil {
		return 0, err
	}
	actor := "agent/" + hb.AgentID
	var netted int
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		netted = 0
		// Create a placeholder row if the agent is new: the insert (or, for a known agent,
		// the FOR UPDATE below) locks the row, so "first sight" is decided exactly once.
		var inserted bool
		err := tx.QueryRow(ctx, `INSERT INTO agents (id, status, last_seen) VALUES ($1, '', $2)
			ON CONFLICT (id) DO NOTHING RETURNING TRUE`, hb.AgentID, ms(now)).Scan(&inserted)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("postgres: heartbeat of %q: %w", hb.AgentID, err)
		}
		known := !inserted
		var oldStatus, oldBoot, drain string
		var oldAt *int64
		var oldHeld []byte
		if err := tx.QueryRow(ctx, `SELECT status, boot_id, drain_reason, heartbeat_at, sandboxes FROM agents WHERE id = $1 FOR UPDATE`,
			hb.AgentID).Scan(&oldStatus, &oldBoot, &drain, &oldAt, &oldHeld); err != nil {
			return fmt.Errorf("postgres: heartbeat of %q: %w", hb.AgentID, err)
		}
		if known && oldBoot == hb.BootID && oldAt != nil && !hb.HeartbeatAt.IsZero() && ms(hb.HeartbeatAt) < *oldAt {
			// Overtaken: a newer heartbeat of the same boot is already applied (this one's
			// POST was slow). Its figures are out of date; only its ended list is news.
			return applyEnded(ctx, tx, hb, actor, now)
		}
		if known && oldBoot == hb.BootID {
			if err := oomEvents(ctx, tx, oldHeld, hb, actor, now); err != nil {
				return err
			}
		}
		status := reported
		if drain != "" {
			status = berth.AgentDraining
		}
		_, err = tx.Exec(ctx, `
			UPDATE agents SET address = $2, region = $3, pool = $4, preemptible = $5, heartbeat_at = $6,
				status = $7, reported_status = $8, cpu_total = $9, cpu_used = $10, memory_mb_total = $11,
				memory_mb_used = $12, memory_mb_committed = $13, memory_admission = $14,
				memory_mb_admittable = $15, intake_open = $16, memory_pressure = $17, starts_in_flight = $18,
				natid_free = $19, stream_restore_enabled = $20, sandboxes = $21, ended = $22, version = $23,
				boot_id = $24, measurement_errors = $25, last_seen = $26
			WHERE id = $1`,
			hb.AgentID, hb.Address, hb.Region, hb.Pool, hb.Preemptible, nullMS(hb.HeartbeatAt),
			string(status), string(reported), hb.CPUTotal, hb.CPUUsed, hb.MemoryMiBTotal, hb.MemoryMiBUsed,
			hb.MemoryMiBCommitted, hb.MemoryAdmission, hb.MemoryMiBAdmittable, hb.IntakeOpen,
			hb.MemoryPressure, hb.StartsInFlight, hb.NatIDFree, hb.StreamRestoreEnabled, held, ended,
			hb.Version, hb.BootID, hb.MeasurementErrors, ms(now))
		if err != nil {
			return fmt.Errorf("postgres: heartbeat of %q: %w", hb.AgentID, err)
		}
		ev := berth.Event{At: now, Entity: actor, Actor: actor}
		switch {
		case !known:
			ev.From, ev.To, ev.Reason = "", string(status), "registered"
		case oldStatus != string(status):
			ev.From, ev.To, ev.Reason = oldStatus, string(status), "heartbeat"
		}
		if ev.Reason != "" {
			if err := insertEvent(ctx, tx, ev); err != nil {
				return err
			}
			if err := notifyAgent(ctx, tx, hb.AgentID); err != nil {
				return err
			}
		}
		if known && oldBoot != hb.BootID {
			ev.From, ev.To, ev.Reason = oldBoot, hb.BootID, "agent restarted"
			if err := insertEvent(ctx, tx, ev); err != nil {
				return err
			}
			if err := loseUnheld(ctx, tx, hb, actor, now); err != nil {
				return err
			}
		}
		if err := applyEnded(ctx, tx, hb, actor, now); err != nil {
			return err
		}
		if err := promoteStarting(ctx, tx, hb, actor, now); err != nil {
			return err
		}
		netted, err = netReservations(ctx, tx, hb, actor, now)
		return err
	})
	if err != nil {
		return 0, err
	}
	return netted, nil
}

// applyEnded moves the sandboxes hb.Ended lists to their terminal states.
func applyEnded(ctx context.Context, tx pgx.Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	for _, e := range hb.Ended {
		if !e.State.Terminal() {
			continue
		}
		var owner string
		err := tx.QueryRow(ctx, `SELECT agent_id FROM sandboxes WHERE id = $1`, e.ID).Scan(&owner)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return fmt.Errorf("postgres: ended sandbox %q: %w", e.ID, err)
		}
		if owner != hb.AgentID {
			continue
		}
		if _, err := transitionTx(ctx, tx, e.ID, nil, e.State, e.Reason, actor, now); err != nil {
			return err
		}
	}
	return nil
}

// promoteStarting moves to running every starting sandbox of this agent that the heartbeat
// lists: the agent runs it, whatever became of the replica that was starting it (LIF-1).
// It reads only the agent's starting rows (usually none), not every listed sandbox.
func promoteStarting(ctx context.Context, tx pgx.Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	if len(hb.Sandboxes) == 0 {
		return nil
	}
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = !h.Starting // a guest still starting does not run yet
	}
	ids, err := queryIDs(ctx, tx, `SELECT id FROM sandboxes WHERE agent_id = $1 AND state = $2 ORDER BY id`,
		hb.AgentID, string(berth.SandboxStarting))
	if err != nil {
		return fmt.Errorf("postgres: promote for %q: %w", hb.AgentID, err)
	}
	for _, id := range ids {
		if !listed[id] {
			continue
		}
		if _, err := transitionTx(ctx, tx, id, []berth.SandboxState{berth.SandboxStarting}, berth.SandboxRunning,
			"agent reports it running", actor, now); err != nil {
			return err
		}
	}
	return nil
}

// loseUnheld marks lost every live sandbox the store assigns to a restarted agent that its
// first heartbeat after the restart does not list (AGT-6): a new boot holds nothing the
// old one did not hand over, so "running" would be a lie.
func loseUnheld(ctx context.Context, tx pgx.Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = true
	}
	ids, err := queryIDs(ctx, tx, `SELECT id FROM sandboxes WHERE agent_id = $1 AND NOT (state = ANY($2)) ORDER BY id`,
		hb.AgentID, terminalStates)
	if err != nil {
		return fmt.Errorf("postgres: reconcile %q: %w", hb.AgentID, err)
	}
	for _, id := range ids {
		if listed[id] {
			continue
		}
		if _, err := transitionTx(ctx, tx, id, nil, berth.SandboxLost, "agent restarted without it", actor, now); err != nil {
			return err
		}
	}
	return nil
}

// netReservations implements LED-4 for one heartbeat and returns how many reservations it
// released.
func netReservations(ctx context.Context, tx pgx.Tx, hb berth.Heartbeat, actor string, now time.Time) (int, error) {
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = true
	}
	rows, err := tx.Query(ctx, `
		SELECT r.id, r.agent_id, r.sandbox_id, COALESCE(s.state, '')
		FROM reservations r LEFT JOIN sandboxes s ON s.id = r.sandbox_id
		WHERE r.agent_id = $1 OR s.state = ANY($2)
		ORDER BY r.id`, hb.AgentID, terminalStates)
	if err != nil {
		return 0, fmt.Errorf("postgres: netting for %q: %w", hb.AgentID, err)
	}
	reasons := map[string]string{}
	var ids []string
	for rows.Next() {
		var id, agent, sid, state string
		if err := rows.Scan(&id, &agent, &sid, &state); err != nil {
			rows.Close()
			return 0, fmt.Errorf("postgres: netting for %q: %w", hb.AgentID, err)
		}
		switch {
		case agent == hb.AgentID && sid != "" && listed[sid]:
			reasons[id] = fmt.Sprintf("sandbox/%s listed by %s", sid, actor)
		case berth.SandboxState(state).Terminal():
			reasons[id] = fmt.Sprintf("sandbox/%s %s", sid, state)
		default:
			continue
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("postgres: netting for %q: %w", hb.AgentID, err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	gone, err := dropReservations(ctx, tx, `DELETE FROM reservations WHERE id = ANY($1) RETURNING id`, []any{ids},
		func(id string) berth.Event {
			return berth.Event{At: now, Entity: "reservation/" + id, From: resHeld, To: resNetted, Reason: reasons[id], Actor: actor}
		})
	return gone, err
}

// Agents returns every known agent ordered by id.
func (s *Store) Agents(ctx context.Context) ([]berth.Agent, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+agentColumns+` FROM agents ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("postgres: agents: %w", err)
	}
	defer rows.Close()
	out := []berth.Agent{}
	for rows.Next() {
		a, err := scanAgent(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: agents: %w", err)
	}
	return out, nil
}

// Agent returns agent id or an error wrapping berth.ErrNotFound.
func (s *Store) Agent(ctx context.Context, id string) (berth.Agent, error) {
	a, err := scanAgent(s.pool.QueryRow(ctx, `SELECT `+agentColumns+` FROM agents WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return berth.Agent{}, fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
	}
	return a, err
}

// SetAgentDrain marks (draining) or lifts an operator drain of agent id, with the event
// old status → new status (reason as given, actor as given), and notifies WatchAgents
// listeners on commit (PLC-5). A drain without a reason stores DefaultDrainReason. Draining a
// drained agent, or undraining one that is not, changes nothing, writes no event and notifies
// nobody. Undraining restores the status the agent last reported. An unknown id is an error
// wrapping berth.ErrNotFound.
func (s *Store) SetAgentDrain(ctx context.Context, id string, draining bool, reason, actor string, now time.Time) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
		var status, reported, drain string
		err := tx.QueryRow(ctx, `SELECT status, reported_status, drain_reason FROM agents WHERE id = $1 FOR UPDATE`, id).
			Scan(&status, &reported, &drain)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("postgres: drain agent %q: %w", id, err)
		}
		if draining == (drain != "") {
			return nil
		}
		newStatus, newDrain := reported, ""
		if newStatus == "" {
			newStatus = string(berth.AgentActive)
		}
		evReason := reason
		if draining {
			newStatus, newDrain = string(berth.AgentDraining), reason
			if newDrain == "" {
				newDrain, evReason = DefaultDrainReason, DefaultDrainReason
			}
		} else if evReason == "" {
			evReason = "undrained"
		}
		if _, err := tx.Exec(ctx, `UPDATE agents SET status = $1, drain_reason = $2 WHERE id = $3`,
			newStatus, newDrain, id); err != nil {
			return fmt.Errorf("postgres: drain agent %q: %w", id, err)
		}
		if err := insertEvent(ctx, tx, berth.Event{
			At: now, Entity: "agent/" + id, From: status, To: newStatus, Reason: evReason, Actor: actor,
		}); err != nil {
			return err
		}
		return notifyAgent(ctx, tx, id)
	})
}

// scanAgent reads one row selected with agentColumns.
func scanAgent(r scanner) (berth.Agent, error) {
	var a berth.Agent
	var status string
	var held, ended []byte
	var hbAt, qUntil *int64
	var lastSeen int64
	err := r.Scan(&a.AgentID, &a.Address, &a.Region, &a.Pool, &a.Preemptible, &hbAt, &status, &a.CPUTotal,
		&a.CPUUsed, &a.MemoryMiBTotal, &a.MemoryMiBUsed, &a.MemoryMiBCommitted, &a.MemoryAdmission,
		&a.MemoryMiBAdmittable, &a.IntakeOpen, &a.MemoryPressure, &a.StartsInFlight, &a.NatIDFree,
		&a.StreamRestoreEnabled, &held, &ended, &a.Version, &a.BootID, &a.MeasurementErrors, &lastSeen,
		&a.DrainReason, &a.CreateFailures, &qUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, err
	}
	if err != nil {
		return a, fmt.Errorf("postgres: scan agent: %w", err)
	}
	a.Status = berth.AgentStatus(status)
	a.HeartbeatAt, a.LastSeen, a.QuarantinedUntil = fromNullMS(hbAt), fromMS(lastSeen), fromNullMS(qUntil)
	a.Sandboxes = []berth.HeldSandbox{}
	if err := json.Unmarshal(held, &a.Sandboxes); err != nil {
		return a, fmt.Errorf("postgres: agent %q sandboxes: %w", a.AgentID, err)
	}
	if err := json.Unmarshal(ended, &a.Ended); err != nil {
		return a, fmt.Errorf("postgres: agent %q ended: %w", a.AgentID, err)
	}
	if len(a.Ended) == 0 {
		a.Ended = nil
	}
	return a, nil
}

// listJSON encodes a list for a JSONB column; nil becomes "[]".
func listJSON[T any](v []T) (string, error) {
	if len(v) == 0 {
		return "[]", nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("postgres: encode json: %w", err)
	}
	return string(b), nil
}

// RecordCreateOutcome implements berth.AgentStore (PLC-9): it counts consecutive failed
// creates under the agent's row lock, quarantines the agent when they reach q.After (with a
// notification to every replica), and resets on a success.
func (s *Store) RecordCreateOutcome(ctx context.Context, id string, failed bool, q berth.QuarantinePolicy, actor string, now time.Time) (berth.Agent, error) {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var failures int
		var until *int64
		err := tx.QueryRow(ctx, `SELECT create_failures, quarantined_until FROM agents WHERE id = $1 FOR UPDATE`, id).
			Scan(&failures, &until)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("postgres: create outcome of %q: %w", id, err)
		}
		c := q.Apply(failures, fromNullMS(until), failed, now)
		if c.Failures == failures && c.Until.Equal(fromNullMS(until)) {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE agents SET create_failures = $2, quarantined_until = $3 WHERE id = $1`,
			id, c.Failures, nullMS(c.Until)); err != nil {
			return fmt.Errorf("postgres: create outcome of %q: %w", id, err)
		}
		if c.To == "" {
			return nil
		}
		if err := insertEvent(ctx, tx, berth.Event{At: now, Entity: "agent/" + id, From: c.From, To: c.To, Reason: c.Reason, Actor: actor}); err != nil {
			return err
		}
		return notifyAgent(ctx, tx, id)
	})
	if err != nil {
		return berth.Agent{}, err
	}
	return s.Agent(ctx, id)
}

// oomEvents writes an event for every sandbox in which the kernel OOM killer struck since the
// agent's previous heartbeat (C09): the sandbox may live on, but it must not go unseen.
func oomEvents(ctx context.Context, tx pgx.Tx, oldHeld []byte, hb berth.Heartbeat, actor string, now time.Time) error {
	var before []berth.HeldSandbox
	if len(oldHeld) > 0 {
		_ = json.Unmarshal(oldHeld, &before) // an unreadable old list only means no baseline
	}
	for id, n := range berth.NewOOMKills(before, hb.Sandboxes) {
		if err := insertEvent(ctx, tx, berth.Event{At: now, Entity: "sandbox/" + id, From: string(berth.SandboxRunning),
			To: "oom_kill", Reason: fmt.Sprintf("the kernel OOM killer killed %d process(es) in it", n), Actor: actor}); err != nil {
			return err
		}
	}
	return nil
}
