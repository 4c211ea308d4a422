package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth"
)

// PutTenant creates tenant t.Name if it does not exist and reports whether it did: one
// INSERT … ON CONFLICT DO NOTHING, whose row count says which (0: the name was taken, and the
// tenant there is left as is). The statement is atomic on both backends, so of concurrent
// calls for one name exactly one reports created.
func (s *Store) PutTenant(ctx context.Context, t berth.Tenant) (created bool, err error) {
	if t.Name == "" {
		return false, s.errorf("put tenant: empty name")
	}
	res, err := s.pool().exec(ctx,
		`INSERT INTO tenants (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`,
		t.Name, nullMS(t.CreatedAt))
	if err != nil {
		return false, s.errorf("put tenant %q: %w", t.Name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, s.errorf("put tenant %q: rows affected: %w", t.Name, err)
	}
	return n == 1, nil
}

// Tenants lists tenants ordered by name.
func (s *Store) Tenants(ctx context.Context) ([]berth.Tenant, error) {
	rows, err := s.pool().query(ctx, `SELECT name, created_at FROM tenants ORDER BY name`)
	if err != nil {
		return nil, s.errorf("tenants: %w", err)
	}
	defer rows.Close()
	out := []berth.Tenant{}
	for rows.Next() {
		var t berth.Tenant
		var created sql.NullInt64
		if err := rows.Scan(&t.Name, &created); err != nil {
			return nil, s.errorf("tenants: %w", err)
		}
		t.CreatedAt = fromNullMS(created)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("tenants: %w", err)
	}
	return out, nil
}

// PutAPIKey stores k (its hash only, API-1), replacing a key with the same id. The tenant
// must exist, else the error wraps berth.ErrNotFound; a hash held by another key is an error.
func (s *Store) PutAPIKey(ctx context.Context, k berth.APIKey) error {
	if k.ID == "" || k.Hash == "" {
		return s.errorf("put api key: needs an id and a hash (id %q)", k.ID)
	}
	return s.inTx(ctx, func(tx *Tx) error {
		var one int
		err := tx.queryRow(ctx, `SELECT 1 FROM tenants WHERE name = ?`, k.Tenant).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("api key %q: tenant %q: %w", k.ID, k.Tenant, berth.ErrNotFound)
		}
		if err != nil {
			return s.errorf("put api key %q: %w", k.ID, err)
		}
		_, err = tx.exec(ctx, `
			INSERT INTO api_keys (id, tenant, role, hash, created_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET tenant = excluded.tenant, role = excluded.role,
				hash = excluded.hash, created_at = excluded.created_at`,
			k.ID, k.Tenant, k.Role, k.Hash, nullMS(k.CreatedAt))
		if err != nil {
			return s.errorf("put api key %q: %w", k.ID, err)
		}
		return nil
	})
}

// APIKeyByHash returns the key whose secret hashes (hex SHA-256) to hash, or an error
// wrapping berth.ErrNotFound.
func (s *Store) APIKeyByHash(ctx context.Context, hash string) (berth.APIKey, error) {
	k := berth.APIKey{Hash: hash}
	var created sql.NullInt64
	err := s.pool().queryRow(ctx, `SELECT id, tenant, role, created_at FROM api_keys WHERE hash = ?`, hash).
		Scan(&k.ID, &k.Tenant, &k.Role, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return berth.APIKey{}, fmt.Errorf("api key: %w", berth.ErrNotFound)
	}
	if err != nil {
		return berth.APIKey{}, s.errorf("api key: %w", err)
	}
	k.CreatedAt = fromNullMS(created)
	return k, nil
}

