package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"database/sql"

	"github.com/berth-dev/berth"
)

// sandboxColumns is the column list every sandbox query selects, in scanSandbox's order.
const sandboxColumns = `id, template, tenant, agent_id, state, memory_mb, vcpus, stateful,
	created_at, expires_at, metadata, reason, idempotency_key, volume, paused_at, image, request_hash`

// CreateSandbox inserts sb with the event pending → sb.State (reason "placed on agent/<id>"
// when sb.AgentID is set, else "created"). An empty sb.State means pending and a zero
// sb.CreatedAt means now. If sb.IdempotencyKey is set and a sandbox of sb.Tenant already holds
// it, nothing is written and the error wraps berth.ErrIdempotencyConflict (API-4). The unique
// index on (tenant, idempotency_key) decides the race between replicas: the insert waits for a
// concurrent holder's transaction and, if that commits, inserts nothing. Volume, PausedAt
// (zero = NULL) and Image are stored as given (PAUSE-1).
func (s *Store) CreateSandbox(ctx context.Context, sb berth.Sandbox, actor string, now time.Time) error {
	sb, meta, key, reason, err := s.prepareSandbox(sb, now)
	if err != nil {
		return err
	}
	return s.inTx(ctx, func(tx *Tx) error {
		ev, err := s.createSandboxTx(ctx, tx, sb, meta, key, reason, actor, now)
		if err != nil {
			return err
		}
		return s.insertEvents(ctx, tx, ev)
	})
}

// prepareSandbox checks sb and fills CreateSandbox's defaults; it returns the metadata's JSON
// (nil for none), the key column (nil when there is no key or sb is born failed) and the
// event's reason.
func (s *Store) prepareSandbox(sb berth.Sandbox, now time.Time) (berth.Sandbox, any, any, string, error) {
	if sb.ID == "" {
		return sb, nil, nil, "", s.errorf("create sandbox: empty id")
	}
	if sb.State == "" {
		sb.State = berth.SandboxPending
	}
	if !sb.State.Valid() {
		return sb, nil, nil, "", s.errorf("create sandbox %q: unknown state %q", sb.ID, sb.State)
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = now
	}
	var meta any // NULL for an empty map
	if len(sb.Metadata) > 0 {
		text, err := s.jsonText(sb.Metadata)
		if err != nil {
			return sb, nil, nil, "", err
		}
		meta = text
	}
	var key any // NULL when no Idempotency-Key was given, or the sandbox is born failed
	if sb.IdempotencyKey != "" && sb.State != berth.SandboxFailed {
		key = sb.IdempotencyKey
	}
	reason := "created"
	if sb.AgentID != "" {
		reason = "placed on agent/" + sb.AgentID
	}
	return sb, meta, key, reason, nil
}

// insertSandboxSQL inserts a sandbox row unless its tenant's Idempotency-Key is held, and
// returns TRUE when it did (sandboxArgs; CreateSandbox and ReserveAndCreate).
const insertSandboxSQL = `INSERT INTO sandboxes (` + sandboxColumns + `)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
	RETURNING TRUE`

func sandboxArgs(sb berth.Sandbox, meta, key any) []any {
	return []any{sb.ID, sb.Template, sb.Tenant, sb.AgentID, string(sb.State), sb.MemoryMiB, sb.VCPUs, sb.Stateful,
		ms(sb.CreatedAt), nullMS(sb.ExpiresAt), meta, sb.Reason, key, sb.Volume, nullMS(sb.PausedAt),
		sb.Image, sb.RequestHash}
}

// sandboxEvent is a new sandbox's event pending → sb.State (LIF-3).
func sandboxEvent(sb berth.Sandbox, reason, actor string, now time.Time) berth.Event {
	return berth.Event{At: now, Entity: "sandbox/" + sb.ID, From: string(berth.SandboxPending), To: string(sb.State),
		Reason: reason, Actor: actor}
}

