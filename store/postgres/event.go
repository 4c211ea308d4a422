package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/berth-dev/berth"
)

// Events returns the events matching f in the order they were written (oldest first, LIF-3).
// f.Entity matches exactly, or as a prefix when it ends in "/"; f.Since is inclusive. When
// more than f.Limit (0 means 1000) events match, the latest f.Limit are returned.
func (s *Store) Events(ctx context.Context, f berth.EventFilter) ([]berth.Event, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	switch {
	case strings.HasSuffix(f.Entity, "/"):
		// A byte range instead of LIKE ('_' and '%' are wildcards there): under the "C"
		// collation of the entity column, "kind/" ≤ e < "kind0" is exactly the entities that
		// start with "kind/" ('0' follows '/'), case-sensitively, as in store/sqlite.
		upper := f.Entity[:len(f.Entity)-1] + "0"
		where = append(where, `entity >= `+arg(f.Entity)+` COLLATE "C" AND entity < `+arg(upper)+` COLLATE "C"`)
	case f.Entity != "":
		where = append(where, "entity = "+arg(f.Entity))
	}
	if !f.Since.IsZero() {
		where = append(where, "at >= "+arg(ms(f.Since)))
	}
	if !f.Until.IsZero() {
		where = append(where, "at < "+arg(ms(f.Until)))
	}
	if f.To != "" {
		where = append(where, "to_state = "+arg(f.To))
	}
	q := `SELECT id, at, entity, from_state, to_state, reason, actor FROM events`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q = `SELECT * FROM (` + q + ` ORDER BY id DESC LIMIT ` + arg(limitOr(f.Limit, defaultLimit)) + `) AS latest ORDER BY id`
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("postgres: events: %w", err)
	}
	defer rows.Close()
	out := []berth.Event{}
	for rows.Next() {
		var e berth.Event
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Entity, &e.From, &e.To, &e.Reason, &e.Actor); err != nil {
			return nil, fmt.Errorf("postgres: events: %w", err)
		}
		e.At = fromMS(at)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: events: %w", err)
	}
	return out, nil
}
