package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
//     new on a status change ("heartbeat") and old → new boot id ("agent restarted");
//   - it applies hb.Ended: each listed sandbox that exists, belongs to hb.AgentID and is not
//     terminal moves to its (terminal) state, actor "agent/<id>". Unknown ids, other agents'
//     sandboxes and non-terminal states are ignored, so a retried list is harmless;
//   - it nets (LED-4) the agent's reservations for sandboxes hb.Sandboxes lists, and every
//     reservation, of any agent, whose sandbox is terminal, each with the event held → netted;
//   - after commit, on first sight or a status change, it pushes the agent to WatchAgents.
//
// It returns the number of reservations netted.
func (s *Store) ApplyHeartbeat(ctx context.Context, hb berth.Heartbeat, now time.Time) (int, error) {
	if hb.AgentID == "" {
		return 0, errors.New("sqlite: heartbeat: empty agent id")
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
	var changed bool // registered or status changed: tell the watchers after commit
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var oldStatus, oldBoot, drain string
		var oldAt sql.NullInt64
		var oldHeld sql.NullString
		err := tx.QueryRowContext(ctx, `SELECT status, boot_id, drain_reason, heartbeat_at, sandboxes FROM agents WHERE id = ?`, hb.AgentID).
			Scan(&oldStatus, &oldBoot, &drain, &oldAt, &oldHeld)
		known := err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("sqlite: heartbeat of %q: %w", hb.AgentID, err)
		}
		if known && oldBoot == hb.BootID && oldAt.Valid && !hb.HeartbeatAt.IsZero() && ms(hb.HeartbeatAt) < oldAt.Int64 {
			// Overtaken: a newer heartbeat of the same boot is already applied (this one's
			// POST was slow). Its figures are out of date; only its ended list is news.
			return applyEnded(ctx, tx, hb, actor, now)
		}
		if known && oldBoot == hb.BootID {
			if err := oomEvents(ctx, tx, []byte(oldHeld.String), hb, actor, now); err != nil {
				return err
			}
		}
		status := reported
		if drain != "" {
			status = berth.AgentDraining
		}
		_, err = tx.ExecContext(ctx, `
			INSERT INTO agents (id, address, region, pool, preemptible, heartbeat_at, status, reported_status,
				cpu_total, cpu_used, memory_mb_total, memory_mb_used, memory_mb_committed, memory_admission,
				memory_mb_admittable, intake_open, memory_pressure, starts_in_flight, natid_free,
				stream_restore_enabled, sandboxes, ended, version, boot_id, measurement_errors, last_seen)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET
				address = excluded.address, region = excluded.region, pool = excluded.pool,
				preemptible = excluded.preemptible, heartbeat_at = excluded.heartbeat_at,
				status = excluded.status, reported_status = excluded.reported_status,
				cpu_total = excluded.cpu_total, cpu_used = excluded.cpu_used,
				memory_mb_total = excluded.memory_mb_total, memory_mb_used = excluded.memory_mb_used,
				memory_mb_committed = excluded.memory_mb_committed, memory_admission = excluded.memory_admission,
				memory_mb_admittable = excluded.memory_mb_admittable, intake_open = excluded.intake_open,
				memory_pressure = excluded.memory_pressure, starts_in_flight = excluded.starts_in_flight,
				natid_free = excluded.natid_free, stream_restore_enabled = excluded.stream_restore_enabled,
				sandboxes = excluded.sandboxes, ended = excluded.ended, version = excluded.version,
				boot_id = excluded.boot_id, measurement_errors = excluded.measurement_errors,
				last_seen = excluded.last_seen`,
			hb.AgentID, hb.Address, hb.Region, hb.Pool, b2i(hb.Preemptible), nullMS(hb.HeartbeatAt),
			string(status), string(reported), hb.CPUTotal, hb.CPUUsed, hb.MemoryMiBTotal, hb.MemoryMiBUsed,
			hb.MemoryMiBCommitted, hb.MemoryAdmission, hb.MemoryMiBAdmittable, b2i(hb.IntakeOpen),
			hb.MemoryPressure, hb.StartsInFlight, hb.NatIDFree, b2i(hb.StreamRestoreEnabled), held, ended,
			hb.Version, hb.BootID, hb.MeasurementErrors, ms(now))
		if err != nil {
			return fmt.Errorf("sqlite: heartbeat of %q: %w", hb.AgentID, err)
		}
		ev := berth.Event{At: now, Entity: actor, Actor: actor}
		changed = !known || oldStatus != string(status)
		switch {
		case !known:
			ev.From, ev.To, ev.Reason = "", string(status), "registered"
			if err := insertEvent(ctx, tx, ev); err != nil {
				return err
			}
		case oldStatus != string(status):
			ev.From, ev.To, ev.Reason = oldStatus, string(status), "heartbeat"
			if err := insertEvent(ctx, tx, ev); err != nil {
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
	if changed {
		s.watch.notify(hb.AgentID)
	}
	return netted, nil
}

// applyEnded moves the sandboxes hb.Ended lists to their terminal states.
func applyEnded(ctx context.Context, tx *sql.Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	for _, e := range hb.Ended {
		if !e.State.Terminal() {
			continue
		}
		var owner string
		err := tx.QueryRowContext(ctx, `SELECT agent_id FROM sandboxes WHERE id = ?`, e.ID).Scan(&owner)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return fmt.Errorf("sqlite: ended sandbox %q: %w", e.ID, err)
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
func promoteStarting(ctx context.Context, tx *sql.Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	if len(hb.Sandboxes) == 0 {
		return nil
	}
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = !h.Starting // a guest still starting does not run yet
	}
	rows, err := tx.QueryContext(ctx, `SELECT id FROM sandboxes WHERE agent_id = ? AND state = ?`,
		hb.AgentID, string(berth.SandboxStarting))
	if err != nil {
		return fmt.Errorf("sqlite: promote for %q: %w", hb.AgentID, err)
	}
	var promote []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("sqlite: promote for %q: %w", hb.AgentID, err)
		}
		if listed[id] {
			promote = append(promote, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sqlite: promote for %q: %w", hb.AgentID, err)
	}
	for _, id := range promote {
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
func loseUnheld(ctx context.Context, tx *sql.Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = true
	}
	rows, err := tx.QueryContext(ctx, `SELECT id FROM sandboxes WHERE agent_id = ? AND state NOT IN (`+
		placeholders(len(terminalStates))+`) ORDER BY id`, append([]any{hb.AgentID}, terminalStates...)...)
	if err != nil {
		return fmt.Errorf("sqlite: reconcile %q: %w", hb.AgentID, err)
	}
	var lost []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("sqlite: reconcile %q: %w", hb.AgentID, err)
		}
		if !listed[id] {
			lost = append(lost, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sqlite: reconcile %q: %w", hb.AgentID, err)
	}
	for _, id := range lost {
		if _, err := transitionTx(ctx, tx, id, nil, berth.SandboxLost, "agent restarted without it", actor, now); err != nil {
			return err
		}
	}
	return nil
}

// netReservations implements LED-4 for one heartbeat and returns how many reservations it
// released.
func netReservations(ctx context.Context, tx *sql.Tx, hb berth.Heartbeat, actor string, now time.Time) (int, error) {
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = true
	}
	rows, err := tx.QueryContext(ctx, `
		SELECT r.id, r.agent_id, r.sandbox_id, COALESCE(s.state, '')
		FROM reservations r LEFT JOIN sandboxes s ON s.id = r.sandbox_id
		WHERE r.agent_id = ? OR s.state IN (`+placeholders(len(terminalStates))+`)
		ORDER BY r.id`,
		append([]any{hb.AgentID}, terminalStates...)...)
	if err != nil {
		return 0, fmt.Errorf("sqlite: netting for %q: %w", hb.AgentID, err)
	}
	type drop struct{ id, reason string }
	var drops []drop
	for rows.Next() {
		var id, agent, sid, state string
		if err := rows.Scan(&id, &agent, &sid, &state); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sqlite: netting for %q: %w", hb.AgentID, err)
		}
		switch {
		case agent == hb.AgentID && sid != "" && listed[sid]:
			drops = append(drops, drop{id, fmt.Sprintf("sandbox/%s listed by %s", sid, actor)})
		case berth.SandboxState(state).Terminal():
			drops = append(drops, drop{id, fmt.Sprintf("sandbox/%s %s", sid, state)})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("sqlite: netting for %q: %w", hb.AgentID, err)
	}
	netted := 0
	for _, d := range drops {
		gone, err := dropReservation(ctx, tx, d.id, resNetted, d.reason, actor, now)
		if err != nil {
			return 0, err
		}
		if gone {
			netted++
		}
	}
	return netted, nil
}

// Agents returns every known agent ordered by id.
func (s *Store) Agents(ctx context.Context) ([]berth.Agent, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+agentColumns+` FROM agents ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: agents: %w", err)
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
		return nil, fmt.Errorf("sqlite: agents: %w", err)
	}
	return out, nil
}

// Agent returns agent id or an error wrapping berth.ErrNotFound.
func (s *Store) Agent(ctx context.Context, id string) (berth.Agent, error) {
	a, err := scanAgent(s.db.QueryRowContext(ctx, `SELECT `+agentColumns+` FROM agents WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return berth.Agent{}, fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
	}
	return a, err
}

// SetAgentDrain marks (draining) or lifts an operator drain of agent id, with the event
// old status → new status (reason as given, actor as given). A drain without a reason stores
// DefaultDrainReason. Draining a drained agent, or undraining one that is not, changes
// nothing and writes no event. Undraining restores the status the agent last reported. An
// unknown id is an error wrapping berth.ErrNotFound. A change is pushed to WatchAgents after
// it commits (PLC-5).
func (s *Store) SetAgentDrain(ctx context.Context, id string, draining bool, reason, actor string, now time.Time) error {
	changed := false
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var status, reported, drain string
		err := tx.QueryRowContext(ctx, `SELECT status, reported_status, drain_reason FROM agents WHERE id = ?`, id).
			Scan(&status, &reported, &drain)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("sqlite: drain agent %q: %w", id, err)
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
		if _, err := tx.ExecContext(ctx, `UPDATE agents SET status = ?, drain_reason = ? WHERE id = ?`,
			newStatus, newDrain, id); err != nil {
			return fmt.Errorf("sqlite: drain agent %q: %w", id, err)
		}
		changed = true
		return insertEvent(ctx, tx, berth.Event{
			At: now, Entity: "agent/" + id, From: status, To: newStatus, Reason: evReason, Actor: actor,
		})
	})
	if err == nil && changed {
		s.watch.notify(id)
	}
	return err
}

