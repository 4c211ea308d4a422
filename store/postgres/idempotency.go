package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-dev/berth"
)

// callColumns is the column list every idempotent-call query selects, in scanCall's order.
const callColumns = `scope, key, request_hash, status, answer, created_at`

// ClaimCall implements berth.IdempotencyStore (API-4, C26): it inserts c as in flight unless
// (c.Scope, c.Key) is held, and returns the call as stored and whether this claim made it. The
// primary key decides a race between replicas: the losing insert waits for the winner's commit.
func (s *Store) ClaimCall(ctx context.Context, c berth.IdempotentCall) (berth.IdempotentCall, bool, error) {
	// A holder abandoned between the insert and the read frees the key: try again.
	for range 3 {
		out, err := scanCall(s.pool.QueryRow(ctx, `INSERT INTO idempotent_calls (`+callColumns+`)
			VALUES ($1, $2, $3, 0, NULL, $4) ON CONFLICT (scope, key) DO NOTHING
			RETURNING `+callColumns, c.Scope, c.Key, c.RequestHash, ms(c.CreatedAt)))
		if err == nil {
			return out, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return out, false, fmt.Errorf("postgres: claim call %q: %w", c.Key, err)
		}
		out, err = s.Call(ctx, c.Scope, c.Key)
		if !errors.Is(err, berth.ErrNotFound) {
			return out, false, err
		}
	}
	return c, false, fmt.Errorf("postgres: claim call %q: the key kept changing hands", c.Key)
}

// FinishCall implements berth.IdempotencyStore: it records c's answer unless an answer, or a
// claim for another request, holds the key, and returns the call as stored.
func (s *Store) FinishCall(ctx context.Context, c berth.IdempotentCall) (berth.IdempotentCall, error) {
	if c.Status == 0 {
		return c, errors.New("postgres: finish call: status 0")
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO idempotent_calls (`+callColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (scope, key) DO UPDATE SET status = excluded.status, answer = excluded.answer
		WHERE idempotent_calls.status = 0 AND idempotent_calls.request_hash = excluded.request_hash`,
		c.Scope, c.Key, c.RequestHash, c.Status, c.Answer, ms(c.CreatedAt))
	if err != nil {
		return c, fmt.Errorf("postgres: finish call %q: %w", c.Key, err)
	}
	return s.Call(ctx, c.Scope, c.Key)
}

// AbandonCall implements berth.IdempotencyStore: the in-flight claim made at claimedAt goes.
func (s *Store) AbandonCall(ctx context.Context, scope, key string, claimedAt time.Time) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM idempotent_calls
		WHERE scope = $1 AND key = $2 AND status = 0 AND created_at = $3`, scope, key, ms(claimedAt))
	if err != nil {
		return fmt.Errorf("postgres: abandon call %q: %w", key, err)
	}
	return nil
}

// Call implements berth.IdempotencyStore.
func (s *Store) Call(ctx context.Context, scope, key string) (berth.IdempotentCall, error) {
	c, err := scanCall(s.pool.QueryRow(ctx, `SELECT `+callColumns+` FROM idempotent_calls
		WHERE scope = $1 AND key = $2`, scope, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("call %q: %w", key, berth.ErrNotFound)
	}
	if err != nil {
		return c, fmt.Errorf("postgres: call %q: %w", key, err)
	}
	return c, nil
}

// ForgetCalls implements berth.IdempotencyStore.
func (s *Store) ForgetCalls(ctx context.Context, cutoff time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM idempotent_calls WHERE created_at < $1`, ms(cutoff))
	if err != nil {
		return 0, fmt.Errorf("postgres: forget calls: %w", err)
	}
	return tag.RowsAffected(), nil
}

// scanCall reads one row selected with callColumns.
func scanCall(r scanner) (berth.IdempotentCall, error) {
	var c berth.IdempotentCall
	var created int64
	err := r.Scan(&c.Scope, &c.Key, &c.RequestHash, &c.Status, &c.Answer, &created)
	c.CreatedAt = fromMS(created)
	return c, err
}
