package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"database/sql"

	"github.com/berth-dev/berth"
)

// PutTemplate creates or replaces template t.Name.
func (s *Store) PutTemplate(ctx context.Context, t berth.Template) error {
	if t.Name == "" {
		return s.errorf("put template: empty name")
	}
	_, err := s.pool().exec(ctx, `
		INSERT INTO templates (name, memory_mb, vcpus) VALUES (?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET memory_mb = excluded.memory_mb, vcpus = excluded.vcpus`,
		t.Name, t.MemoryMiB, t.VCPUs)
	if err != nil {
		return s.errorf("put template %q: %w", t.Name, err)
	}
	return nil
}

// Template returns template name or an error wrapping berth.ErrNotFound.
func (s *Store) Template(ctx context.Context, name string) (berth.Template, error) {
	t := berth.Template{Name: name}
	err := s.pool().queryRow(ctx, `SELECT memory_mb, vcpus FROM templates WHERE name = ?`, name).
		Scan(&t.MemoryMiB, &t.VCPUs)
	if errors.Is(err, sql.ErrNoRows) {
		return berth.Template{}, fmt.Errorf("template %q: %w", name, berth.ErrNotFound)
	}
	if err != nil {
		return berth.Template{}, s.errorf("template %q: %w", name, err)
	}
	return t, nil
}

// Templates returns every template ordered by name (bytewise).
func (s *Store) Templates(ctx context.Context) ([]berth.Template, error) {
	rows, err := s.pool().query(ctx, `SELECT name, memory_mb, vcpus FROM templates ORDER BY name`)
	if err != nil {
		return nil, s.errorf("templates: %w", err)
	}
	defer rows.Close()
	out := []berth.Template{}
	for rows.Next() {
		var t berth.Template
		if err := rows.Scan(&t.Name, &t.MemoryMiB, &t.VCPUs); err != nil {
			return nil, s.errorf("templates: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("templates: %w", err)
	}
	return out, nil
}