// createSandboxTx is CreateSandbox inside tx: the quota check and the insert. It returns the
// event pending → sb.State to write.
func (s *Store) createSandboxTx(ctx context.Context, tx *Tx, sb berth.Sandbox, meta, key any, reason, actor string, now time.Time) (berth.Event, error) {
	if !sb.State.Terminal() {
		// ADM-11: hard limits, checked in the insert's transaction under the tenant's
		// quota lock and quota row lock, so replicas cannot overshoot together.
		if err := s.lockName(ctx, tx, quotaLock+sb.Tenant, shared); err != nil {
			return berth.Event{}, s.errorf("quota lock of %q: %w", sb.Tenant, err)
		}
		q, err := s.quotaOf(ctx, tx.conn, sb.Tenant, true)
		if err != nil {
			return berth.Event{}, err
		}
		if q.MaxSandboxes > 0 || q.MaxMemoryMiB > 0 {
			n, mem, err := s.usageOf(ctx, tx.conn, sb.Tenant)
			if err != nil {
				return berth.Event{}, err
			}
			if err := q.Check(n, mem, sb.MemoryMiB); err != nil {
				return berth.Event{}, err
			}
		}
	}
	// A holder that fails between the insert and the lookup frees the key: try again.
	for range 3 {
		var inserted bool
		err := tx.queryRow(ctx, insertSandboxSQL, sandboxArgs(sb, meta, key)...).Scan(&inserted)
		if err == nil {
			return sandboxEvent(sb, reason, actor, now), nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return berth.Event{}, s.errorf("create sandbox %q: %w", sb.ID, err)
		}
		var holder string
		err = tx.queryRow(ctx, `SELECT id FROM sandboxes WHERE tenant = ? AND idempotency_key = ?`,
			sb.Tenant, sb.IdempotencyKey).Scan(&holder)
		if err == nil {
			return berth.Event{}, fmt.Errorf("sandbox %q: key %q held by sandbox %q: %w", sb.ID, sb.IdempotencyKey, holder, berth.ErrIdempotencyConflict)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return berth.Event{}, s.errorf("create sandbox %q: %w", sb.ID, err)
		}
	}
	return berth.Event{}, fmt.Errorf("sandbox %q: key %q: %w", sb.ID, sb.IdempotencyKey, berth.ErrIdempotencyConflict)
}

