package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth"
)

// CreateApp implements berth.AppStore (APP-1).
func (s *Store) CreateApp(ctx context.Context, a berth.App, actor string, now time.Time) (berth.App, error) {
	a.Revision, a.CreatedAt, a.UpdatedAt = 1, now, now
	a = a.InStore()
	doc, err := json.Marshal(a)
	if err != nil {
		return a, s.errorf("encode app %s: %w", a.Name, err)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.exec(ctx, `INSERT INTO apps (name, tenant, state, revision, doc) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (name) DO NOTHING`, a.Name, a.Tenant, string(a.State), a.Revision, string(doc))
		if err != nil {
			return s.errorf("create app %s: %w", a.Name, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("app %s: %w", a.Name, berth.ErrAppExists)
		}
		return s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "app/" + a.Name, To: string(a.State),
			Reason: fmt.Sprintf("created (version %d, desired %s)", a.Version, a.Desired), Actor: actor})
	})
	return a, err
}

// App implements berth.AppStore.
func (s *Store) App(ctx context.Context, name string) (berth.App, error) {
	return s.scanApp(s.pool().queryRow(ctx, `SELECT doc, revision FROM apps WHERE name = ?`, name), name)
}

// Apps implements berth.AppStore.
func (s *Store) Apps(ctx context.Context, tenant string) ([]berth.App, error) {
	rows, err := s.pool().query(ctx, `SELECT doc, revision FROM apps WHERE ? = '' OR tenant = ? ORDER BY name`, tenant, tenant)
	if err != nil {
		return nil, s.errorf("list apps: %w", err)
	}
	defer rows.Close()
	var out []berth.App
	for rows.Next() {
		a, err := s.scanApp(rows, "")
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// UpdateApp implements berth.AppStore: a compare-and-set on the revision.
func (s *Store) UpdateApp(ctx context.Context, a berth.App, reason, actor string, now time.Time) (berth.App, error) {
	read := a.Revision
	a.Revision, a.UpdatedAt = read+1, now
	a = a.InStore()
	doc, err := json.Marshal(a)
	if err != nil {
		return a, s.errorf("encode app %s: %w", a.Name, err)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		old, err := s.guardRevision(ctx, tx, a.Name, read)
		if err != nil {
			return err
		}
		res, err := tx.exec(ctx, `UPDATE apps SET state = ?, revision = ?, doc = ? WHERE name = ? AND revision = ?`,
			string(a.State), a.Revision, string(doc), a.Name, read)
		if err != nil {
			return s.errorf("update app %s: %w", a.Name, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("app %s: %w", a.Name, berth.ErrStaleRevision)
		}
		if old == string(a.State) {
			return nil
		}
		return s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "app/" + a.Name, From: old, To: string(a.State), Reason: reason, Actor: actor})
	})
	return a, err
}

// DeleteApp implements berth.AppStore.
func (s *Store) DeleteApp(ctx context.Context, name string, revision int64, actor string, now time.Time) error {
	return s.inTx(ctx, func(tx *Tx) error {
		old, err := s.guardRevision(ctx, tx, name, revision)
		if err != nil {
			return err
		}
		res, err := tx.exec(ctx, `DELETE FROM apps WHERE name = ? AND revision = ?`, name, revision)
		if err != nil {
			return s.errorf("delete app %s: %w", name, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("app %s: %w", name, berth.ErrStaleRevision)
		}
		return s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "app/" + name, From: old, To: berth.EventAppDeleted, Reason: "deleted by its owner", Actor: actor})
	})
}

// guardRevision returns the app's stored state if its revision is still read; otherwise the
// error wraps ErrStaleRevision, or ErrNotFound when the app is gone. The state read belongs
// to that revision (a state change always bumps it), so the write guarded by the same
// revision writes the right "from" into its event.
func (s *Store) guardRevision(ctx context.Context, tx *Tx, name string, read int64) (string, error) {
	var state string
	var rev int64
	err := tx.queryRow(ctx, `SELECT state, revision FROM apps WHERE name = ?`, name).Scan(&state, &rev)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", fmt.Errorf("app %s: %w", name, berth.ErrNotFound)
	case err != nil:
		return "", s.errorf("read app %s: %w", name, err)
	case rev != read:
		return "", fmt.Errorf("app %s (revision %d, read %d): %w", name, rev, read, berth.ErrStaleRevision)
	}
	return state, nil
}

func (s *Store) scanApp(r scanner, name string) (berth.App, error) {
	var a berth.App
	var doc string
	var rev int64
	if err := r.Scan(&doc, &rev); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return a, fmt.Errorf("app %s: %w", name, berth.ErrNotFound)
		}
		return a, s.errorf("scan app: %w", err)
	}
	if err := json.Unmarshal([]byte(doc), &a); err != nil {
		return a, s.errorf("decode app: %w", err)
	}
	a.Revision = rev
	return a, nil
}
