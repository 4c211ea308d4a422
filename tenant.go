package berth

import "time"

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