// Sandbox returns sandbox id or an error wrapping berth.ErrNotFound.
func (s *Store) Sandbox(ctx context.Context, id string) (berth.Sandbox, error) {
	sb, err := s.scanSandbox(s.pool().queryRow(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return berth.Sandbox{}, fmt.Errorf("sandbox %q: %w", id, berth.ErrNotFound)
	}
	return sb, err
}

// SandboxByIdempotencyKey returns the tenant's sandbox created with key (API-4), or an error
// wrapping berth.ErrNotFound. A failed sandbox no longer holds its key.
func (s *Store) SandboxByIdempotencyKey(ctx context.Context, tenant, key string) (berth.Sandbox, error) {
	sb, err := s.scanSandbox(s.pool().queryRow(ctx,
		`SELECT `+sandboxColumns+` FROM sandboxes WHERE tenant = ? AND idempotency_key = ?`, tenant, key))
	if errors.Is(err, sql.ErrNoRows) {
		return berth.Sandbox{}, fmt.Errorf("sandbox of tenant %q with key %q: %w", tenant, key, berth.ErrNotFound)
	}
	return sb, err
}

// Sandboxes lists sandboxes matching f, newest (created_at) first, ties by id descending, or
// with f.OldestFirst oldest first after the cursor f.After (a row-value comparison, as
// ExpiringFirst's); f.Limit 0 means 1000.
func (s *Store) Sandboxes(ctx context.Context, f berth.SandboxFilter) ([]berth.Sandbox, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		where, args = append(where, cond+" = ?"), append(args, v)
	}
	if f.Tenant != "" {
		add("tenant", f.Tenant)
	}
	if f.State != "" {
		add("state", string(f.State))
	}
	if f.AgentID != "" {
		add("agent_id", f.AgentID)
	}
	if f.Live {
		where, args = append(where, "state NOT IN "+inTerminal), append(args, terminalStates...)
	}
	order := " ORDER BY created_at DESC, id DESC LIMIT ?"
	if f.OldestFirst {
		where, args = append(where, "(created_at, id) > (?, ?)"), append(args, ms(f.After.CreatedAt), f.After.ID)
		order = " ORDER BY created_at, id LIMIT ?"
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += order
	args = append(args, limitOr(f.Limit, defaultLimit))
	rows, err := s.pool().query(ctx, q, args...)
	if err != nil {
		return nil, s.errorf("sandboxes: %w", err)
	}
	defer rows.Close()
	out := []berth.Sandbox{}
	for rows.Next() {
		sb, err := s.scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("sandboxes: %w", err)
	}
	return out, nil
}

// TransitionSandbox moves sandbox id to state to, recording reason on the row and the event
// current → to (LIF-3), only if its current state is one of from, or any non-terminal state
// when from is empty. A sandbox already in state to is not moved (no event). It reports
// whether the transition happened; an unknown id is an error wrapping berth.ErrNotFound.
// Entering a terminal state also releases the sandbox's reservations (events held → released)
// and a create that fails before it ran frees its Idempotency-Key (API-4). The sandbox row
// is locked while its state is judged, so concurrent transitions of one sandbox apply one at
// a time.
func (s *Store) TransitionSandbox(ctx context.Context, id string, from []berth.SandboxState, to berth.SandboxState, reason, actor string, now time.Time) (bool, error) {
	if !to.Valid() {
		return false, s.errorf("transition sandbox %q: unknown state %q", id, to)
	}
	if len(from) == 1 && from[0] != to && !to.Terminal() {
		// The common case (a create's starting → running): the conditional UPDATE and the
		// event go in one batch, and the transaction is rolled back when the row was not in
		// from[0]; the path below then tells why (issue 16, goal 1).
		moved, err := s.transitionBatched(ctx, id, from[0], to, reason, actor, now)
		if !errors.Is(err, errNotMoved) {
			return moved, err
		}
	}
	var moved bool
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		moved, err = s.transitionTx(ctx, tx, id, from, to, nil, reason, actor, now)
		return err
	})
	return moved, err
}

// errNotMoved rolls transitionBatched back: the row was not in the state it moves from.
var errNotMoved = errors.New("the sandbox is not in the state it moves from")

// transitionBatched is TransitionSandbox from one state to a live one, its UPDATE and event
// sent in one batch; errNotMoved (nothing written) when the row is not in from. Where the
// database writes through a CTE (Dialect.WriteCTE) both are one statement outside any
// explicit transaction: one round trip, no BEGIN or COMMIT.
func (s *Store) transitionBatched(ctx context.Context, id string, from, to berth.SandboxState, reason, actor string, now time.Time) (bool, error) {
	set, args := transitionSet(from, to, nil, now)
	update := `UPDATE sandboxes SET ` + set + ` WHERE id = ? AND state = ?`
	args = append(append(args, reason), id, string(from))
	ev := berth.Event{At: now, Entity: "sandbox/" + id, From: string(from), To: string(to), Reason: reason, Actor: actor}
	if s.d.WriteCTE {
		return s.transitionOneStatement(ctx, update, args, ev)
	}
	err := s.inTx(ctx, func(tx *Tx) error {
		b := &batch{}
		b.queue(update, args...)
		s.queueEvents(tx, b, ev)
		res := tx.send(ctx, b)
		r, err := res.Exec()
		var n int64
		if err == nil {
			n, err = r.RowsAffected()
		}
		if err == nil {
			_, err = res.Exec()
		}
		if cerr := res.Close(); err == nil {
			err = cerr
		}
		switch {
		case err != nil:
			return s.errorf("transition sandbox %q: %w", id, err)
		case n != 1:
			return errNotMoved
		}
		return nil
	})
	return err == nil, err
}