// scanAgent reads one row selected with agentColumns.
func scanAgent(r scanner) (berth.Agent, error) {
	var a berth.Agent
	var status, held, ended string
	var preemptible, intake, stream int
	var hbAt, qUntil sql.NullInt64
	var lastSeen int64
	err := r.Scan(&a.AgentID, &a.Address, &a.Region, &a.Pool, &preemptible, &hbAt, &status, &a.CPUTotal,
		&a.CPUUsed, &a.MemoryMiBTotal, &a.MemoryMiBUsed, &a.MemoryMiBCommitted, &a.MemoryAdmission,
		&a.MemoryMiBAdmittable, &intake, &a.MemoryPressure, &a.StartsInFlight, &a.NatIDFree, &stream, &held,
		&ended, &a.Version, &a.BootID, &a.MeasurementErrors, &lastSeen, &a.DrainReason, &a.CreateFailures, &qUntil)
	if errors.Is(err, sql.ErrNoRows) {
		return a, err
	}
	if err != nil {
		return a, fmt.Errorf("sqlite: scan agent: %w", err)
	}
	a.Status = berth.AgentStatus(status)
	a.Preemptible, a.IntakeOpen, a.StreamRestoreEnabled = preemptible != 0, intake != 0, stream != 0
	a.HeartbeatAt, a.LastSeen, a.QuarantinedUntil = fromNullMS(hbAt), fromMS(lastSeen), fromNullMS(qUntil)
	a.Sandboxes = []berth.HeldSandbox{}
	if err := json.Unmarshal([]byte(held), &a.Sandboxes); err != nil {
		return a, fmt.Errorf("sqlite: agent %q sandboxes: %w", a.AgentID, err)
	}
	if err := json.Unmarshal([]byte(ended), &a.Ended); err != nil {
		return a, fmt.Errorf("sqlite: agent %q ended: %w", a.AgentID, err)
	}
	if len(a.Ended) == 0 {
		a.Ended = nil
	}
	return a, nil
}

