package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// testQuota: a tenant's quota is a hard limit that CreateSandbox enforces in its own
// transaction; ended sandboxes stop counting; an unknown tenant cannot get one (ADM-11).
func testQuota(t *testing.T, s berth.Store) {
	ctx := t.Context()
	if _, err := s.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: T0}); err != nil {
		t.Fatal(err)
	}
	if q, err := s.Quota(ctx, "acme"); err != nil || q.MaxSandboxes != 0 || q.MaxMemoryMiB != 0 {
		t.Fatalf("no quota yet: %+v, %v; want unlimited", q, err)
	}
	if err := s.SetQuota(ctx, berth.Quota{Tenant: "nobody", MaxSandboxes: 1}, "test", T0); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("quota of an unknown tenant: %v", err)
	}
	if err := s.SetQuota(ctx, berth.Quota{Tenant: "acme", MaxSandboxes: 2, MaxMemoryMiB: 1536}, "admin", T0); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, sandbox("q1", "acme", "a1", berth.SandboxRunning), T0) // 512 MiB each
	mustCreate(t, s, sandbox("q2", "acme", "a1", berth.SandboxRunning), T0)
	if err := s.CreateSandbox(ctx, sandbox("q3", "acme", "a1", berth.SandboxRunning), "test", T0); !errors.Is(err, berth.ErrOverQuota) {
		t.Fatalf("third sandbox over a 2-sandbox quota: %v, want ErrOverQuota", err)
	}
	if _, err := s.Sandbox(ctx, "q3"); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("a refused create left a row: %v", err)
	}
	mustTransition(t, s, "q1", berth.SandboxStopped, "deleted", at(time.Second))
	if n, mem, err := s.TenantUsage(ctx, "acme"); err != nil || n != 1 || mem != 512 {
		t.Fatalf("usage after one ended: %d, %d, %v", n, mem, err)
	}
	big := sandbox("q4", "acme", "a1", berth.SandboxRunning)
	big.MemoryMiB = 1100 // 512 + 1100 > 1536
	if err := s.CreateSandbox(ctx, big, "test", T0); !errors.Is(err, berth.ErrOverQuota) {
		t.Fatalf("over the memory quota: %v", err)
	}
	mustCreate(t, s, sandbox("q5", "other", "a1", berth.SandboxRunning), T0) // another tenant: unlimited
	mustCreate(t, s, sandbox("q6", "acme", "a1", berth.SandboxRunning), T0)
	if q, err := s.Quota(ctx, "acme"); err != nil || q.MaxSandboxes != 2 || q.MaxMemoryMiB != 1536 {
		t.Fatalf("Quota: %+v, %v", q, err)
	}
}
