package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth"
)

// PinVolume implements berth.VolumeStore (POOL-2): the first pin of a name wins.
func (s *Store) PinVolume(ctx context.Context, v berth.Volume, actor string, now time.Time) (berth.Volume, error) {
	if v.Tenant == "" || v.Name == "" || v.AgentID == "" {
		return v, s.errorf("pin volume: tenant, name and agent are required")
	}
	if v.CreatedAt.IsZero() {
		v.CreatedAt = now
	}
	var out berth.Volume
	err := s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.exec(ctx, `INSERT INTO volumes (tenant, name, agent_id, created_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (tenant, name) DO NOTHING`, v.Tenant, v.Name, v.AgentID, ms(v.CreatedAt))
		if err != nil {
			return s.errorf("pin volume %s/%s: %w", v.Tenant, v.Name, err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			if err := s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "volume/" + v.Tenant + "/" + v.Name,
				To: berth.EventPinned, Reason: "on agent/" + v.AgentID, Actor: actor}); err != nil {
				return err
			}
		}
		out, err = s.scanVolume(tx.queryRow(ctx, `SELECT tenant, name, agent_id, created_at FROM volumes
			WHERE tenant = ? AND name = ?`, v.Tenant, v.Name))
		return err
	})
	return out, err
}

// Volume implements berth.VolumeStore.
func (s *Store) Volume(ctx context.Context, tenant, name string) (berth.Volume, error) {
	v, err := s.scanVolume(s.pool().queryRow(ctx, `SELECT tenant, name, agent_id, created_at FROM volumes
		WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("volume %s/%s: %w", tenant, name, berth.ErrNotFound)
	}
	return v, err
}

func (s *Store) scanVolume(r scanner) (berth.Volume, error) {
	var v berth.Volume
	var created int64
	if err := r.Scan(&v.Tenant, &v.Name, &v.AgentID, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return v, err
		}
		return v, s.errorf("scan volume: %w", err)
	}
	v.CreatedAt = fromMS(created)
	return v, nil
}