// listJSON encodes a list for a JSON text column; nil becomes "[]".
func listJSON[T any](v []T) (string, error) {
	if len(v) == 0 {
		return "[]", nil
	}
	return jsonText(v)
}

// RecordCreateOutcome implements berth.AgentStore (PLC-9): it counts consecutive failed
// creates, quarantines the agent when they reach q.After, and resets on a success.
func (s *Store) RecordCreateOutcome(ctx context.Context, id string, failed bool, q berth.QuarantinePolicy, actor string, now time.Time) (berth.Agent, error) {
	changed := false
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var failures int
		var until sql.NullInt64
		err := tx.QueryRowContext(ctx, `SELECT create_failures, quarantined_until FROM agents WHERE id = ?`, id).
			Scan(&failures, &until)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("sqlite: create outcome of %q: %w", id, err)
		}
		c := q.Apply(failures, fromNullMS(until), failed, now)
		if c.Failures == failures && c.Until.Equal(fromNullMS(until)) {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE agents SET create_failures = ?, quarantined_until = ? WHERE id = ?`,
			c.Failures, nullMS(c.Until), id); err != nil {
			return fmt.Errorf("sqlite: create outcome of %q: %w", id, err)
		}
		if c.To == "" {
			return nil
		}
		changed = true
		return insertEvent(ctx, tx, berth.Event{At: now, Entity: "agent/" + id, From: c.From, To: c.To, Reason: c.Reason, Actor: actor})
	})
	if err != nil {
		return berth.Agent{}, err
	}
	if changed {
		s.watch.notify(id)
	}
	return s.Agent(ctx, id)
}

// oomEvents writes an event for every sandbox in which the kernel OOM killer struck since the
// agent's previous heartbeat (C09): the sandbox may live on, but it must not go unseen.
func oomEvents(ctx context.Context, tx *sql.Tx, oldHeld []byte, hb berth.Heartbeat, actor string, now time.Time) error {
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
