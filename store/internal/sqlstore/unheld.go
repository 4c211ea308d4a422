package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth"
)

// unheldLimit is UnheldRunning's limit when the caller gives none; unheldScan bounds the
// candidates one call judges (those its agent does not list, graced or not), so a fleet-wide
// fault is read a slice at a time.
const (
	unheldLimit = 100
	unheldScan  = 1000
)

// unheldCandidatesSQL reads the running sandboxes that the current held list of their live
// agent does not list, graced or not (UnheldRunning); its arguments are the state running,
// seenSince (unix ms) and the scan bound. Oldest first: the young creates a heartbeat has not
// listed yet (within the grace) must not crowd a ghost out of the bound. It is driven by the agents table (one row per host)
// and, per agent alive with a current list, by the sandboxes' (agent_id, state) index for its
// running rows, each probed in agent_held by its primary key: when nothing is wrong that is
// the whole cost, and it answers nothing (or the few creates younger than their agent's last
// heartbeat).
const unheldCandidatesSQL = `
	SELECT s.id, s.agent_id, a.last_seen
	FROM agents a JOIN sandboxes s ON s.agent_id = a.id AND s.state = ?
	WHERE a.last_seen >= ? AND a.held_seq > 0 AND a.held_boot = a.boot_id AND a.held_seq = a.heartbeat_seq
		AND NOT EXISTS (SELECT 1 FROM agent_held h WHERE h.agent_id = s.agent_id AND h.sandbox_id = s.id)
	ORDER BY s.created_at, s.id LIMIT ?`

// enteredRunningSQL reads when each of some sandboxes last entered running: the latest event
// "→ running" per entity, by the events' entity index. The caller appends the entity
// condition; the first argument is the state running.
const enteredRunningSQL = `SELECT entity, MAX(at) FROM events WHERE to_state = ? AND `

// UnheldRunning implements berth.SandboxStore (AGT-6, the same boot): the running sandboxes
// whose agent — last seen at or after seenSince, its held list current (held_boot = boot_id,
// held_seq = heartbeat_seq > 0: written by the heartbeat the row records) — does not list
// them, in a list received at least grace after they last entered running. Up to limit (≤ 0:
// unheldLimit) rows, ordered by id, out of at most unheldScan candidates; a negative grace is
// an error. Two reads: the candidates (unheldCandidatesSQL), then, for those only, when each
// last entered running (enteredRunningSQL) — one statement let PostgreSQL look up the events
// of every running sandbox before the anti-join had dropped the held ones.
//
// Every applied heartbeat writes agent_held, heartbeat_seq, held_boot, held_seq and last_seen
// in one transaction, so last_seen is when the held list was received. A refused heartbeat
// (a delta on another base, an overtaken one) changes none of them: the list stays as old as
// last_seen says. A replica of the previous release moves heartbeat_seq and last_seen but not
// held_seq, so its writes make the list not current rather than falsely recent; an
// unnumbered agent (Seq 0) cannot be told apart from that, and is never judged.
func (s *Store) UnheldRunning(ctx context.Context, seenSince time.Time, grace time.Duration, limit int) ([]berth.UnheldSandbox, error) {
	if grace < 0 {
		return nil, s.errorf("unheld running sandboxes: negative grace %s", grace)
	}
	running := string(berth.SandboxRunning)
	rows, err := s.pool().query(ctx, unheldCandidatesSQL, running, ms(seenSince), unheldScan)
	if err != nil {
		return nil, s.errorf("unheld running sandboxes: %w", err)
	}
	var cands []berth.UnheldSandbox
	for rows.Next() {
		var u berth.UnheldSandbox
		var seen int64
		if err := rows.Scan(&u.ID, &u.AgentID, &seen); err != nil {
			rows.Close()
			return nil, s.errorf("unheld running sandboxes: %w", err)
		}
		u.HeldAt = fromMS(seen)
		cands = append(cands, u)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, s.errorf("unheld running sandboxes: %w", err)
	}
	out := []berth.UnheldSandbox{}
	if len(cands) == 0 {
		return out, nil
	}
	since, err := s.enteredRunning(ctx, cands)
	if err != nil {
		return nil, err
	}
	limit = limitOr(limit, unheldLimit)
	slices.SortFunc(cands, func(a, b berth.UnheldSandbox) int { return strings.Compare(a.ID, b.ID) })
	for _, u := range cands { // in id order
		at, ok := since["sandbox/"+u.ID]
		if !ok || u.HeldAt.Sub(at) < grace {
			continue // within the grace (or never entered running: nothing to judge by)
		}
		u.RunningSince = at
		if out = append(out, u); len(out) == limit {
			break
		}
	}
	return out, nil
}

// enteredRunning returns when each of cands last entered running, by entity
// ("sandbox/<id>"); a sandbox without such an event is absent.
func (s *Store) enteredRunning(ctx context.Context, cands []berth.UnheldSandbox) (map[string]time.Time, error) {
	entities := make([]string, len(cands))
	for i, u := range cands {
		entities[i] = "sandbox/" + u.ID
	}
	since := make(map[string]time.Time, len(cands))
	err := s.queryIn(ctx, "unheld running sandboxes", enteredRunningSQL, []any{string(berth.SandboxRunning)}, "entity", entities,
		` GROUP BY entity`, func(rows Rows) error {
			var entity string
			var at int64
			if err := rows.Scan(&entity, &at); err != nil {
				return err
			}
			since[entity] = fromMS(at)
			return nil
		})
	if err != nil {
		return nil, err
	}
	return since, nil
}

// claimSweepSQL records a claim of a fleet-wide sweep (ClaimSweep) and answers a row only
// when it did: the first claim of a name inserts it; a later one overwrites a claim at or
// before its period's start, or one from a clock since set back (more than the period ahead).
// Its arguments are the name, now, the period's start and its end (unix ms).
const claimSweepSQL = `INSERT INTO sweep_claims (name, claimed_at) VALUES (?, ?)
	ON CONFLICT (name) DO UPDATE SET claimed_at = excluded.claimed_at
	WHERE sweep_claims.claimed_at <= ? OR sweep_claims.claimed_at > ?
	RETURNING name`

// ClaimSweep implements berth.Store.
func (s *Store) ClaimSweep(ctx context.Context, name string, now time.Time, every time.Duration) (bool, error) {
	if every < 0 || name == "" {
		return false, s.errorf("claim sweep %q: empty name or negative period %s", name, every)
	}
	// In the store's unit, whole milliseconds: a period under one (not 0) is one, else two
	// claims in the same millisecond could both find the other's at or before its start.
	period := every.Milliseconds()
	if every%time.Millisecond != 0 {
		period++
	}
	at := ms(now)
	var got string
	err := s.pool().queryRow(ctx, claimSweepSQL, name, at, at-period, at+period).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, s.errorf("claim sweep %q: %w", name, err)
	}
	return true, nil
}
