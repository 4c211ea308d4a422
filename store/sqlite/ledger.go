package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth"
)

// Reservation event states (LIF-3): a reservation is "held" from Reserve until it is
// "released" (by its owner or a terminal sandbox), "netted" (a heartbeat accounts for the
// sandbox, LED-4) or "expired" (swept after its TTL, LED-2).
const (
	resHeld     = "held"
	resReleased = "released"
	resNetted   = "netted"
	resExpired  = "expired"
)

// SweeperActor is the actor of the events SweepReservations writes.
const SweeperActor = "ledger-sweeper"

// Reserve implements LED-1 and ADM-7: it inserts r only if agent r.AgentID exists and
// memory_mb_admittable − Σ MiB of its reservations unexpired at now ≥ r.MiB, in one
// INSERT … SELECT so no other writer can slip between the check and the insert. A zero-MiB
// reservation always fits a known agent. r.ExpiresAt must be set (LED-2); a zero r.CreatedAt
// becomes now; an r.ID already in the ledger is an error. It reports whether r was taken and, if so, writes the event "" → held.
func (s *Store) Reserve(ctx context.Context, r berth.Reservation, now time.Time) (bool, error) {
	switch {
	case r.ID == "" || r.AgentID == "":
		return false, fmt.Errorf("sqlite: reserve: reservation needs an id and an agent (got %q, %q)", r.ID, r.AgentID)
	case r.MiB < 0:
		return false, fmt.Errorf("sqlite: reserve %q: negative MiB %d", r.ID, r.MiB)
	case r.ExpiresAt.IsZero():
		return false, fmt.Errorf("sqlite: reserve %q: no expiry (LED-2)", r.ID)
	}
	created := r.CreatedAt
	if created.IsZero() {
		created = now
	}
	var took bool
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `
			INSERT INTO reservations (id, agent_id, sandbox_id, mib, owner, created_at, expires_at)
			SELECT ?, a.id, ?, ?, ?, ?, ?
			FROM agents a
			WHERE a.id = ?
			  AND (? = 0 OR a.memory_mb_admittable - COALESCE(
			        (SELECT SUM(p.mib) FROM reservations p WHERE p.agent_id = a.id AND p.expires_at > ?), 0) >= ?)`,
			r.ID, r.SandboxID, r.MiB, r.Owner, ms(created), ms(r.ExpiresAt),
			r.AgentID, r.MiB, ms(now), r.MiB)
		if err != nil {
			return fmt.Errorf("sqlite: reserve %q: %w", r.ID, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("sqlite: reserve %q: %w", r.ID, err)
		}
		if n == 0 {
			return nil
		}
		took = true
		return insertEvent(ctx, tx, berth.Event{
			At: now, Entity: "reservation/" + r.ID, From: "", To: resHeld,
			Reason: fmt.Sprintf("reserved for sandbox/%s by %s", r.SandboxID, r.Owner),
			Actor:  r.Owner,
		})
	})
	return took, err
}

// Release deletes reservation id with the event held → released (actor: its owner). It is
// idempotent and reports whether a row went. Release takes no clock, so the event is stamped
// with the wall clock.
func (s *Store) Release(ctx context.Context, id string) (bool, error) {
	var gone bool
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var owner string
		err := tx.QueryRowContext(ctx, `SELECT owner FROM reservations WHERE id = ?`, id).Scan(&owner)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("sqlite: release %q: %w", id, err)
		}
		gone, err = dropReservation(ctx, tx, id, resReleased, "released by owner", owner, time.Now())
		return err
	})
	return gone, err
}

// Renew implements the C31 half of LED-2: it moves reservation id's expires_at to expiresAt
// if the reservation is still held and unexpired at now, never earlier than it was, in one
// UPDATE (no event: a renewal is no state change). It reports whether the reservation is
// still held.
func (s *Store) Renew(ctx context.Context, id string, expiresAt, now time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx,
		`UPDATE reservations SET expires_at = MAX(expires_at, ?) WHERE id = ? AND expires_at > ?`,
		ms(expiresAt), id, ms(now))
	if err != nil {
		return false, fmt.Errorf("sqlite: renew %q: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sqlite: renew %q: %w", id, err)
	}
	return n == 1, nil
}

