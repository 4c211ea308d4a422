package sqlite

import "testing"

// TestPingFailsWhenStoreCannotWrite pins that Ping probes a write (issue 15: /readyz fails
// when the store cannot write): a database that still answers reads but refuses writes
// (PRAGMA query_only on the memory store's one connection) fails Ping.
func TestPingFailsWhenStoreCannotWrite(t *testing.T) {
	s := openAt(t, ":memory:")
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping of a writable store: %v", err)
	}
	if _, err := s.db.ExecContext(t.Context(), "PRAGMA query_only = ON"); err != nil {
		t.Fatalf("query_only: %v", err)
	}
	t.Cleanup(func() { _, _ = s.db.Exec("PRAGMA query_only = OFF") })
	var one int
	if err := s.db.QueryRowContext(t.Context(), "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("reads must still work: %v", err)
	}
	if err := s.Ping(t.Context()); err == nil {
		t.Fatalf("Ping of a store that refuses writes: err = nil")
	}
}
