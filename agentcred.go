package berth

import (
	"context"
	"errors"
	"time"
)

// ErrRevoked is returned by JoinAgent for an agent id an admin revoked (TRUST-1): the id stays
// out until an operator admits the host under a new id.
var ErrRevoked = errors.New("agent id revoked by an admin")

// AgentCredential is one credential issued to an agent at POST /v1/agents/join (TRUST-1). Only
// the hex SHA-256 of its 256-bit secret is stored, like an API key's (API-1). RevokedBy is
// "rejoin" (a later join for the same id replaced it) or "admin" (berth agents revoke).
type AgentCredential struct {
	AgentID   string    `json:"agent_id"`
	Hash      string    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
}

// RevokedByAdmin is RevokedBy for a credential an admin revoked (berth agents revoke): the
// id then stays out (a join is refused with ErrRevoked).
const RevokedByAdmin = "admin"

// Live reports whether the credential is not revoked.
func (c AgentCredential) Live() bool { return c.RevokedAt.IsZero() }

// AgentCredentialStore keeps agent credentials (TRUST-1).
type AgentCredentialStore interface {
	// JoinAgent stores a new live credential for c.AgentID (c.Hash, c.CreatedAt) and revokes,
	// with RevokedBy "rejoin", every other live credential of that id, in one transaction.
	// An id whose latest credential an admin revoked gets an error wrapping ErrRevoked.
	JoinAgent(ctx context.Context, c AgentCredential) error
	// AgentCredentialByHash returns the credential with that hash (live or revoked), or an
	// error wrapping ErrNotFound.
	AgentCredentialByHash(ctx context.Context, hash string) (AgentCredential, error)
	// AgentCredentials lists every credential, by agent id then creation time.
	AgentCredentials(ctx context.Context) ([]AgentCredential, error)
	// RevokeAgent revokes (RevokedBy "admin") the id's live credentials and returns how many;
	// an id that never joined gives an error wrapping ErrNotFound. Revoking again is a no-op
	// returning 0.
	RevokeAgent(ctx context.Context, agentID string, now time.Time) (int, error)
}
