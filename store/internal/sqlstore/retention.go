package sqlstore

import (
	"context"
	"time"

	"github.com/berth-dev/berth"
)

// PurgeEnded implements berth.Retainer (issue 15, point 5): in one transaction it deletes up
// to batch sandboxes that are terminal and ended before cutoff (a row that ended before
// migration 00010 counts from its latest event; one written terminal from its creation),
// with their events and any reservation left for them, then up to batch events, written
// before cutoff, of reservations the ledger no longer holds. A live sandbox, a held
// reservation and every other entity's events are never touched. batch < 1 means 500.
func (s *Store) PurgeEnded(ctx context.Context, cutoff time.Time, batch int) (berth.Purged, error) {
	if batch < 1 {
		batch = 500
	}
	var out berth.Purged
	err := s.inTx(ctx, func(tx *Tx) error {
		out = berth.Purged{}
		args := append([]any{ms(cutoff), ms(cutoff)}, terminalStates...)
		ids, err := s.queryIDs(ctx, tx, `SELECT id FROM sandboxes
			WHERE (ended_at < ? OR (ended_at IS NULL AND created_at < ?)) AND state IN `+inTerminal+`
			ORDER BY id LIMIT ?`, append(args, batch)...)
		if err != nil {
			return s.errorf("purge sandboxes: %w", err)
		}
		if len(ids) > 0 {
			entities := make([]any, len(ids))
			idArgs := make([]any, len(ids))
			for i, id := range ids {
				entities[i], idArgs[i] = "sandbox/"+id, id
			}
			in := "(" + placeholders(len(ids)) + ")"
			if out.Events, err = s.deleted(ctx, tx, `DELETE FROM events WHERE entity IN `+in, entities...); err != nil {
				return err
			}
			if out.Reservations, err = s.deleted(ctx, tx, `DELETE FROM reservations WHERE sandbox_id IN `+in, idArgs...); err != nil {
				return err
			}
			if out.Sandboxes, err = s.deleted(ctx, tx, `DELETE FROM sandboxes WHERE id IN `+in+` AND state IN `+inTerminal,
				append(idArgs, terminalStates...)...); err != nil {
				return err
			}
		}
		// "reservation/" ≤ entity < "reservation0" is exactly the reservation entities under
		// bytewise collation (see Events).
		n, err := s.deleted(ctx, tx, `DELETE FROM events WHERE id IN (
			SELECT e.id FROM events e
			WHERE e.entity >= 'reservation/' AND e.entity < 'reservation0' AND e.at < ?
				AND NOT EXISTS (SELECT 1 FROM reservations r WHERE e.entity = 'reservation/' || r.id)
			ORDER BY e.id LIMIT ?)`, ms(cutoff), batch)
		out.Events += n
		return err
	})
	if err != nil {
		return berth.Purged{}, err
	}
	return out, nil
}

// deleted runs a DELETE and returns how many rows went.
func (s *Store) deleted(ctx context.Context, tx *Tx, q string, args ...any) (int, error) {
	res, err := tx.exec(ctx, q, args...)
	if err != nil {
		return 0, s.errorf("purge: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.errorf("purge: %w", err)
	}
	return int(n), nil
}
