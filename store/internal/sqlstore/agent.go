package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"database/sql"

	"github.com/berth-dev/berth"
)

// agentColumns is the column list every agent query selects, in scanAgent's order.
const agentColumns = `id, address, region, pool, preemptible, heartbeat_at, status, cpu_total, cpu_used,
	memory_mb_total, memory_mb_used, memory_mb_committed, memory_admission, memory_mb_admittable,
	intake_open, memory_pressure, starts_in_flight, sandboxes, ended,
	version, boot_id, measurement_errors, last_seen, drain_reason, create_failures, quarantined_until,
	runtime, checkpoint, heartbeat_seq`

// DefaultDrainReason is the drain reason stored when an operator drains without giving one.
const DefaultDrainReason = "operator drain"

// Agents returns every known agent ordered by id.
func (s *Store) Agents(ctx context.Context) ([]berth.Agent, error) {
	out, err := s.readAgents(ctx, ` ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return out, s.fillHeld(ctx, out)
}

// AgentsChangedSince implements berth.Store (issue 16, goal 2). Where the dialect keeps
// change cursors (Dialect.ChangeCursorSQL), it takes a new cursor first and then reads the
// rows written by transactions the earlier cursor's read could not have seen. A cursor is
// "<database identity>/<position>"; one that is not this database's own — "" included,
// another server's or database's, one ahead of the database's position, or not a positive
// position — gets a whole read. Elsewhere every read is whole and Cursor is "".
func (s *Store) AgentsChangedSince(ctx context.Context, cursor string) (berth.AgentChanges, error) {
	out := berth.AgentChanges{Full: true}
	where, args := "", []any(nil)
	if s.d.ChangeCursorSQL != "" {
		// The cursor is taken before the read: a change it does not cover commits after
		// it, so the next read's condition finds it even if this read missed it.
		var id, pos string
		if err := s.pool().queryRow(ctx, s.d.ChangeCursorSQL).Scan(&id, &pos); err != nil {
			return out, s.errorf("agent change cursor: %w", err)
		}
		out.Cursor = id + "/" + pos
		if was, ok := ownCursor(cursor, id, pos); ok {
			where, args, out.Full = ` WHERE `+s.d.ChangedSinceSQL, []any{was}, false
		}
	}
	agents, err := s.readAgents(ctx, where, args...)
	out.Agents = agents
	return out, err
}

// ownCursor returns the position of cursor, and true, when cursor names the database of
// identity id and a position above 0 and at most pos (the database's position now).
func ownCursor(cursor, id, pos string) (string, bool) {
	i := strings.LastIndexByte(cursor, '/')
	if i < 0 || cursor[:i] != id {
		return "", false
	}
	was, err1 := strconv.ParseInt(cursor[i+1:], 10, 64)
	now, err2 := strconv.ParseInt(pos, 10, 64)
	return cursor[i+1:], err1 == nil && err2 == nil && was > 0 && was <= now
}

// readAgents reads the agent rows that tail (a WHERE and/or ORDER BY clause, or "")
// selects, each agent's Sandboxes empty (not nil).
func (s *Store) readAgents(ctx context.Context, tail string, args ...any) ([]berth.Agent, error) {
	rows, err := s.pool().query(ctx, `SELECT `+agentColumns+` FROM agents`+tail, args...)
	if err != nil {
		return nil, s.errorf("agents: %w", err)
	}
	defer rows.Close()
	out := []berth.Agent{}
	for rows.Next() {
		a, err := s.scanAgent(rows)
		if err != nil {
			return nil, err
		}
		a.Sandboxes = []berth.HeldSandbox{} // a list a replica of the previous release wrote is not read
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("agents: %w", err)
	}
	rows.Close()
	return out, nil
}

// fillHeld sets each agent's Sandboxes from agent_held (issue 16, goal 2), in one query.
func (s *Store) fillHeld(ctx context.Context, agents []berth.Agent) error {
	if len(agents) == 0 {
		return nil
	}
	at := make(map[string]int, len(agents))
	for i := range agents {
		at[agents[i].AgentID] = i
		agents[i].Sandboxes = []berth.HeldSandbox{} // a list a replica of the previous release wrote is not read
	}
	query, args := `SELECT agent_id, sandbox_id, resident_mb, measured, starting, oom_kills, incarnation FROM agent_held`, []any(nil)
	if len(agents) == 1 {
		query, args = query+` WHERE agent_id = ?`, []any{agents[0].AgentID}
	}
	rows, err := s.pool().query(ctx, query+` ORDER BY agent_id, sandbox_id`, args...)
	if err != nil {
		return s.errorf("held sandboxes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var agent string
		var h berth.HeldSandbox
		if err := rows.Scan(&agent, &h.ID, &h.ResidentMiB, &h.Measured, &h.Starting, &h.OOMKills, &h.Incarnation); err != nil {
			return s.errorf("held sandboxes: %w", err)
		}
		if i, ok := at[agent]; ok {
			agents[i].Sandboxes = append(agents[i].Sandboxes, h)
		}
	}
	if err := rows.Err(); err != nil {
		return s.errorf("held sandboxes: %w", err)
	}
	return nil
}

// UnmeasuredHeld implements berth.Store (issue 16, goal 6): one query of agent_held's rows
// not yet measured, however many are held.
func (s *Store) UnmeasuredHeld(ctx context.Context) (map[string][]string, error) {
	rows, err := s.pool().query(ctx, `SELECT agent_id, sandbox_id FROM agent_held WHERE NOT measured`)
	if err != nil {
		return nil, s.errorf("unmeasured held sandboxes: %w", err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var agent, id string
		if err := rows.Scan(&agent, &id); err != nil {
			return nil, s.errorf("unmeasured held sandboxes: %w", err)
		}
		out[agent] = append(out[agent], id)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("unmeasured held sandboxes: %w", err)
	}
	return out, nil
}

// HeldCounts implements berth.Store: one grouped read of agent_held's primary key.
func (s *Store) HeldCounts(ctx context.Context) (map[string]int, error) {
	rows, err := s.pool().query(ctx, `SELECT agent_id, COUNT(*) FROM agent_held GROUP BY agent_id`)
	if err != nil {
		return nil, s.errorf("held counts: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var agent string
		var n int
		if err := rows.Scan(&agent, &n); err != nil {
			return nil, s.errorf("held counts: %w", err)
		}
		out[agent] = n
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("held counts: %w", err)
	}
	return out, nil
}

// Agent returns agent id or an error wrapping berth.ErrNotFound.
func (s *Store) Agent(ctx context.Context, id string) (berth.Agent, error) {
	a, err := s.scanAgent(s.pool().queryRow(ctx, `SELECT `+agentColumns+` FROM agents WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return berth.Agent{}, fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
	}
	if err != nil {
		return a, err
	}
	one := []berth.Agent{a}
	err = s.fillHeld(ctx, one)
	return one[0], err
}

