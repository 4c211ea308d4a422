package storetest

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// ReopenKeepsData pins that data survives closing and reopening a store, and that migrating
// an up-to-date database is a no-op. open must open (and migrate) the same database on every
// call, failing t if it cannot, and close it when t ends.
func ReopenKeepsData(t *testing.T, open func(t *testing.T) berth.Store) {
	now := T0
	first := open(t)
	sb := berth.Sandbox{ID: "sb-1", Template: "python", Tenant: "acme", State: berth.SandboxRunning, CreatedAt: now}
	if err := first.CreateSandbox(t.Context(), sb, "test", now); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i := range 2 {
		s := open(t)
		got, err := s.Sandbox(t.Context(), "sb-1")
		if err != nil {
			t.Fatalf("reopen #%d: Sandbox: %v", i+1, err)
		}
		if diff := cmp.Diff(sb, got); diff != "" {
			t.Errorf("reopen #%d: Sandbox (-want +got):\n%s", i+1, diff)
		}
		evs, err := s.Events(t.Context(), berth.EventFilter{})
		if err != nil || len(evs) != 1 {
			t.Errorf("reopen #%d: %d events (%v), want 1", i+1, len(evs), err)
		}
	}
}
