package sqlstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"database/sql"

	"github.com/berth-dev/berth"
)

// Reservation event states (LIF-3): a reservation is "held" from Reserve until it is
// "released" (by its owner or a terminal sandbox), "netted" (a heartbeat accounts for the
// sandbox, LED-4) or "expired" (swept after its TTL, LED-2).
const (
	resHeld     = berth.ReservationHeld
	resReleased = berth.ReservationReleased
	resNetted   = berth.ReservationNetted
	resExpired  = berth.ReservationExpired
)

// SweeperActor is the actor of the events SweepReservations writes.
const SweeperActor = "ledger-sweeper"

// Reserve implements LED-1 and ADM-7 across replicas: it inserts r only if agent r.AgentID
// exists and memory_mb_admittable − Σ MiB of its reservations unexpired at now ≥ r.MiB. A
// zero-MiB reservation always fits a known agent. r.ExpiresAt must be set (LED-2); a zero
// r.CreatedAt becomes now; an r.ID already in the ledger is an error. It reports whether r was
// taken and, if so, writes the event "" → held.
//
// Atomicity: one READ COMMITTED transaction first locks the agent row (SELECT … FOR UPDATE),
// then sums the agent's unexpired reservations and inserts r. Every Reserve against an agent,
// on any connection of any replica, takes that lock first, so they run one at a time per
// agent, and each sum is a fresh statement snapshot that sees every reservation committed
// before the lock was granted: two replicas can never both take the last room. A single
// INSERT … SELECT would not do: under READ COMMITTED two such statements read the same
// snapshot and both insert. The row lock was chosen over SERIALIZABLE because it never aborts
// (no retries on the hot path) and only serialises reserves of the same agent; reserves on
// different agents run in parallel. Heartbeats update the same row and so queue behind it
// (and it behind them), which also makes a new admittable figure and the sum consistent.
// Releases, netting and sweeps only lower the sum and take no agent lock: racing one can only
// make a check conservative for one transaction. In SQLite the lock is the write
// transaction's own (IMMEDIATE: one writer at a time) and Dialect.ForUpdate is empty.
func (s *Store) Reserve(ctx context.Context, r berth.Reservation, now time.Time) (bool, error) {
	if err := s.checkReservation(r); err != nil {
		return false, err
	}
	var took bool
	err := s.inTx(ctx, func(tx *Tx) error {
		ev, ok, err := s.reserveTx(ctx, tx, r, now)
		if took = ok; err != nil || !ok {
			return err
		}
		return s.insertEvents(ctx, tx, ev)
	})
	if err != nil {
		return false, err
	}
	return took, nil
}

// ReserveAndCreate implements berth.Ledger: Reserve's check and insert, then CreateSandbox's,
// in one transaction whose statements go to the database in one batch (issue 16, goal 1: on
// PostgreSQL BEGIN, one pipelined round trip, COMMIT; plus one for a tenant with a quota).
// The batch is optimistic: every statement is sent, then the answers are checked, and the
// transaction is rolled back when the room, the quota or the Idempotency-Key says no — so
// nothing is written when r does not fit (false) or the sandbox cannot be created
// (CreateSandbox's errors). The agent row is locked by the batch's first statement and the
// sum taken by the next, so LED-1 holds as in Reserve. A key another sandbox holds is
// answered by the one-statement-at-a-time path, which names the holder.
func (s *Store) ReserveAndCreate(ctx context.Context, r berth.Reservation, sb berth.Sandbox, actor string, now time.Time) (bool, error) {
	if err := s.checkReservation(r); err != nil {
		return false, err
	}
	sb, meta, key, reason, err := s.prepareSandbox(sb, now)
	if err != nil {
		return false, err
	}
	created := cmp.Or(r.CreatedAt, now)
	if took, done, err := s.reserveAndCreateOneTrip(ctx, r, sb, meta, key, reason, actor, created, now); done {
		return took, err
	}
	var took bool
	err = s.inTx(ctx, func(tx *Tx) error {
		took = false
		b := &batch{}
		b.queue(lockAgentSQL+s.d.ForUpdate, r.AgentID)
		b.queue(pendingSQL, r.AgentID, ms(now))
		b.queue(insertReservationSQL, reservationArgs(r, created)...)
		locks := s.queueLockName(b, quotaLock+sb.Tenant, shared)
		b.queue(quotaSQL+s.d.ForUpdate, sb.Tenant)
		b.queue(insertSandboxSQL, sandboxArgs(sb, meta, key)...)
		s.queueEvents(tx, b, reservationEvent(r, now), sandboxEvent(sb, reason, actor, now))
		res := tx.send(ctx, b)
		fits, q, inserted, err := s.reserveAndCreateAnswers(res, r, sb, locks)
		if cerr := res.Close(); err == nil && cerr != nil {
			err = s.errorf("reserve %q: %w", r.ID, cerr)
		}
		switch {
		case err != nil:
			return err
		case !fits:
			return errNoRoom
		case !inserted:
			return errKeyHeld
		}
		if !sb.State.Terminal() && (q.MaxSandboxes > 0 || q.MaxMemoryMiB > 0) {
			n, mem, err := s.usageOf(ctx, tx.conn, sb.Tenant) // counts the row just inserted
			if err != nil {
				return err
			}
			if err := q.Check(n-1, mem-sb.MemoryMiB, sb.MemoryMiB); err != nil {
				return err
			}
		}
		took = true
		return nil
	})
	switch {
	case errors.Is(err, errNoRoom):
		return false, nil
	case errors.Is(err, errKeyHeld):
		return s.reserveAndCreateOneByOne(ctx, r, sb, meta, key, reason, actor, now)
	case err != nil:
		return false, err
	}
	return took, nil
}