// transitionOneStatement runs update (which moves at most one row) and inserts ev only if it
// did, as one statement: a data-modifying CTE is atomic on its own. errNotMoved when no row
// moved.
func (s *Store) transitionOneStatement(ctx context.Context, update string, args []any, ev berth.Event) (bool, error) {
	q := `WITH moved AS (` + update + ` RETURNING id) INSERT INTO events (at, entity, from_state, to_state, reason, actor) ` +
		`SELECT ?, ?, ?, ?, ?, ? FROM moved`
	args = append(args, ms(ev.At), ev.Entity, ev.From, ev.To, ev.Reason, ev.Actor)
	r, err := s.pool().exec(ctx, q, args...)
	var n int64
	if err == nil {
		n, err = r.RowsAffected()
	}
	switch {
	case err != nil:
		return false, s.errorf("transition %s: %w", ev.Entity, err)
	case n != 1:
		return false, errNotMoved
	}
	s.events.Committed(ev)
	return true, nil
}

// transitionSet is the SET clause (and its arguments, reason last to add) of a transition
// from state to to, with place's agent, TTL end, pause time and image when not nil.
func transitionSet(state, to berth.SandboxState, place *berth.SandboxMove, now time.Time) (string, []any) {
	set := `state = ?, idempotency_key = CASE WHEN ? THEN NULL ELSE idempotency_key END, ended_at = ?`
	args := []any{string(to), state.FreesIdempotencyKey(to), nullMS(time.Time{})}
	if to.Terminal() {
		args[2] = ms(now) // retention counts from here (PurgeEnded)
	}
	if place != nil {
		set += `, agent_id = ?, expires_at = ?, paused_at = ?, image = ?`
		args = append(args, place.AgentID, nullMS(place.ExpiresAt), nullMS(place.PausedAt), place.Image)
	}
	return set + `, reason = ?`, args
}

// MoveSandbox moves sandbox id to m.To, as TransitionSandbox does (same guard on from under
// the same row lock, same event "<old> → m.To" with reason and actor, reservations released
// when m.To is terminal), and in the same transaction sets its agent_id, expires_at,
// paused_at and image to m's values; a zero m.ExpiresAt or m.PausedAt is stored as unset
// (PAUSE-1, SPOT-3, LIF-3). A sandbox already in m.To is not moved. It reports whether the
// move happened; an unknown id is (false, nil) and an invalid m.To an error.
func (s *Store) MoveSandbox(ctx context.Context, id string, from []berth.SandboxState, m berth.SandboxMove, reason, actor string, now time.Time) (bool, error) {
	if !m.To.Valid() {
		return false, s.errorf("move sandbox %q: unknown state %q", id, m.To)
	}
	var moved bool
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		moved, err = s.transitionTx(ctx, tx, id, from, m.To, &m, reason, actor, now)
		return err
	})
	if errors.Is(err, berth.ErrNotFound) {
		return false, nil
	}
	return moved, err
}

