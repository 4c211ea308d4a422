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

// ApplyHeartbeat records hb as received at now, in one transaction (AGT-1, LED-4, LIF-3):
//
//   - it applies nothing but hb.Ended when hb is overtaken: a heartbeat of the same boot with
//     a Seq at or above hb.Seq was applied already (C32: the order is the agent's sequence
//     number, never its clock; hb.HeartbeatAt is stored for operators and decides nothing);
//   - it upserts the agent with every heartbeat field and last_seen = now. The stored status
//     is draining while an operator drain is in force, else hb.Status ("" means active);
//   - it writes the agent events: "" → status on first sight (reason "registered"), old →
//     new on a status change ("heartbeat") and old → new boot id ("agent restarted"); on a
//     new boot, every live sandbox of the agent that hb does not list becomes lost (AGT-6);
//   - it applies hb.Ended: each listed sandbox that exists, belongs to hb.AgentID and is not
//     terminal moves to its (terminal) state, actor "agent/<id>". Unknown ids, other agents'
//     sandboxes and non-terminal states are ignored, so a retried list is harmless;
//   - it moves to running every starting or resuming sandbox of the agent that hb lists and
//     does not flag Starting (LIF-1, PAUSE-1);
//   - it nets (LED-4) the agent's reservations for sandboxes hb.Sandboxes lists, and every
//     reservation, of any agent, whose sandbox is terminal, each with the event held → netted;
//   - after commit, on first sight or a status change, it pushes the agent to WatchAgents.
//
// A paused sandbox has no agent (agent_id ""), so no heartbeat and no restart touches it
// (PAUSE-1). It returns the number of reservations netted.
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
		var oldSeq int64
		var oldHeld sql.NullString
		err := tx.QueryRowContext(ctx, `SELECT status, boot_id, drain_reason, heartbeat_seq, sandboxes FROM agents WHERE id = ?`, hb.AgentID).
			Scan(&oldStatus, &oldBoot, &drain, &oldSeq, &oldHeld)
		known := err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("sqlite: heartbeat of %q: %w", hb.AgentID, err)
		}
		if known && hb.Overtaken(oldBoot, oldSeq) {
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
				stream_restore_enabled, sandboxes, ended, version, boot_id, measurement_errors, last_seen,
				runtime, checkpoint, heartbeat_seq)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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
				last_seen = excluded.last_seen, runtime = excluded.runtime, checkpoint = excluded.checkpoint,
				heartbeat_seq = excluded.heartbeat_seq`,
			hb.AgentID, hb.Address, hb.Region, hb.Pool, b2i(hb.Preemptible), nullMS(hb.HeartbeatAt),
			string(status), string(reported), hb.CPUTotal, hb.CPUUsed, hb.MemoryMiBTotal, hb.MemoryMiBUsed,
			hb.MemoryMiBCommitted, hb.MemoryAdmission, hb.MemoryMiBAdmittable, b2i(hb.IntakeOpen),
			hb.MemoryPressure, hb.StartsInFlight, hb.NatIDFree, b2i(hb.StreamRestoreEnabled), held, ended,
			hb.Version, hb.BootID, hb.MeasurementErrors, ms(now), hb.Runtime, b2i(hb.Checkpoint), hb.Seq)
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
		if err := promoteRunning(ctx, tx, hb, actor, now); err != nil {
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
		if _, err := transitionTx(ctx, tx, e.ID, nil, e.State, nil, e.Reason, actor, now); err != nil {
			return err
		}
	}
	return nil
}

// promoteRunning moves to running every starting or resuming sandbox of this agent that the
// heartbeat lists and does not flag Starting: the agent runs it, whatever became of the
// replica that was starting or resuming it (LIF-1, PAUSE-1). It reads only the agent's
// starting and resuming rows (usually none), not every listed sandbox.
func promoteRunning(ctx context.Context, tx *sql.Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	if len(hb.Sandboxes) == 0 {
		return nil
	}
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = !h.Starting // a guest still starting (or restoring) does not run yet
	}
	ids, err := queryIDs(ctx, tx, `SELECT id FROM sandboxes WHERE agent_id = ? AND state IN (`+
		placeholders(len(promotedStates))+`) ORDER BY id`, append([]any{hb.AgentID}, promotedStates...)...)
	if err != nil {
		return fmt.Errorf("sqlite: promote for %q: %w", hb.AgentID, err)
	}
	for _, id := range ids {
		if !listed[id] {
			continue
		}
		if _, err := transitionTx(ctx, tx, id, promotedFrom, berth.SandboxRunning, nil,
			"agent reports it running", actor, now); err != nil {
			return err
		}
	}
	return nil
}

// promotedFrom lists the states a listed sandbox leaves for running (promoteRunning), and
// promotedStates the same for SQL IN clauses.
var (
	promotedFrom   = []berth.SandboxState{berth.SandboxStarting, berth.SandboxResuming}
	promotedStates = []any{string(berth.SandboxStarting), string(berth.SandboxResuming)}
)

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
		if _, err := transitionTx(ctx, tx, id, nil, berth.SandboxLost, nil, "agent restarted without it", actor, now); err != nil {
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