// reserveAndCreateOneTrip is ReserveAndCreate in one round trip, where the database decides
// in SQL (Dialect.WriteCTE) and its pool is a Batcher (PostgreSQL): the agent's row, the
// tenant's quota lock (shared) and its quota row are locked by the first
// statements, then one statement (reserveAndCreateSQL) inserts the sandbox, its reservation
// and both events only when the room is there, all in the pipeline's one implicit
// transaction. The last statement takes its snapshot after the locks are held, so it sums every reservation committed before
// it (LED-1), as the transaction path's separate SUM does; and no row lock waits on a round
// trip to this process (issue 16, goal 1). done is false, with nothing written, when the
// answer needs the transaction path: the tenant has a quota to count against (ADM-11), or the
// database chose this pipeline as a deadlock victim. A key another sandbox holds goes to the
// path that names the holder.
func (s *Store) reserveAndCreateOneTrip(ctx context.Context, r berth.Reservation, sb berth.Sandbox, meta, key any, reason, actor string, created, now time.Time) (took, done bool, err error) {
	if !s.d.WriteCTE {
		return false, false, nil
	}
	if _, ok := s.db.(Batcher); !ok {
		return false, false, nil
	}
	rev, sev := reservationEvent(r, now), sandboxEvent(sb, reason, actor, now)
	args := []any{sb.Tenant, r.AgentID, r.MiB, r.AgentID, ms(now), r.MiB}
	args = append(args, sandboxArgs(sb, meta, key)...)
	args = append(args, reservationArgs(r, created)...)
	for _, e := range []berth.Event{rev, sev} {
		args = append(args, ms(e.At), e.Entity, e.From, e.To, e.Reason, e.Actor)
	}
	b := &batch{}
	b.queue(lockAgentSQL+s.d.ForUpdate, r.AgentID)
	locks := s.queueLockName(b, quotaLock+sb.Tenant, shared)
	b.queue(quotaSQL+s.d.ForUpdate, sb.Tenant)
	b.queue(reserveAndCreateSQL, args...)
	res := s.pool().send(ctx, b)
	var room, inserted int64
	var quota bool
	for range 2 + locks { // the agent's lock, the quota lock, the quota row's lock
		if err == nil {
			_, err = res.Exec()
		}
	}
	if err == nil {
		err = res.QueryRow().Scan(&room, &inserted, &quota)
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil && s.d.Retryable != nil && s.d.Retryable(err):
		return false, false, nil
	case err != nil:
		return false, true, s.errorf("reserve %q: %w", r.ID, err)
	case quota:
		return false, false, nil
	case room == 0:
		return false, true, nil
	case inserted == 0:
		took, err := s.reserveAndCreateOneByOne(ctx, r, sb, meta, key, reason, actor, now)
		return took, true, err
	}
	s.events.Committed(rev, sev)
	return true, true, nil
}

