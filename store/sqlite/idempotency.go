package sqlite

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
// (c.Scope, c.Key) is held, and returns the call as stored and whether this claim made it.
func (s *Store) ClaimCall(ctx context.Context, c berth.IdempotentCall) (berth.IdempotentCall, bool, error) {
	var out berth.IdempotentCall
	var claimed bool
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO idempotent_calls (`+callColumns+`)
			VALUES (?, ?, ?, 0, NULL, ?) ON CONFLICT (scope, key) DO NOTHING`,
			c.Scope, c.Key, c.RequestHash, ms(c.CreatedAt))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		claimed = n == 1
		out, err = scanCall(tx.QueryRowContext(ctx, `SELECT `+callColumns+` FROM idempotent_calls WHERE scope = ? AND key = ?`, c.Scope, c.Key))
		return err
	})
	if err != nil {
		return out, false, fmt.Errorf("sqlite: claim call %q: %w", c.Key, err)
	}
	return out, claimed, nil
}

// FinishCall implements berth.IdempotencyStore: it records c's answer unless an answer, or a
// claim for another request, holds the key, and returns the call as stored.
func (s *Store) FinishCall(ctx context.Context, c berth.IdempotentCall) (berth.IdempotentCall, error) {
	if c.Status == 0 {
		return c, errors.New("sqlite: finish call: status 0")
	}
	var out berth.IdempotentCall
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO idempotent_calls (`+callColumns+`)
			VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (scope, key) DO UPDATE SET status = excluded.status, answer = excluded.answer
			WHERE idempotent_calls.status = 0 AND idempotent_calls.request_hash = excluded.request_hash`,
			c.Scope, c.Key, c.RequestHash, c.Status, c.Answer, ms(c.CreatedAt))
		if err != nil {
			return err
		}
		out, err = scanCall(tx.QueryRowContext(ctx, `SELECT `+callColumns+` FROM idempotent_calls WHERE scope = ? AND key = ?`, c.Scope, c.Key))
		return err
	})
	if err != nil {
		return out, fmt.Errorf("sqlite: finish call %q: %w", c.Key, err)
	}
	return out, nil
}

// AbandonCall implements berth.IdempotencyStore: the in-flight claim made at claimedAt goes.
func (s *Store) AbandonCall(ctx context.Context, scope, key string, claimedAt time.Time) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM idempotent_calls
		WHERE scope = ? AND key = ? AND status = 0 AND created_at = ?`, scope, key, ms(claimedAt))
	if err != nil {
		return fmt.Errorf("sqlite: abandon call %q: %w", key, err)
	}
	return nil
}

// Call implements berth.IdempotencyStore.
func (s *Store) Call(ctx context.Context, scope, key string) (berth.IdempotentCall, error) {
	c, err := scanCall(s.db.QueryRowContext(ctx, `SELECT `+callColumns+` FROM idempotent_calls WHERE scope = ? AND key = ?`, scope, key))
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("call %q: %w", key, berth.ErrNotFound)
	}
	if err != nil {
		return c, fmt.Errorf("sqlite: call %q: %w", key, err)
	}
	return c, nil
}

// ForgetCalls implements berth.IdempotencyStore.
func (s *Store) ForgetCalls(ctx context.Context, cutoff time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM idempotent_calls WHERE created_at < ?`, ms(cutoff))
	if err != nil {
		return 0, fmt.Errorf("sqlite: forget calls: %w", err)
	}
	return res.RowsAffected()
}

// scanCall reads one row selected with callColumns.
func scanCall(r scanner) (berth.IdempotentCall, error) {
	var c berth.IdempotentCall
	var created int64
	err := r.Scan(&c.Scope, &c.Key, &c.RequestHash, &c.Status, &c.Answer, &created)
	c.CreatedAt = fromMS(created)
	return c, err
}