// SetAgentDrain marks (draining) or lifts an operator drain of agent id, with the event
// old status → new status (reason as given, actor as given), and notifies WatchAgents
// listeners on commit (PLC-5). A drain without a reason stores DefaultDrainReason. Draining a
// drained agent, or undraining one that is not, changes nothing, writes no event and notifies
// nobody. Undraining restores the status the agent last reported. An unknown id is an error
// wrapping berth.ErrNotFound.
func (s *Store) SetAgentDrain(ctx context.Context, id string, draining bool, reason, actor string, now time.Time) error {
	return s.inTx(ctx, func(tx *Tx) error { return s.setDrainTx(ctx, tx, id, draining, reason, actor, now) })
}

// setDrainTx is SetAgentDrain inside tx.
func (s *Store) setDrainTx(ctx context.Context, tx *Tx, id string, draining bool, reason, actor string, now time.Time) error {
	var status, reported, drain string
	err := tx.queryRow(ctx, `SELECT status, reported_status, drain_reason FROM agents WHERE id = ?`+s.d.ForUpdate, id).
		Scan(&status, &reported, &drain)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
	}
	if err != nil {
		return s.errorf("drain agent %q: %w", id, err)
	}
	if draining == (drain != "") {
		return nil
	}
	if !draining {
		// A revoked agent's drain stays: undrained, its host would take placements again
		// until it went stale (TRUST-1).
		var revoked int
		if err := tx.queryRow(ctx, adminRevokedSQL, id).Scan(&revoked); err != nil {
			return s.errorf("undrain agent %q: %w", id, err)
		}
		if revoked > 0 {
			return fmt.Errorf("undrain agent %q: %w", id, berth.ErrRevoked)
		}
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
	} else {
		if evReason == "" {
			evReason = "undrained"
		}
		if newStatus == string(berth.AgentDraining) {
			// The agent closed its own intake (a preemption notice, a shutdown) or has not
			// yet heard of the undrain: its next heartbeat moves the status.
			evReason += "; the agent still reports draining"
		}
	}
	if _, err := tx.exec(ctx, `UPDATE agents SET status = ?, drain_reason = ? WHERE id = ?`,
		newStatus, newDrain, id); err != nil {
		return s.errorf("drain agent %q: %w", id, err)
	}
	if err := s.insertEvent(ctx, tx, berth.Event{
		At: now, Entity: "agent/" + id, From: status, To: newStatus, Reason: evReason, Actor: actor,
	}); err != nil {
		return err
	}
	return s.d.NotifyAgent(ctx, tx, id)
}