// transitionTx is TransitionSandbox inside an open transaction (ApplyHeartbeat shares it).
// When place is not nil it is MoveSandbox's: the update also writes place's agent, TTL end,
// pause time and image (place.To is ignored; to is the new state).
func (s *Store) transitionTx(ctx context.Context, tx *Tx, id string, from []berth.SandboxState, to berth.SandboxState,
	place *berth.SandboxMove, reason, actor string, now time.Time) (bool, error) {
	update := func(state berth.SandboxState, where string, whereArgs ...any) (int64, error) {
		set, args := transitionSet(state, to, place, now)
		res, err := tx.exec(ctx, `UPDATE sandboxes SET `+set+` WHERE `+where, append(append(args, reason), whereArgs...)...)
		if err != nil {
			return 0, s.errorf("transition sandbox %q: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, s.errorf("transition sandbox %q: %w", id, err)
		}
		return n, nil
	}
	var cur string
	// One allowed state (a create's starting → running, say): one conditional UPDATE, whose
	// row lock and re-check of the state do what SELECT … FOR UPDATE and a check would (issue
	// 16, goal 1). When it matches nothing, the read below tells "no such sandbox" from "in
	// another state".
	if len(from) == 1 && from[0] != to {
		n, err := update(from[0], `id = ? AND state = ?`, id, string(from[0]))
		if err != nil {
			return false, err
		}
		if n == 1 {
			cur = string(from[0])
		}
	}
	if cur == "" {
		err := tx.queryRow(ctx, `SELECT state FROM sandboxes WHERE id = ?`+s.d.ForUpdate, id).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			return false, fmt.Errorf("sandbox %q: %w", id, berth.ErrNotFound)
		}
		if err != nil {
			return false, s.errorf("transition sandbox %q: %w", id, err)
		}
		state := berth.SandboxState(cur)
		allowed := slices.Contains(from, state)
		if len(from) == 0 {
			allowed = !state.Terminal()
		}
		if !allowed || state == to || len(from) == 1 {
			return false, nil // len(from) == 1: the UPDATE above found it in another state
		}
		if _, err := update(state, `id = ?`, id); err != nil {
			return false, err
		}
	}
	if err := s.insertEvent(ctx, tx, berth.Event{
		At: now, Entity: "sandbox/" + id, From: cur, To: string(to), Reason: reason, Actor: actor,
	}); err != nil {
		return false, err
	}
	if to.Terminal() {
		if err := s.releaseSandboxReservations(ctx, tx, id, to, actor, now); err != nil {
			return false, err
		}
	}
	return true, nil
}

// scanSandbox reads one row selected with sandboxColumns.
func (s *Store) scanSandbox(r scanner) (berth.Sandbox, error) {
	var sb berth.Sandbox
	var state string
	var created int64
	var expires, paused sql.NullInt64
	var meta, key sql.NullString
	err := r.Scan(&sb.ID, &sb.Template, &sb.Tenant, &sb.AgentID, &state, &sb.MemoryMiB, &sb.VCPUs, &sb.Stateful,
		&created, &expires, &meta, &sb.Reason, &key, &sb.Volume, &paused, &sb.Image, &sb.RequestHash)
	if errors.Is(err, sql.ErrNoRows) {
		return sb, err
	}
	if err != nil {
		return sb, s.errorf("scan sandbox: %w", err)
	}
	sb.State = berth.SandboxState(state)
	sb.CreatedAt, sb.ExpiresAt, sb.PausedAt = fromMS(created), fromNullMS(expires), fromNullMS(paused)
	sb.IdempotencyKey = key.String
	if meta.Valid && meta.String != "" {
		if err := json.Unmarshal([]byte(meta.String), &sb.Metadata); err != nil {
			return sb, s.errorf("sandbox %q metadata: %w", sb.ID, err)
		}
	}
	return sb, nil
}

