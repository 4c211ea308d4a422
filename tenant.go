package berth

import (
	"fmt"
	"time"
)

// Roles an API key may carry.
const (
	RoleAdmin  = "admin"  // every tenant's sandboxes, agents drain/undrain, tenants and keys
	RoleTenant = "tenant" // its own tenant's sandboxes only
)

// Tenant is a customer of the platform; sandboxes belong to exactly one.
type Tenant struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// APIKey is a stored key: only the SHA-256 hash of the secret is kept (API-1).
type APIKey struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Role      string    `json:"role"`
	Hash      string    `json:"-"` // hex SHA-256 of the secret
	CreatedAt time.Time `json:"created_at"`
}

// Quota is a tenant's hard limits (ADM-11): live sandboxes and their configured memory in
// MiB. Zero means no limit. A quota says nothing about whether a host has room.
type Quota struct {
	Tenant       string `json:"tenant"`
	MaxSandboxes int    `json:"max_sandboxes"`
	MaxMemoryMiB int64  `json:"max_memory_mb"`
}

// Allows reports whether a tenant using count sandboxes and memMiB may add one of addMiB.
func (q Quota) Allows(count int, memMiB, addMiB int64) bool {
	// addMiB > Max−memMiB rather than memMiB+addMiB > Max: the sum can overflow int64 and
	// admit (found by an attack: a create of MaxInt64 MiB under a 1000 MiB quota).
	return (q.MaxSandboxes <= 0 || count < q.MaxSandboxes) && (q.MaxMemoryMiB <= 0 || addMiB <= q.MaxMemoryMiB-memMiB)
}

// Check returns a *QuotaRefusal (it wraps ErrOverQuota) when a tenant using count sandboxes
// and memMiB may not add one of addMiB (ADM-11); stores call it inside the create's
// transaction.
func (q Quota) Check(count int, memMiB, addMiB int64) error {
	if q.Allows(count, memMiB, addMiB) {
		return nil
	}
	return &QuotaRefusal{Quota: q, Sandboxes: count, MemoryMiB: memMiB, AskedMiB: addMiB}
}

// QuotaRefusal is a tenant's quota (ADM-11) refusing a sandbox of AskedMiB configured MiB:
// the tenant has Sandboxes live sandboxes of MemoryMiB configured MiB in all. Its message is
// the one the tenant_over_quota answer carries, so it says what was asked as well as what the
// quota allows; it wraps ErrOverQuota.
type QuotaRefusal struct {
	Quota
	Sandboxes int
	MemoryMiB int64
	AskedMiB  int64
}

// Error says what was asked, what the tenant uses and its limits, e.g. "tenant acme asks for
// a 512 MiB sandbox, over its quota: it uses 0 of 1 sandboxes and 0 of 300 MiB".
func (e *QuotaRefusal) Error() string {
	return fmt.Sprintf("tenant %s asks for a %d MiB sandbox, over its quota: it uses %s and %s",
		e.Tenant, e.AskedMiB, usedOf(int64(e.Sandboxes), int64(e.MaxSandboxes), "sandboxes"),
		usedOf(e.MemoryMiB, e.MaxMemoryMiB, "MiB"))
}

// Unwrap returns ErrOverQuota.
func (e *QuotaRefusal) Unwrap() error { return ErrOverQuota }

// usedOf words a use against a limit that 0 (or less) lifts: "0 of 300 MiB", "2 MiB (no limit)".
func usedOf(used, limit int64, unit string) string {
	if limit <= 0 {
		return fmt.Sprintf("%d %s (no limit)", used, unit)
	}
	return fmt.Sprintf("%d of %d %s", used, limit, unit)
}
