package postgres

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	_ "modernc.org/sqlite" // the SQLite side of the comparison
)

// column is what the two schemas must agree on for every column: its name, position and
// whether it may be NULL.
type column struct {
	Name    string
	NotNull bool
}

// schema is the tables (with their columns in order) and the secondary indexes of a database.
type schema struct {
	Tables  map[string][]column
	Indexes []string
}

// TestSchemaInStepWithSQLite pins that the PostgreSQL migrations keep the same tables,
// columns (names, order, nullability) and secondary indexes as store/sqlite's.
func TestSchemaInStepWithSQLite(t *testing.T) {
	pgFiles, _ := filepath.Glob("migrations/*.sql")
	liteFiles, _ := filepath.Glob("../sqlite/migrations/*.sql")
	base := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	if diff := cmp.Diff(base(liteFiles), base(pgFiles)); diff != "" || len(pgFiles) == 0 {
		t.Fatalf("migration files (-sqlite +postgres):\n%s", diff)
	}
	lite := sqliteSchema(t, liteFiles)
	pg := postgresSchema(t, openFresh(t))
	if diff := cmp.Diff(lite, pg); diff != "" {
		t.Errorf("schema (-sqlite +postgres):\n%s", diff)
	}
}

// sqliteSchema applies the Up sections of files to a memory database and reads its schema.
func sqliteSchema(t *testing.T, files []string) schema {
	t.Helper()
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatalf("sqlite: %v", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		_, up, _ := strings.Cut(string(b), "-- +goose Up")
		up, _, _ = strings.Cut(up, "-- +goose Down")
		if _, err := db.Exec(up); err != nil {
			t.Fatalf("sqlite: apply %s: %v", f, err)
		}
	}
	s := schema{Tables: map[string][]column{}}
	tables := queryStrings(t, db, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name`)
	for _, tbl := range tables {
		rows, err := db.Query(`SELECT name, "notnull" FROM pragma_table_info(?) ORDER BY cid`, tbl)
		if err != nil {
			t.Fatalf("sqlite: columns of %s: %v", tbl, err)
		}
		for rows.Next() {
			var c column
			if err := rows.Scan(&c.Name, &c.NotNull); err != nil {
				t.Fatalf("sqlite: columns of %s: %v", tbl, err)
			}
			s.Tables[tbl] = append(s.Tables[tbl], c)
		}
		rows.Close()
	}
	s.Indexes = queryStrings(t, db, `SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name`)
	return s
}

func queryStrings(t *testing.T, db *sql.DB, q string) []string {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatalf("sqlite: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatalf("sqlite: %v", err)
		}
		out = append(out, v)
	}
	return out
}

// postgresSchema reads the schema of a migrated store, leaving out goose's version table and
// the indexes behind primary keys and UNIQUE constraints (SQLite's are implicit).
func postgresSchema(t *testing.T, st *Store) schema {
	t.Helper()
	ctx := context.Background()
	s := schema{Tables: map[string][]column{}}
	rows, err := st.pool.Query(ctx, `
		SELECT table_name, column_name, is_nullable = 'NO' FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name <> 'goose_db_version'
		ORDER BY table_name, ordinal_position`)
	if err != nil {
		t.Fatalf("postgres: columns: %v", err)
	}
	for rows.Next() {
		var tbl string
		var c column
		if err := rows.Scan(&tbl, &c.Name, &c.NotNull); err != nil {
			t.Fatalf("postgres: columns: %v", err)
		}
		s.Tables[tbl] = append(s.Tables[tbl], c)
	}
	rows.Close()
	rows, err = st.pool.Query(ctx, `
		SELECT indexname FROM pg_indexes
		WHERE schemaname = current_schema() AND tablename <> 'goose_db_version'
		  AND indexname NOT IN (SELECT conname FROM pg_constraint)
		ORDER BY indexname COLLATE "C"`)
	if err != nil {
		t.Fatalf("postgres: indexes: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatalf("postgres: indexes: %v", err)
		}
		s.Indexes = append(s.Indexes, name)
	}
	return s
}
