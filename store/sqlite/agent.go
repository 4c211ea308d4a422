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
	version, boot_id, measurement_errors, last_seen, drain_reason, create_failures, quarantined_until,
	runtime, checkpoint, heartbeat_seq`

// DefaultDrainReason is the drain reason stored when an operator drains without giving one.
const DefaultDrainReason = "operator drain"

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
	var preemptible, intake, stream, checkpoint int
	var hbAt, qUntil sql.NullInt64
	var lastSeen int64
	err := r.Scan(&a.AgentID, &a.Address, &a.Region, &a.Pool, &preemptible, &hbAt, &status, &a.CPUTotal,
		&a.CPUUsed, &a.MemoryMiBTotal, &a.MemoryMiBUsed, &a.MemoryMiBCommitted, &a.MemoryAdmission,
		&a.MemoryMiBAdmittable, &intake, &a.MemoryPressure, &a.StartsInFlight, &a.NatIDFree, &stream, &held,
		&ended, &a.Version, &a.BootID, &a.MeasurementErrors, &lastSeen, &a.DrainReason, &a.CreateFailures, &qUntil,
		&a.Runtime, &checkpoint, &a.Seq)
	if errors.Is(err, sql.ErrNoRows) {
		return a, err
	}
	if err != nil {
		return a, fmt.Errorf("sqlite: scan agent: %w", err)
	}
	a.Status = berth.AgentStatus(status)
	a.Preemptible, a.IntakeOpen, a.StreamRestoreEnabled = preemptible != 0, intake != 0, stream != 0
	a.Checkpoint = checkpoint != 0
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
