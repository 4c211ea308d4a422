package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"database/sql"

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
//     new boot, every live sandbox of the agent that hb does not list becomes lost (AGT-6),
//     and its create-failure count and quarantine are cleared (PLC-9: the failures were the
//     old process's), with the event "quarantined → active" if it was quarantined;
//   - it applies hb.Ended: each listed sandbox that exists, belongs to hb.AgentID and is not
//     terminal moves to its (terminal) state, actor "agent/<id>". Unknown ids, other agents'
//     sandboxes and non-terminal states are ignored, so a retried list is harmless;
//   - it moves to running every starting or resuming sandbox of the agent that hb lists and
//     does not flag Starting (LIF-1, PAUSE-1);
//   - it nets (LED-4) the agent's reservations for sandboxes hb.Sandboxes lists, and every
//     reservation, of any agent, whose sandbox is terminal, each with the event held → netted;
//   - on first sight or a status change it notifies WatchAgents listeners on commit (PLC-5).
//
// The agent row is created (if new) and locked before it is read, so concurrent heartbeats of
// one agent, and Reserves against it, run one after the other. It returns the number of
// reservations netted. A paused sandbox has no agent (agent_id ""), so no heartbeat and no
// restart touches it (PAUSE-1).
func (s *Store) ApplyHeartbeat(ctx context.Context, hb berth.Heartbeat, now time.Time) (int, error) {
	if hb.AgentID == "" {
		return 0, s.errorf("heartbeat: empty agent id")
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
	err = s.inTx(ctx, func(tx *Tx) error {
		netted = 0
		// Create a placeholder row if the agent is new: the insert (or, for a known agent,
		// the FOR UPDATE below) locks the row, so "first sight" is decided exactly once.
		var inserted bool
		err := tx.queryRow(ctx, `INSERT INTO agents (id, status, last_seen) VALUES (?, '', ?)
			ON CONFLICT (id) DO NOTHING RETURNING TRUE`, hb.AgentID, ms(now)).Scan(&inserted)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return s.errorf("heartbeat of %q: %w", hb.AgentID, err)
		}
		known := !inserted
		var oldStatus, oldBoot, drain string
		var oldSeq int64
		var oldHeld []byte
		if err := tx.queryRow(ctx, `SELECT status, boot_id, drain_reason, heartbeat_seq, sandboxes FROM agents WHERE id = ?`+s.d.ForUpdate,
			hb.AgentID).Scan(&oldStatus, &oldBoot, &drain, &oldSeq, &oldHeld); err != nil {
			return s.errorf("heartbeat of %q: %w", hb.AgentID, err)
		}
		if known && hb.Overtaken(oldBoot, oldSeq) {
			// Overtaken: a newer heartbeat of the same boot is already applied (this one's
			// POST was slow). Its figures are out of date; only its ended list is news.
			return s.applyEnded(ctx, tx, hb, actor, now)
		}
		if known && oldBoot == hb.BootID {
			if err := s.oomEvents(ctx, tx, oldHeld, hb, actor, now); err != nil {
				return err
			}
		}
		status := reported
		if drain != "" {
			status = berth.AgentDraining
		}
		_, err = tx.exec(ctx, `
			UPDATE agents SET address = ?, region = ?, pool = ?, preemptible = ?, heartbeat_at = ?,
				status = ?, reported_status = ?, cpu_total = ?, cpu_used = ?, memory_mb_total = ?,
				memory_mb_used = ?, memory_mb_committed = ?, memory_admission = ?,
				memory_mb_admittable = ?, intake_open = ?, memory_pressure = ?, starts_in_flight = ?,
				sandboxes = ?, ended = ?, version = ?,
				boot_id = ?, measurement_errors = ?, last_seen = ?, runtime = ?, checkpoint = ?,
				heartbeat_seq = ?
			WHERE id = ?`,
			hb.Address, hb.Region, hb.Pool, hb.Preemptible, nullMS(hb.HeartbeatAt),
			string(status), string(reported), hb.CPUTotal, hb.CPUUsed, hb.MemoryMiBTotal, hb.MemoryMiBUsed,
			hb.MemoryMiBCommitted, hb.MemoryAdmission, hb.MemoryMiBAdmittable, hb.IntakeOpen,
			hb.MemoryPressure, hb.StartsInFlight, held, ended,
			hb.Version, hb.BootID, hb.MeasurementErrors, ms(now), hb.Runtime, hb.Checkpoint, hb.Seq, hb.AgentID)
		if err != nil {
			return s.errorf("heartbeat of %q: %w", hb.AgentID, err)
		}
		ev := berth.Event{At: now, Entity: actor, Actor: actor}
		switch {
		case !known:
			ev.From, ev.To, ev.Reason = "", string(status), "registered"
		case oldStatus != string(status):
			ev.From, ev.To, ev.Reason = oldStatus, string(status), "heartbeat"
		}
		if ev.Reason != "" {
			if err := s.insertEvent(ctx, tx, ev); err != nil {
				return err
			}
			if err := s.d.NotifyAgent(ctx, tx, hb.AgentID); err != nil {
				return err
			}
		}
		if known && oldBoot != hb.BootID {
			ev.From, ev.To, ev.Reason = oldBoot, hb.BootID, "agent restarted"
			if err := s.insertEvent(ctx, tx, ev); err != nil {
				return err
			}
			if err := s.loseUnheld(ctx, tx, hb, actor, now); err != nil {
				return err
			}
			if err := s.clearQuarantine(ctx, tx, hb.AgentID, actor, now); err != nil {
				return err
			}
		}
		if err := s.applyEnded(ctx, tx, hb, actor, now); err != nil {
			return err
		}
		if err := s.promoteRunning(ctx, tx, hb, actor, now); err != nil {
			return err
		}
		netted, err = s.netReservations(ctx, tx, hb, actor, now)
		return err
	})
	if err != nil {
		return 0, err
	}
	return netted, nil
}