// scanAgent reads one row selected with agentColumns.
func (s *Store) scanAgent(r scanner) (berth.Agent, error) {
	var a berth.Agent
	var status string
	var held, ended []byte
	var hbAt, qUntil sql.NullInt64
	var lastSeen int64
	err := r.Scan(&a.AgentID, &a.Address, &a.Region, &a.Pool, &a.Preemptible, &hbAt, &status, &a.CPUTotal,
		&a.CPUUsed, &a.MemoryMiBTotal, &a.MemoryMiBUsed, &a.MemoryMiBCommitted, &a.MemoryAdmission,
		&a.MemoryMiBAdmittable, &a.IntakeOpen, &a.MemoryPressure, &a.StartsInFlight,
		&held, &ended, &a.Version, &a.BootID, &a.MeasurementErrors, &lastSeen,
		&a.DrainReason, &a.CreateFailures, &qUntil, &a.Runtime, &a.Checkpoint, &a.Seq)
	if errors.Is(err, sql.ErrNoRows) {
		return a, err
	}
	if err != nil {
		return a, s.errorf("scan agent: %w", err)
	}
	a.Status = berth.AgentStatus(status)
	a.HeartbeatAt, a.LastSeen, a.QuarantinedUntil = fromNullMS(hbAt), fromMS(lastSeen), fromNullMS(qUntil)
	a.Sandboxes = []berth.HeldSandbox{}
	if err := json.Unmarshal(held, &a.Sandboxes); err != nil {
		return a, s.errorf("agent %q sandboxes: %w", a.AgentID, err)
	}
	if err := json.Unmarshal(ended, &a.Ended); err != nil {
		return a, s.errorf("agent %q ended: %w", a.AgentID, err)
	}
	if len(a.Ended) == 0 {
		a.Ended = nil
	}
	return a, nil
}

// listJSON encodes a list for a JSON column; nil becomes "[]".
func listJSON[T any](v []T) (string, error) {
	if len(v) == 0 {
		return "[]", nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode json: %w", err)
	}
	return string(b), nil
}

// RecordCreateOutcome implements berth.AgentStore (PLC-9): it counts consecutive failed
// creates under the agent's row lock, quarantines the agent when they reach q.After (with a
// notification to every replica), and resets on a success.
func (s *Store) RecordCreateOutcome(ctx context.Context, id string, failed bool, q berth.QuarantinePolicy, actor string, now time.Time) (berth.Agent, error) {
	err := s.inTx(ctx, func(tx *Tx) error {
		var failures int
		var until sql.NullInt64
		err := tx.queryRow(ctx, `SELECT create_failures, quarantined_until FROM agents WHERE id = ?`+s.d.ForUpdate, id).
			Scan(&failures, &until)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("agent %q: %w", id, berth.ErrNotFound)
		}
		if err != nil {
			return s.errorf("create outcome of %q: %w", id, err)
		}
		c := q.Apply(failures, fromNullMS(until), failed, now)
		if c.Failures == failures && c.Until.Equal(fromNullMS(until)) {
			return nil
		}
		if _, err := tx.exec(ctx, `UPDATE agents SET create_failures = ?, quarantined_until = ? WHERE id = ?`,
			c.Failures, nullMS(c.Until), id); err != nil {
			return s.errorf("create outcome of %q: %w", id, err)
		}
		if c.To == "" {
			return nil
		}
		if err := s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "agent/" + id, From: c.From, To: c.To, Reason: c.Reason, Actor: actor}); err != nil {
			return err
		}
		return s.d.NotifyAgent(ctx, tx, id)
	})
	if err != nil {
		return berth.Agent{}, err
	}
	return s.Agent(ctx, id)
}