// SandboxesByID implements berth.SandboxStore: reads by the primary key, inChunk ids a
// statement.
func (s *Store) SandboxesByID(ctx context.Context, ids []string) ([]berth.Sandbox, error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	out := make([]berth.Sandbox, 0, len(ids))
	err := s.queryIn(ctx, "sandboxes by id", `SELECT `+sandboxColumns+` FROM sandboxes WHERE `, nil, "id", ids, "", func(rows Rows) error {
		sb, err := s.scanSandbox(rows)
		if err != nil {
			return err
		}
		out = append(out, sb)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ExpiringFirst implements berth.SandboxStore (API-3) by the sandboxes_state_expiry index
// (migration 14): the cursor is a row-value comparison on its trailing columns.
func (s *Store) ExpiringFirst(ctx context.Context, from berth.Expiry, limit int) ([]berth.Expiry, error) {
	if limit <= 0 { // SQLite reads LIMIT -1 as no limit, PostgreSQL refuses it: neither is asked
		return nil, nil
	}
	rows, err := s.pool().query(ctx, `SELECT id, agent_id, expires_at FROM sandboxes
		WHERE state = ? AND expires_at IS NOT NULL AND (expires_at, id) > (?, ?)
		ORDER BY expires_at, id LIMIT ?`, string(berth.SandboxRunning), ms(from.At), from.SandboxID, limit)
	if err != nil {
		return nil, s.errorf("sandboxes by expiry: %w", err)
	}
	defer rows.Close()
	var out []berth.Expiry
	for rows.Next() {
		var e berth.Expiry
		var at int64
		if err := rows.Scan(&e.SandboxID, &e.AgentID, &at); err != nil {
			return nil, s.errorf("sandboxes by expiry: %w", err)
		}
		e.At = fromMS(at)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("sandboxes by expiry: %w", err)
	}
	return out, nil
}

// HeldEnded implements berth.SandboxStore (AGT-6): one read of agentID's held list joined
// with the boot it belongs to and the sandboxes' states and agents, by agent_held's primary
// key, the agents' and the sandboxes' one.
func (s *Store) HeldEnded(ctx context.Context, agentID string) (held []string, c berth.HeldCheck, err error) {
	// held_boot is the boot whose list agent_held holds, read in the same statement: the
	// incarnations are numbered within it.
	rows, err := s.pool().query(ctx, `SELECT h.sandbox_id, h.incarnation, a.held_boot, s.state, s.agent_id FROM agent_held h
		JOIN agents a ON a.id = h.agent_id
		LEFT JOIN sandboxes s ON s.id = h.sandbox_id
		WHERE h.agent_id = ? AND NOT h.starting ORDER BY h.sandbox_id`, agentID)
	if err != nil {
		return nil, c, s.errorf("held sandboxes of %q: %w", agentID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var cp berth.HeldCopy
		var state, owner sql.NullString
		if err := rows.Scan(&cp.ID, &cp.Incarnation, &cp.Boot, &state, &owner); err != nil {
			return nil, c, s.errorf("held sandboxes of %q: %w", agentID, err)
		}
		held = append(held, cp.ID)
		checkHeld(&c, agentID, cp, state, owner)
	}
	if err := rows.Err(); err != nil {
		return nil, c, s.errorf("held sandboxes of %q: %w", agentID, err)
	}
	return held, c, nil
}

// checkHeld files agentID's copy cp into c by its sandbox's row (state and agent_id, both
// NULL when the store has no row): ended when there is no row or it is terminal, stale when
// it is live on another agent or on none.
func checkHeld(c *berth.HeldCheck, agentID string, cp berth.HeldCopy, state, owner sql.NullString) {
	switch {
	case !state.Valid || berth.SandboxState(state.String).Terminal():
		c.Ended = append(c.Ended, cp.ID)
	case owner.String != agentID:
		c.Stale = append(c.Stale, cp)
	}
}

// EndedSandboxes implements berth.SandboxStore (AGT-6): held checked against the sandboxes'
// states and agents, in the order given.
func (s *Store) EndedSandboxes(ctx context.Context, agentID string, held []berth.HeldCopy) (berth.HeldCheck, error) {
	type row struct{ state, owner sql.NullString }
	found := make(map[string]row, len(held))
	ids := make([]string, len(held))
	for i, cp := range held {
		ids[i] = cp.ID
	}
	err := s.queryIn(ctx, "ended sandboxes", `SELECT id, state, agent_id FROM sandboxes WHERE `, nil, "id", ids, "", func(rows Rows) error {
		var id string
		var r row
		if err := rows.Scan(&id, &r.state, &r.owner); err != nil {
			return err
		}
		found[id] = r
		return nil
	})
	var c berth.HeldCheck
	if err != nil {
		return c, err
	}
	for _, cp := range held {
		r := found[cp.ID]
		checkHeld(&c, agentID, cp, r.state, r.owner)
	}
	return c, nil
}
