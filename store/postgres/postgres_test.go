package postgres

import (
	"context"
	"io/fs"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// openURL opens the store at url and closes it when t ends.
func openURL(t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(t.Context(), url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// openFresh opens a store on a new empty database of the shared test cluster.
func openFresh(t *testing.T) *Store {
	t.Helper()
	return openURL(t, pgtest.Start(t).NewDatabase(t))
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) berth.Store { return openFresh(t) })
}

// TestReopenKeepsData pins that data survives reopening and that migrating an up-to-date
// database is a no-op.
func TestReopenKeepsData(t *testing.T) {
	url := pgtest.Start(t).NewDatabase(t)
	storetest.ReopenKeepsData(t, func(t *testing.T) berth.Store { return openURL(t, url) })
}

// TestOpenConcurrentMigrations pins that replicas opening one empty database at once all
// succeed: the advisory lock makes one migrate and the others find nothing to do.
func TestOpenConcurrentMigrations(t *testing.T) {
	url := pgtest.Start(t).NewDatabase(t)
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() {
			s, err := Open(context.WithoutCancel(t.Context()), url)
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Open: %v", err)
		}
	}
	s := openURL(t, url)
	var versions int
	if err := s.pool.QueryRow(t.Context(), `SELECT count(*) FROM goose_db_version WHERE version_id > 0`).Scan(&versions); err != nil {
		t.Fatalf("goose_db_version: %v", err)
	}
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if versions != len(files) {
		t.Errorf("%d applied migrations recorded, want %d (each once)", versions, len(files))
	}
}

// TestOpenFails pins that Open reports a bad URL or an unreachable server as an error.
func TestOpenFails(t *testing.T) {
	for _, tc := range []struct{ name, url string }{
		{"unparsable", "postgres://127.0.0.1:99999/x"},
		{"nobody listening", "postgres://postgres@127.0.0.1:1/x?sslmode=disable"},
	} {
		if s, err := Open(t.Context(), tc.url); err == nil {
			s.Close()
			t.Errorf("%s: Open(%q) = nil error", tc.name, tc.url)
		}
	}
}

// TestUnheldAfterOldReplica: a held list a replica of the previous release left behind is
// not judged (AGT-6, the same boot; storetest.UnheldAfterOldReplica).
func TestUnheldAfterOldReplica(t *testing.T) {
	s := openFresh(t)
	storetest.UnheldAfterOldReplica(t, s, func(q string) error {
		_, err := s.pool.Exec(t.Context(), q)
		return err
	})
}