// reserveAndCreateSQL inserts a sandbox (sandboxArgs), its reservation (reservationArgs) and
// their two events only when the tenant has no quota to count against and the agent is known
// and has the room — its admittable MiB less its unexpired reservations' MiB at least the
// reservation's, or a reservation of 0 MiB. Its one row: whether the room was there (0 or
// 1), whether the sandbox went in (0 when another holds its Idempotency-Key) and whether a
// quota stopped it. The arguments, in order: tenant; agent id, MiB, agent id, now (unix ms),
// MiB; the sandbox's; the reservation's; the two events' (at, entity, from, to, reason, actor
// each).
const reserveAndCreateSQL = `WITH quota AS (
	SELECT EXISTS (SELECT 1 FROM quotas WHERE tenant = ? AND (max_sandboxes > 0 OR max_memory_mb > 0)) AS limited
), room AS (
	SELECT 1 FROM agents, quota WHERE NOT quota.limited AND id = ? AND (CAST(? AS BIGINT) = 0 OR memory_mb_admittable -
		(SELECT COALESCE(SUM(mib), 0) FROM reservations WHERE agent_id = ? AND expires_at > ?) >= CAST(? AS BIGINT))
), sb AS (
	INSERT INTO sandboxes (` + sandboxColumns + `)
	SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM room
	ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
	RETURNING id
), res AS (
	INSERT INTO reservations (id, agent_id, sandbox_id, mib, owner, created_at, expires_at)
	SELECT ?, ?, ?, ?, ?, ?, ? FROM sb
	RETURNING id
), ev AS (
	INSERT INTO events (at, entity, from_state, to_state, reason, actor)
	SELECT * FROM (VALUES
		(CAST(? AS BIGINT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT)),
		(?, ?, ?, ?, ?, ?)) AS e
	WHERE EXISTS (SELECT 1 FROM res)
)
SELECT (SELECT COUNT(*) FROM room), (SELECT COUNT(*) FROM sb), (SELECT limited FROM quota)`

// Sentinels of ReserveAndCreate's batch: each rolls the transaction back.
var (
	errNoRoom  = errors.New("the agent has no room for the reservation")
	errKeyHeld = errors.New("another sandbox holds the Idempotency-Key")
)

// reserveAndCreateAnswers reads ReserveAndCreate's batch in order: whether the reservation
// fits (a known agent with the room), the quota lock's locks statements, the tenant's quota,
// and whether the row went in.
func (s *Store) reserveAndCreateAnswers(res BatchResults, r berth.Reservation, sb berth.Sandbox, locks int) (fits bool, q berth.Quota, inserted bool, err error) {
	var admittable, pending int64
	known := true
	if err := res.QueryRow().Scan(&admittable); errors.Is(err, sql.ErrNoRows) {
		known = false
	} else if err != nil {
		return false, q, false, s.errorf("reserve %q: %w", r.ID, err)
	}
	if err := res.QueryRow().Scan(&pending); err != nil {
		return false, q, false, s.errorf("reserve %q: %w", r.ID, err)
	}
	for range 1 + locks { // the reservation's insert, then the quota lock
		if _, err := res.Exec(); err != nil {
			return false, q, false, s.errorf("reserve %q: %w", r.ID, err)
		}
	}
	q.Tenant = sb.Tenant
	if err := res.QueryRow().Scan(&q.MaxSandboxes, &q.MaxMemoryMiB); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, q, false, s.errorf("quota of %q: %w", sb.Tenant, err)
	}
	err = res.QueryRow().Scan(&inserted)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, q, false, s.errorf("create sandbox %q: %w", sb.ID, err)
	}
	if _, err := res.Exec(); err != nil {
		return false, q, false, s.errorf("events: %w", err)
	}
	return known && (r.MiB == 0 || admittable-pending >= r.MiB), q, inserted, nil
}

// reserveAndCreateOneByOne is ReserveAndCreate a statement at a time (reserveTx, then
// createSandboxTx): the path that names the holder of a taken Idempotency-Key.
func (s *Store) reserveAndCreateOneByOne(ctx context.Context, r berth.Reservation, sb berth.Sandbox, meta, key any, reason, actor string, now time.Time) (bool, error) {
	var took bool
	err := s.inTx(ctx, func(tx *Tx) error {
		rev, ok, err := s.reserveTx(ctx, tx, r, now)
		if took = ok; err != nil || !ok {
			return err
		}
		sev, err := s.createSandboxTx(ctx, tx, sb, meta, key, reason, actor, now)
		if err != nil {
			return err
		}
		return s.insertEvents(ctx, tx, rev, sev)
	})
	if err != nil {
		return false, err
	}
	return took, nil
}

