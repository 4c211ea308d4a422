package sqlstore

import (
	"context"
	"strings"

	"github.com/berth-dev/berth"
)

// Events returns the events matching f in the order they were written (oldest first, LIF-3).
// f.Entity matches exactly, or as a prefix when it ends in "/"; f.Since is inclusive. When
// more than f.Limit (0 means 1000) events match, the latest f.Limit are returned.
func (s *Store) Events(ctx context.Context, f berth.EventFilter) ([]berth.Event, error) {
	var where []string
	var args []any
	switch {
	case strings.HasSuffix(f.Entity, "/"):
		// A byte range instead of LIKE: LIKE is case-insensitive in SQLite and treats '_'
		// and '%' as wildcards. Under bytewise collation (SQLite's BINARY, the entity
		// column's COLLATE "C" in PostgreSQL) "kind/" ≤ e < "kind0" is exactly the entities
		// that start with "kind/" ('0' follows '/').
		upper := f.Entity[:len(f.Entity)-1] + "0"
		where = append(where, "entity >= ? AND entity < ?")
		args = append(args, f.Entity, upper)
	case f.Entity != "":
		where, args = append(where, "entity = ?"), append(args, f.Entity)
	}
	if !f.Since.IsZero() {
		where, args = append(where, "at >= ?"), append(args, ms(f.Since))
	}
	if !f.Until.IsZero() {
		where, args = append(where, "at < ?"), append(args, ms(f.Until))
	}
	if f.To != "" {
		where, args = append(where, "to_state = ?"), append(args, f.To)
	}
	q := `SELECT id, at, entity, from_state, to_state, reason, actor FROM events`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q = `SELECT * FROM (` + q + ` ORDER BY id DESC LIMIT ?) AS latest ORDER BY id`
	args = append(args, limitOr(f.Limit, defaultLimit))
	rows, err := s.pool().query(ctx, q, args...)
	if err != nil {
		return nil, s.errorf("events: %w", err)
	}
	defer rows.Close()
	out := []berth.Event{}
	for rows.Next() {
		var e berth.Event
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Entity, &e.From, &e.To, &e.Reason, &e.Actor); err != nil {
			return nil, s.errorf("events: %w", err)
		}
		e.At = fromMS(at)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("events: %w", err)
	}
	return out, nil
}
