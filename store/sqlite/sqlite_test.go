package sqlite

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/store/storetest"
)

// openAt opens dsn and closes the store when t ends.
func openAt(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("Open(%q): %v", dsn, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformanceFile(t *testing.T) {
	storetest.Run(t, func(t *testing.T) berth.Store {
		return openAt(t, filepath.Join(t.TempDir(), "berth.db"))
	})
}

func TestConformanceMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) berth.Store {
		return openAt(t, ":memory:")
	})
}

// TestReopenKeepsData pins that data survives a restart and that migrating an up-to-date
// database is a no-op.
func TestReopenKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	now := storetest.T0
	first, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	sb := berth.Sandbox{ID: "sb-1", Template: "python", Tenant: "acme", State: berth.SandboxRunning, CreatedAt: now}
	if err := first.CreateSandbox(t.Context(), sb, "test", now); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i := range 2 {
		s := openAt(t, path)
		got, err := s.Sandbox(t.Context(), "sb-1")
		if err != nil {
			t.Fatalf("reopen #%d: Sandbox: %v", i+1, err)
		}
		if diff := cmp.Diff(sb, got); diff != "" {
			t.Errorf("reopen #%d: Sandbox (-want +got):\n%s", i+1, diff)
		}
		if n := len(mustEvents(t, s)); n != 1 {
			t.Errorf("reopen #%d: %d events, want 1", i+1, n)
		}
	}
}

// TestMemoryStoresArePrivate pins that two ":memory:" stores do not share a database.
func TestMemoryStoresArePrivate(t *testing.T) {
	a, b := openAt(t, ":memory:"), openAt(t, ":memory:")
	if err := a.PutTemplate(t.Context(), berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}); err != nil {
		t.Fatalf("PutTemplate: %v", err)
	}
	if _, err := b.Template(t.Context(), "python"); err == nil {
		t.Errorf("second memory store sees the first one's template")
	}
}

// TestFileIsWAL pins the journal mode of a file database.
func TestFileIsWAL(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "berth.db"))
	var mode string
	if err := s.db.QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatalf("journal_mode: %v", err)
	}
	if mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
	var fk int
	if err := s.db.QueryRowContext(t.Context(), "PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys = %d, %v; want 1", fk, err)
	}
}

// TestTerminalStatesMatchDomain keeps the SQL list of terminal states in step with
// berth.SandboxState.Terminal.
func TestTerminalStatesMatchDomain(t *testing.T) {
	var want []any
	for _, st := range berth.SandboxStates {
		if st.Terminal() {
			want = append(want, string(st))
		}
	}
	if diff := cmp.Diff(want, terminalStates); diff != "" {
		t.Errorf("terminalStates (-want +got):\n%s", diff)
	}
}

// TestOpenRejectsQueryInPath pins that a '?' in a path cannot smuggle driver parameters.
func TestOpenRejectsQueryInPath(t *testing.T) {
	if s, err := Open(t.Context(), filepath.Join(t.TempDir(), "x.db?_txlock=deferred")); err == nil {
		s.Close()
		t.Errorf("Open accepted a path with '?'")
	}
}

func mustEvents(t *testing.T, s *Store) []berth.Event {
	t.Helper()
	evs, err := s.Events(t.Context(), berth.EventFilter{Since: time.Time{}})
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	return evs
}