// SetQuota implements berth.TenantStore (ADM-11).
func (s *Store) SetQuota(ctx context.Context, q berth.Quota, actor string, now time.Time) error {
	if q.MaxSandboxes < 0 || q.MaxMemoryMiB < 0 {
		return s.errorf("quota of %q: limits must not be negative", q.Tenant)
	}
	return s.inTx(ctx, func(tx *Tx) error {
		// First the tenant's quota lock, exclusively: it waits for every create of the tenant
		// still deciding without a quota, and the creates after it see this one (ADM-11).
		if err := s.lockName(ctx, tx, quotaLock+q.Tenant, exclusive); err != nil {
			return s.errorf("quota of %q: %w", q.Tenant, err)
		}
		var name string
		if err := tx.queryRow(ctx, `SELECT name FROM tenants WHERE name = ?`, q.Tenant).Scan(&name); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("tenant %q: %w", q.Tenant, berth.ErrNotFound)
			}
			return s.errorf("quota of %q: %w", q.Tenant, err)
		}
		if _, err := tx.exec(ctx, `INSERT INTO quotas (tenant, max_sandboxes, max_memory_mb) VALUES (?, ?, ?)
			ON CONFLICT (tenant) DO UPDATE SET max_sandboxes = excluded.max_sandboxes, max_memory_mb = excluded.max_memory_mb`,
			q.Tenant, q.MaxSandboxes, q.MaxMemoryMiB); err != nil {
			return s.errorf("quota of %q: %w", q.Tenant, err)
		}
		return s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "tenant/" + q.Tenant, To: berth.EventQuotaSet,
			Reason: fmt.Sprintf("max_sandboxes=%d max_memory_mb=%d", q.MaxSandboxes, q.MaxMemoryMiB), Actor: actor})
	})
}

// Quota implements berth.TenantStore.
func (s *Store) Quota(ctx context.Context, tenant string) (berth.Quota, error) {
	return s.quotaOf(ctx, s.pool(), tenant, false)
}

// quotaLock prefixes a tenant's name into the name of its quota lock (Dialect.LockNameSQL).
// A create takes it shared before it reads the quota and SetQuota takes it
// exclusively: the quota row's own lock serialises the creates of a tenant that has a quota,
// but a tenant without one has no row to lock, and a quota set while such a create was
// deciding used to let the creates after it count usage without that one (found by an
// attack: 2 live sandboxes under MaxSandboxes=1).
const quotaLock = "quota/"

// quotaSQL reads a tenant's quota row (Dialect.ForUpdate appended to lock it, ADM-11).
const quotaSQL = `SELECT max_sandboxes, max_memory_mb FROM quotas WHERE tenant = ?`

// quotaOf reads a tenant's quota; lock takes the row lock that serialises the tenant's
// creates across replicas (ADM-11 is a hard limit).
func (s *Store) quotaOf(ctx context.Context, db conn, tenant string, lock bool) (berth.Quota, error) {
	q := berth.Quota{Tenant: tenant}
	query := quotaSQL
	if lock {
		query += s.d.ForUpdate
	}
	err := db.queryRow(ctx, query, tenant).Scan(&q.MaxSandboxes, &q.MaxMemoryMiB)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return q, s.errorf("quota of %q: %w", tenant, err)
	}
	return q, nil
}

// TenantUsage implements berth.TenantStore.
func (s *Store) TenantUsage(ctx context.Context, tenant string) (int, int64, error) {
	return s.usageOf(ctx, s.pool(), tenant)
}

// usageOf counts a tenant's live sandboxes and sums their memory (MiB).
func (s *Store) usageOf(ctx context.Context, db conn, tenant string) (int, int64, error) {
	var n int
	var mem int64
	err := db.queryRow(ctx, `SELECT COUNT(*), CAST(COALESCE(SUM(memory_mb), 0) AS BIGINT) FROM sandboxes
		WHERE tenant = ? AND state NOT IN `+inTerminal, append([]any{tenant}, terminalStates...)...).Scan(&n, &mem)
	if err != nil {
		return 0, 0, s.errorf("usage of %q: %w", tenant, err)
	}
	return n, mem, nil
}