// The statements of a reservation, one text for Reserve's and ReserveAndCreate's paths: the
// agent's row (locked with Dialect.ForUpdate appended, LED-1), the sum of its unexpired
// reservations, and the insert (reservationArgs).
const (
	lockAgentSQL         = `SELECT memory_mb_admittable FROM agents WHERE id = ?`
	pendingSQL           = `SELECT CAST(COALESCE(SUM(mib), 0) AS BIGINT) FROM reservations WHERE agent_id = ? AND expires_at > ?`
	insertReservationSQL = `INSERT INTO reservations (id, agent_id, sandbox_id, mib, owner, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)`
)

func reservationArgs(r berth.Reservation, created time.Time) []any {
	return []any{r.ID, r.AgentID, r.SandboxID, r.MiB, r.Owner, ms(created), ms(r.ExpiresAt)}
}

// reservationEvent is a reservation's event "" → held (LIF-3).
func reservationEvent(r berth.Reservation, now time.Time) berth.Event {
	return berth.Event{At: now, Entity: "reservation/" + r.ID, From: "", To: resHeld,
		Reason: fmt.Sprintf("reserved for sandbox/%s by %s", r.SandboxID, r.Owner), Actor: r.Owner}
}

// checkReservation refuses a reservation Reserve cannot take as written.
func (s *Store) checkReservation(r berth.Reservation) error {
	switch {
	case r.ID == "" || r.AgentID == "":
		return s.errorf("reserve: reservation needs an id and an agent (got %q, %q)", r.ID, r.AgentID)
	case r.MiB < 0:
		return s.errorf("reserve %q: negative MiB %d", r.ID, r.MiB)
	case r.ExpiresAt.IsZero():
		return s.errorf("reserve %q: no expiry (LED-2)", r.ID)
	}
	return nil
}

// reserveTx is Reserve's check and insert inside tx (see Reserve for the locking); it
// returns the event "" → held to write when it took r.
func (s *Store) reserveTx(ctx context.Context, tx *Tx, r berth.Reservation, now time.Time) (berth.Event, bool, error) {
	created := r.CreatedAt
	if created.IsZero() {
		created = now
	}
	var admittable int64
	err := tx.queryRow(ctx, lockAgentSQL+s.d.ForUpdate, r.AgentID).Scan(&admittable)
	if errors.Is(err, sql.ErrNoRows) {
		return berth.Event{}, false, nil
	}
	if err != nil {
		return berth.Event{}, false, s.errorf("reserve %q: %w", r.ID, err)
	}
	if r.MiB > 0 {
		var pending int64
		if err := tx.queryRow(ctx, pendingSQL, r.AgentID, ms(now)).Scan(&pending); err != nil {
			return berth.Event{}, false, s.errorf("reserve %q: %w", r.ID, err)
		}
		if admittable-pending < r.MiB {
			return berth.Event{}, false, nil
		}
	}
	if _, err := tx.exec(ctx, insertReservationSQL, reservationArgs(r, created)...); err != nil {
		return berth.Event{}, false, s.errorf("reserve %q: %w", r.ID, err)
	}
	return reservationEvent(r, now), true, nil
}

// Release deletes reservation id with the event held → released (actor: its owner). It is
// idempotent and reports whether a row went. Release takes no clock, so the event is stamped
// with the wall clock.
func (s *Store) Release(ctx context.Context, id string) (bool, error) {
	var gone bool
	err := s.inTx(ctx, func(tx *Tx) error {
		gone = false
		var owner string
		err := tx.queryRow(ctx, `DELETE FROM reservations WHERE id = ? RETURNING owner`, id).Scan(&owner)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return s.errorf("release %q: %w", id, err)
		}
		gone = true
		return s.insertEvent(ctx, tx, berth.Event{
			At: time.Now(), Entity: "reservation/" + id, From: resHeld, To: resReleased,
			Reason: "released by owner", Actor: owner,
		})
	})
	return gone, err
}

// Renew implements the C31 half of LED-2: it moves reservation id's expires_at to expiresAt
// if the reservation is still held and unexpired at now, never earlier than it was (no
// event: a renewal is no state change). It reports whether the reservation is still held.
//
// It takes the agent's row lock first, as Reserve does: a renewal racing a Reserve on the
// same agent runs before or after it, never between its sum and its insert, so a reservation
// that Reserve saw expired cannot come back to count next to the one Reserve then took.
func (s *Store) Renew(ctx context.Context, id string, expiresAt, now time.Time) (bool, error) {
	var held bool
	err := s.inTx(ctx, func(tx *Tx) error {
		held = false
		var agent string
		err := tx.queryRow(ctx, `SELECT agent_id FROM reservations WHERE id = ?`, id).Scan(&agent)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return s.errorf("renew %q: %w", id, err)
		}
		if _, err := tx.exec(ctx, `SELECT 1 FROM agents WHERE id = ?`+s.d.ForUpdate, agent); err != nil {
			return s.errorf("renew %q: %w", id, err)
		}
		tag, err := tx.exec(ctx,
			`UPDATE reservations SET expires_at = `+s.d.Greatest+`(expires_at, ?) WHERE id = ? AND expires_at > ?`,
			ms(expiresAt), id, ms(now))
		if err != nil {
			return s.errorf("renew %q: %w", id, err)
		}
		n, err := tag.RowsAffected()
		held = n == 1
		return err
	})
	return held, err
}