// applyEnded moves the sandboxes hb.Ended lists to their terminal states. Each row is locked
// before its owner is judged, so a sandbox a concurrent MoveSandbox hands to another agent is
// not ended by its former one (PAUSE-1, SPOT-3).
func (s *Store) applyEnded(ctx context.Context, tx *Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	for _, e := range hb.Ended {
		if !e.State.Terminal() {
			continue
		}
		var owner string
		err := tx.queryRow(ctx, `SELECT agent_id FROM sandboxes WHERE id = ?`+s.d.ForUpdate, e.ID).Scan(&owner)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return s.errorf("ended sandbox %q: %w", e.ID, err)
		}
		if owner != hb.AgentID {
			continue
		}
		if _, err := s.transitionTx(ctx, tx, e.ID, nil, e.State, nil, e.Reason, actor, now); err != nil {
			return err
		}
	}
	return nil
}

// promoteRunning moves to running every starting or resuming sandbox of this agent that the
// heartbeat lists and does not flag Starting: the agent runs it, whatever became of the
// replica that was starting or resuming it (LIF-1, PAUSE-1). It reads only the agent's
// starting and resuming rows (usually none), not every listed sandbox, and locks them, so a
// row a concurrent MoveSandbox hands to another agent is re-read and skipped.
func (s *Store) promoteRunning(ctx context.Context, tx *Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	if len(hb.Sandboxes) == 0 {
		return nil
	}
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = !h.Starting // a guest still starting (or restoring) does not run yet
	}
	ids, err := s.queryIDs(ctx, tx, `SELECT id FROM sandboxes WHERE agent_id = ? AND state IN `+inPromoted+` ORDER BY id`+s.d.ForUpdate,
		append([]any{hb.AgentID}, promotedStates...)...)
	if err != nil {
		return s.errorf("promote for %q: %w", hb.AgentID, err)
	}
	for _, id := range ids {
		if !listed[id] {
			continue
		}
		if _, err := s.transitionTx(ctx, tx, id, promotedFrom, berth.SandboxRunning, nil,
			"agent reports it running", actor, now); err != nil {
			return err
		}
	}
	return nil
}

// promotedFrom lists the states a listed sandbox leaves for running (promoteRunning), and
// promotedStates the same for SQL IN clauses (inPromoted).
var (
	promotedFrom   = []berth.SandboxState{berth.SandboxStarting, berth.SandboxResuming}
	promotedStates = []any{string(berth.SandboxStarting), string(berth.SandboxResuming)}
	inPromoted     = "(" + placeholders(len(promotedStates)) + ")"
)

