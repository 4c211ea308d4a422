package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-dev/berth"
)

// PinVolume implements berth.VolumeStore (POOL-2): the first pin of a name wins, across
// replicas (the primary key decides).
func (s *Store) PinVolume(ctx context.Context, v berth.Volume, actor string, now time.Time) (berth.Volume, error) {
	if v.Tenant == "" || v.Name == "" || v.AgentID == "" {
		return v, fmt.Errorf("postgres: pin volume: tenant, name and agent are required")
	}
	if v.CreatedAt.IsZero() {
		v.CreatedAt = now
	}
	var out berth.Volume
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO volumes (tenant, name, agent_id, created_at) VALUES ($1, $2, $3, $4)
			ON CONFLICT (tenant, name) DO NOTHING`, v.Tenant, v.Name, v.AgentID, ms(v.CreatedAt))
		if err != nil {
			return fmt.Errorf("postgres: pin volume %s/%s: %w", v.Tenant, v.Name, err)
		}
		if tag.RowsAffected() == 1 {
			if err := insertEvent(ctx, tx, berth.Event{At: now, Entity: "volume/" + v.Tenant + "/" + v.Name,
				To: "pinned", Reason: "on agent/" + v.AgentID, Actor: actor}); err != nil {
				return err
			}
		}
		out, err = scanVolume(tx.QueryRow(ctx, `SELECT tenant, name, agent_id, created_at FROM volumes
			WHERE tenant = $1 AND name = $2`, v.Tenant, v.Name))
		return err
	})
	return out, err
}

// Volume implements berth.VolumeStore.
func (s *Store) Volume(ctx context.Context, tenant, name string) (berth.Volume, error) {
	v, err := scanVolume(s.pool.QueryRow(ctx, `SELECT tenant, name, agent_id, created_at FROM volumes
		WHERE tenant = $1 AND name = $2`, tenant, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return v, fmt.Errorf("volume %s/%s: %w", tenant, name, berth.ErrNotFound)
	}
	return v, err
}

func scanVolume(r pgx.Row) (berth.Volume, error) {
	var v berth.Volume
	var created int64
	if err := r.Scan(&v.Tenant, &v.Name, &v.AgentID, &created); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return v, err
		}
		return v, fmt.Errorf("postgres: scan volume: %w", err)
	}
	v.CreatedAt = fromMS(created)
	return v, nil
}