// Pending returns Σ MiB of reservations unexpired at now, per agent id; agents without any
// are absent.
func (s *Store) Pending(ctx context.Context, now time.Time) (map[string]int64, error) {
	rows, err := s.pool().query(ctx,
		`SELECT agent_id, CAST(SUM(mib) AS BIGINT) FROM reservations WHERE expires_at > ? GROUP BY agent_id`, ms(now))
	if err != nil {
		return nil, s.errorf("pending: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var agent string
		var mib int64
		if err := rows.Scan(&agent, &mib); err != nil {
			return nil, s.errorf("pending: %w", err)
		}
		out[agent] = mib
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("pending: %w", err)
	}
	return out, nil
}

// Reservations lists every reservation, expired or not, oldest first.
func (s *Store) Reservations(ctx context.Context) ([]berth.Reservation, error) {
	rows, err := s.pool().query(ctx, `
		SELECT id, agent_id, sandbox_id, mib, owner, created_at, expires_at
		FROM reservations ORDER BY created_at, id`)
	if err != nil {
		return nil, s.errorf("reservations: %w", err)
	}
	defer rows.Close()
	out := []berth.Reservation{}
	for rows.Next() {
		var r berth.Reservation
		var created, expires int64
		if err := rows.Scan(&r.ID, &r.AgentID, &r.SandboxID, &r.MiB, &r.Owner, &created, &expires); err != nil {
			return nil, s.errorf("reservations: %w", err)
		}
		r.CreatedAt, r.ExpiresAt = fromMS(created), fromMS(expires)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("reservations: %w", err)
	}
	return out, nil
}

// SweepReservations implements LED-2: it deletes every reservation with expires_at ≤ now,
// each with the event held → expired (actor SweeperActor), and returns how many went. Replicas
// may sweep at once: a row goes, with its event, in exactly one of them.
func (s *Store) SweepReservations(ctx context.Context, now time.Time) (int, error) {
	var swept int
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		swept, err = s.dropReservations(ctx, tx, `DELETE FROM reservations WHERE expires_at <= ? RETURNING id`,
			[]any{ms(now)}, func(id string) berth.Event {
				return berth.Event{At: now, Entity: "reservation/" + id, From: resHeld, To: resExpired, Reason: "ttl elapsed", Actor: SweeperActor}
			})
		return err
	})
	if err != nil {
		return 0, err
	}
	return swept, nil
}

// releaseSandboxReservations deletes every reservation of sandbox sid, each with the event
// held → released and the reason "sandbox <state>"; a terminal transition calls it.
func (s *Store) releaseSandboxReservations(ctx context.Context, tx *Tx, sid string, state berth.SandboxState, actor string, now time.Time) error {
	_, err := s.dropReservations(ctx, tx, `DELETE FROM reservations WHERE sandbox_id = ? RETURNING id`, []any{sid},
		func(id string) berth.Event {
			return berth.Event{At: now, Entity: "reservation/" + id, From: resHeld, To: resReleased, Reason: "sandbox " + string(state), Actor: actor}
		})
	return err
}

// dropReservations runs del, a DELETE … RETURNING id, and writes event(id) for every row that
// went, in id order. It returns how many went.
func (s *Store) dropReservations(ctx context.Context, tx *Tx, del string, args []any, event func(id string) berth.Event) (int, error) {
	ids, err := s.queryIDs(ctx, tx, del, args...)
	if err != nil {
		return 0, s.errorf("delete reservations: %w", err)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := s.insertEvent(ctx, tx, event(id)); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

// queryIDs runs a query whose rows are one string each and collects them (so the caller may
// write while holding the result).
func (s *Store) queryIDs(ctx context.Context, tx *Tx, query string, args ...any) ([]string, error) {
	rows, err := tx.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}
