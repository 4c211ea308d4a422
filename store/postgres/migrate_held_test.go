package postgres

import (
	"context"
	"database/sql"
	"io/fs"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/pressly/goose/v3"

	"github.com/berth-dev/berth/internal/pgtest"
)

// TestMigration12_CopiesHeldLists (issue 16, goal 2): an agent's held list written into
// agents.sandboxes by a release before version 12 is in agent_held after the upgrade.
func TestMigration12_CopiesHeldLists(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Start(t).NewDatabase(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	sub, _ := fs.Sub(migrations, "migrations")
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 11); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO agents (id, status, last_seen, sandboxes) VALUES ('a1', 'active', 1,
		'[{"id":"sb-1","resident_mb":40,"measured":true},{"id":"sb-2","starting":true,"oom_kills":2}]'),
		('a2', 'active', 1, '{}')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	st, err := Open(ctx, url)
	if err != nil {
		t.Fatalf("migrate to 12: %v", err)
	}
	defer st.Close()
	a, err := st.Agent(ctx, "a1")
	if err != nil || len(a.Sandboxes) != 2 || a.Sandboxes[0].ResidentMiB != 40 || !a.Sandboxes[0].Measured ||
		!a.Sandboxes[1].Starting || a.Sandboxes[1].OOMKills != 2 {
		t.Fatalf("a1 after the migration: %+v, %v; want its two held sandboxes", a.Sandboxes, err)
	}
	if a, err := st.Agent(ctx, "a2"); err != nil || len(a.Sandboxes) != 0 {
		t.Fatalf("a2 (not a list) after the migration: %+v, %v; want none held", a.Sandboxes, err)
	}
}
