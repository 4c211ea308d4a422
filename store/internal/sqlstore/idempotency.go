package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth"
)

// callColumns is the column list every idempotent-call query selects, in scanCall's order.
const callColumns = `scope, key, request_hash, status, answer, created_at`

// ClaimCall implements berth.IdempotencyStore (API-4, C26): it inserts c as in flight unless
// (c.Scope, c.Key) is held, and returns the call as stored and whether this claim made it. The
// primary key decides a race (between replicas too): the losing insert waits for the winner's
// commit.
func (s *Store) ClaimCall(ctx context.Context, c berth.IdempotentCall) (berth.IdempotentCall, bool, error) {
	// A holder abandoned between the insert and the read frees the key: try again.
	for range 3 {
		out, err := s.scanCall(s.pool().queryRow(ctx, `INSERT INTO idempotent_calls (`+callColumns+`)
			VALUES (?, ?, ?, 0, NULL, ?) ON CONFLICT (scope, key) DO NOTHING
			RETURNING `+callColumns, c.Scope, c.Key, c.RequestHash, ms(c.CreatedAt)))
		if err == nil {
			return out, true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return out, false, s.errorf("claim call %q: %w", c.Key, err)
		}
		out, err = s.Call(ctx, c.Scope, c.Key)
		if !errors.Is(err, berth.ErrNotFound) {
			return out, false, err
		}
	}
	return c, false, s.errorf("claim call %q: the key kept changing hands", c.Key)
}

// FinishCall implements berth.IdempotencyStore: it records c's answer unless an answer, or a
// claim for another request, holds the key, and returns the call as stored.
func (s *Store) FinishCall(ctx context.Context, c berth.IdempotentCall) (berth.IdempotentCall, error) {
	if c.Status == 0 {
		return c, s.errorf("finish call: status 0")
	}
	// One statement that returns the row it wrote; only when it wrote nothing (an answer or
	// another request's claim holds the key) a read: the upsert cannot be undone by anything
	// but the sweeper, so the read sees the answer that held the key before it.
	out, err := s.scanCall(s.pool().queryRow(ctx, `INSERT INTO idempotent_calls (`+callColumns+`)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (scope, key) DO UPDATE SET status = excluded.status, answer = excluded.answer
		WHERE idempotent_calls.status = 0 AND idempotent_calls.request_hash = excluded.request_hash
		RETURNING `+callColumns,
		c.Scope, c.Key, c.RequestHash, c.Status, c.Answer, ms(c.CreatedAt)))
	if err == nil {
		return out, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return c, s.errorf("finish call %q: %w", c.Key, err)
	}
	return s.Call(ctx, c.Scope, c.Key)
}

// AbandonCall implements berth.IdempotencyStore: the in-flight claim made at claimedAt goes.
func (s *Store) AbandonCall(ctx context.Context, scope, key string, claimedAt time.Time) error {
	_, err := s.pool().exec(ctx, `DELETE FROM idempotent_calls
		WHERE scope = ? AND key = ? AND status = 0 AND created_at = ?`, scope, key, ms(claimedAt))
	if err != nil {
		return s.errorf("abandon call %q: %w", key, err)
	}
	return nil
}

// Call implements berth.IdempotencyStore.
func (s *Store) Call(ctx context.Context, scope, key string) (berth.IdempotentCall, error) {
	c, err := s.scanCall(s.pool().queryRow(ctx, `SELECT `+callColumns+` FROM idempotent_calls WHERE scope = ? AND key = ?`, scope, key))
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("call %q: %w", key, berth.ErrNotFound)
	}
	if err != nil {
		return c, s.errorf("call %q: %w", key, err)
	}
	return c, nil
}

// ForgetCalls implements berth.IdempotencyStore.
func (s *Store) ForgetCalls(ctx context.Context, cutoff time.Time) (int64, error) {
	res, err := s.pool().exec(ctx, `DELETE FROM idempotent_calls WHERE created_at < ?`, ms(cutoff))
	if err != nil {
		return 0, s.errorf("forget calls: %w", err)
	}
	return res.RowsAffected()
}

// scanCall reads one row selected with callColumns.
func (s *Store) scanCall(r scanner) (berth.IdempotentCall, error) {
	var c berth.IdempotentCall
	var created int64
	err := r.Scan(&c.Scope, &c.Key, &c.RequestHash, &c.Status, &c.Answer, &created)
	c.CreatedAt = fromMS(created)
	return c, err
}