// loseUnheld marks lost every live sandbox the store assigns to a restarted agent that its
// first heartbeat after the restart does not list (AGT-6): a new boot holds nothing the
// old one did not hand over, so "running" would be a lie. The rows are locked as they are
// read, so one a concurrent MoveSandbox hands to another agent (or pauses) is skipped.
func (s *Store) loseUnheld(ctx context.Context, tx *Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = true
	}
	ids, err := s.queryIDs(ctx, tx, `SELECT id FROM sandboxes WHERE agent_id = ? AND state NOT IN `+inTerminal+` ORDER BY id`+s.d.ForUpdate,
		append([]any{hb.AgentID}, terminalStates...)...)
	if err != nil {
		return s.errorf("reconcile %q: %w", hb.AgentID, err)
	}
	for _, id := range ids {
		if listed[id] {
			continue
		}
		if _, err := s.transitionTx(ctx, tx, id, nil, berth.SandboxLost, nil, "agent restarted without it", actor, now); err != nil {
			return err
		}
	}
	return nil
}

// netReservations implements LED-4 for one heartbeat and returns how many reservations it
// released.
func (s *Store) netReservations(ctx context.Context, tx *Tx, hb berth.Heartbeat, actor string, now time.Time) (int, error) {
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = true
	}
	rows, err := tx.query(ctx, `
		SELECT r.id, r.agent_id, r.sandbox_id, COALESCE(s.state, '')
		FROM reservations r LEFT JOIN sandboxes s ON s.id = r.sandbox_id
		WHERE r.agent_id = ? OR s.state IN `+inTerminal+`
		ORDER BY r.id`, append([]any{hb.AgentID}, terminalStates...)...)
	if err != nil {
		return 0, s.errorf("netting for %q: %w", hb.AgentID, err)
	}
	reasons := map[string]string{}
	var ids []string
	for rows.Next() {
		var id, agent, sid, state string
		if err := rows.Scan(&id, &agent, &sid, &state); err != nil {
			rows.Close()
			return 0, s.errorf("netting for %q: %w", hb.AgentID, err)
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
		return 0, s.errorf("netting for %q: %w", hb.AgentID, err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	cond, args := s.in("id", ids)
	gone, err := s.dropReservations(ctx, tx, `DELETE FROM reservations WHERE `+cond+` RETURNING id`, args,
		func(id string) berth.Event {
			return berth.Event{At: now, Entity: "reservation/" + id, From: resHeld, To: resNetted, Reason: reasons[id], Actor: actor}
		})
	return gone, err
}

// oomEvents writes an event for every sandbox in which the kernel OOM killer struck since the
// agent's previous heartbeat (C09): the sandbox may live on, but it must not go unseen.
func (s *Store) oomEvents(ctx context.Context, tx *Tx, oldHeld []byte, hb berth.Heartbeat, actor string, now time.Time) error {
	var before []berth.HeldSandbox
	if len(oldHeld) > 0 {
		_ = json.Unmarshal(oldHeld, &before) // an unreadable old list only means no baseline
	}
	for id, n := range berth.NewOOMKills(before, hb.Sandboxes) {
		if err := s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "sandbox/" + id, From: string(berth.SandboxRunning),
			To: "oom_kill", Reason: fmt.Sprintf("the kernel OOM killer killed %d process(es) in it", n), Actor: actor}); err != nil {
			return err
		}
	}
	return nil
}

// clearQuarantine resets an agent's create-failure count and quarantine when it restarts
// (issue 15, point 5): the failures belonged to the process that is gone. If a quarantine
// was still in force at now it writes "quarantined → active" ("agent restarted") and
// notifies WatchAgents listeners.
func (s *Store) clearQuarantine(ctx context.Context, tx *Tx, id, actor string, now time.Time) error {
	var failures int
	var until sql.NullInt64
	if err := tx.queryRow(ctx, `SELECT create_failures, quarantined_until FROM agents WHERE id = ?`, id).
		Scan(&failures, &until); err != nil {
		return s.errorf("restart of %q: %w", id, err)
	}
	if failures == 0 && !until.Valid {
		return nil
	}
	if _, err := tx.exec(ctx, `UPDATE agents SET create_failures = 0, quarantined_until = NULL WHERE id = ?`, id); err != nil {
		return s.errorf("restart of %q: %w", id, err)
	}
	if !fromNullMS(until).After(now) {
		return nil
	}
	if err := s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "agent/" + id, From: string(berth.AgentQuarantined), To: string(berth.AgentActive),
		Reason: "agent restarted: its create failures were the old process's", Actor: actor}); err != nil {
		return err
	}
	return s.d.NotifyAgent(ctx, tx, id)
}