// Pending returns Σ MiB of reservations unexpired at now, per agent id; agents without any
// are absent.
func (s *Store) Pending(ctx context.Context, now time.Time) (map[string]int64, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT agent_id, SUM(mib) FROM reservations WHERE expires_at > ? GROUP BY agent_id`, ms(now))
	if err != nil {
		return nil, fmt.Errorf("sqlite: pending: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var agent string
		var mib int64
		if err := rows.Scan(&agent, &mib); err != nil {
			return nil, fmt.Errorf("sqlite: pending: %w", err)
		}
		out[agent] = mib
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: pending: %w", err)
	}
	return out, nil
}

// Reservations lists every reservation, expired or not, oldest first.
func (s *Store) Reservations(ctx context.Context) ([]berth.Reservation, error) {
	rows, err := s.db.QueryContext(ctx, `
		SELECT id, agent_id, sandbox_id, mib, owner, created_at, expires_at
		FROM reservations ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: reservations: %w", err)
	}
	defer rows.Close()
	out := []berth.Reservation{}
	for rows.Next() {
		var r berth.Reservation
		var created, expires int64
		if err := rows.Scan(&r.ID, &r.AgentID, &r.SandboxID, &r.MiB, &r.Owner, &created, &expires); err != nil {
			return nil, fmt.Errorf("sqlite: reservations: %w", err)
		}
		r.CreatedAt, r.ExpiresAt = fromMS(created), fromMS(expires)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: reservations: %w", err)
	}
	return out, nil
}

// SweepReservations implements LED-2: it deletes every reservation with expires_at ≤ now,
// each with the event held → expired (actor SweeperActor), and returns how many went.
func (s *Store) SweepReservations(ctx context.Context, now time.Time) (int, error) {
	var swept int
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		ids, err := queryIDs(ctx, tx, `SELECT id FROM reservations WHERE expires_at <= ? ORDER BY id`, ms(now))
		if err != nil {
			return fmt.Errorf("sqlite: sweep: %w", err)
		}
		for _, id := range ids {
			gone, err := dropReservation(ctx, tx, id, resExpired, "ttl elapsed", SweeperActor, now)
			if err != nil {
				return err
			}
			if gone {
				swept++
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return swept, nil
}

// releaseSandboxReservations deletes every reservation of sandbox sid, each with the event
// held → released and the reason "sandbox <state>"; a terminal transition calls it.
func releaseSandboxReservations(ctx context.Context, tx *sql.Tx, sid string, state berth.SandboxState, actor string, now time.Time) error {
	ids, err := queryIDs(ctx, tx, `SELECT id FROM reservations WHERE sandbox_id = ? ORDER BY id`, sid)
	if err != nil {
		return fmt.Errorf("sqlite: reservations of sandbox %q: %w", sid, err)
	}
	for _, id := range ids {
		if _, err := dropReservation(ctx, tx, id, resReleased, "sandbox "+string(state), actor, now); err != nil {
			return err
		}
	}
	return nil
}

// dropReservation deletes reservation id and, if a row went, writes the event held → to.
func dropReservation(ctx context.Context, tx *sql.Tx, id, to, reason, actor string, now time.Time) (bool, error) {
	res, err := tx.ExecContext(ctx, `DELETE FROM reservations WHERE id = ?`, id)
	if err != nil {
		return false, fmt.Errorf("sqlite: delete reservation %q: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sqlite: delete reservation %q: %w", id, err)
	}
	if n == 0 {
		return false, nil
	}
	return true, insertEvent(ctx, tx, berth.Event{
		At: now, Entity: "reservation/" + id, From: resHeld, To: to, Reason: reason, Actor: actor,
	})
}

// queryIDs runs a query whose rows are one string each and collects them (so the caller may
// write while holding the result).
func queryIDs(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
