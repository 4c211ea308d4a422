package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth"
)

// agentCredLock prefixes the lock name (Dialect.LockNameSQL) of an agent id's credentials:
// joins, revokes and heartbeats of one id take it, so a heartbeat is applied either wholly
// before a revoke of its agent or not at all (TRUST-1).
const agentCredLock = "agent-credentials/"

// adminRevokedSQL counts the admin revokes of an agent id: any makes the id banned.
const adminRevokedSQL = `SELECT COUNT(*) FROM agent_credentials WHERE agent_id = ? AND revoked_by = 'admin'`

// credentialCheckSQL answers, in one statement, the two things a heartbeat of an agent id
// under a credential hash needs (TRUST-1): how many admin revokes the id has (any bans it),
// and 1 when the hash is a live credential of that id, or is "" (the caller authenticated
// otherwise), else 0. Its arguments are credentialCheckArgs'.
const credentialCheckSQL = `SELECT
	(SELECT COUNT(*) FROM agent_credentials WHERE agent_id = ? AND revoked_by = 'admin'),
	CASE WHEN CAST(? AS TEXT) = '' OR EXISTS (SELECT 1 FROM agent_credentials
		WHERE hash = ? AND agent_id = ? AND revoked_at IS NULL) THEN 1 ELSE 0 END`

func credentialCheckArgs(agentID, hash string) []any {
	return []any{agentID, hash, hash, agentID}
}

// credentialVerdict turns credentialCheckSQL's answer into nil or an error wrapping
// berth.ErrRevoked.
func credentialVerdict(agentID string, adminRevokes, live int) error {
	switch {
	case adminRevokes > 0:
		return fmt.Errorf("agent %q: %w", agentID, berth.ErrRevoked)
	case live == 0:
		return fmt.Errorf("agent %q: the credential is not a live one of this agent: %w", agentID, berth.ErrRevoked)
	}
	return nil
}

// checkNotRevoked is checkCredential without a credential: the admin revokes only.
func (s *Store) checkNotRevoked(ctx context.Context, tx *Tx, agentID string) error {
	return s.checkCredential(ctx, tx, agentID, "")
}

// checkCredential takes the id's credential lock in tx and answers an error wrapping
// berth.ErrRevoked when an admin revoked the id, or when hash is not "" and is not a live
// credential of the id (revoked by a rejoin, or another id's): read after the lock, it sees
// every join and revoke committed before, and one still to come waits for tx.
func (s *Store) checkCredential(ctx context.Context, tx *Tx, agentID, hash string) error {
	if err := s.lockName(ctx, tx, agentCredLock+agentID, exclusive); err != nil {
		return s.errorf("agent %q: %w", agentID, err)
	}
	var admin, live int
	if err := tx.queryRow(ctx, credentialCheckSQL, credentialCheckArgs(agentID, hash)...).Scan(&admin, &live); err != nil {
		return s.errorf("agent %q: %w", agentID, err)
	}
	return credentialVerdict(agentID, admin, live)
}

// JoinAgent implements berth.AgentCredentialStore (TRUST-1): the new credential, and the
// id's other live ones revoked as "rejoin", in one transaction. An id whose latest credential
// an admin revoked is refused with berth.ErrRevoked.
func (s *Store) JoinAgent(ctx context.Context, c berth.AgentCredential) error {
	if c.AgentID == "" || c.Hash == "" {
		return s.errorf("join agent: agent id and hash are required")
	}
	return s.inTx(ctx, func(tx *Tx) error {
		// Joins and revokes of one id run one at a time: under READ COMMITTED, a join racing
		// a revoke could otherwise insert a credential the revoke's UPDATE never saw, and the
		// banned id would keep a live credential (storetest's AgentJoinsRace).
		// An admin revoke bans the id for good, whichever of its rows it landed on: judged by
		// any row, never by the "latest" one (concurrent joins share a created_at, and
		// created_at is read before commit, so no order of rows is the order of events).
		if err := s.checkNotRevoked(ctx, tx, c.AgentID); err != nil {
			return fmt.Errorf("join: %w", err)
		}
		if _, err := tx.exec(ctx, `UPDATE agent_credentials SET revoked_at = ?, revoked_by = 'rejoin'
			WHERE agent_id = ? AND revoked_at IS NULL`, ms(c.CreatedAt), c.AgentID); err != nil {
			return s.errorf("join agent %q: %w", c.AgentID, err)
		}
		if _, err := tx.exec(ctx, `INSERT INTO agent_credentials (hash, agent_id, created_at) VALUES (?, ?, ?)`,
			c.Hash, c.AgentID, ms(c.CreatedAt)); err != nil {
			return s.errorf("join agent %q: %w", c.AgentID, err)
		}
		return nil
	})
}

// AgentCredentialByHash implements berth.AgentCredentialStore.
func (s *Store) AgentCredentialByHash(ctx context.Context, hash string) (berth.AgentCredential, error) {
	c, err := scanAgentCredential(s.pool().queryRow(ctx,
		`SELECT hash, agent_id, created_at, revoked_at, revoked_by FROM agent_credentials WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return berth.AgentCredential{}, fmt.Errorf("agent credential: %w", berth.ErrNotFound)
	}
	if err != nil {
		return berth.AgentCredential{}, s.errorf("agent credential: %w", err)
	}
	return c, nil
}

// AgentCredentials implements berth.AgentCredentialStore.
func (s *Store) AgentCredentials(ctx context.Context) ([]berth.AgentCredential, error) {
	rows, err := s.pool().query(ctx, `SELECT hash, agent_id, created_at, revoked_at, revoked_by
		FROM agent_credentials ORDER BY agent_id, created_at, hash`)
	if err != nil {
		return nil, s.errorf("agent credentials: %w", err)
	}
	defer rows.Close()
	out := []berth.AgentCredential{}
	for rows.Next() {
		c, err := scanAgentCredential(rows)
		if err != nil {
			return nil, s.errorf("agent credentials: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("agent credentials: %w", err)
	}
	return out, nil
}

// RevokeAgent implements berth.AgentCredentialStore.
func (s *Store) RevokeAgent(ctx context.Context, agentID string, now time.Time) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx *Tx) error {
		if err := s.lockName(ctx, tx, agentCredLock+agentID, exclusive); err != nil {
			return s.errorf("revoke agent %q: %w", agentID, err)
		}
		var count int
		if err := tx.queryRow(ctx, `SELECT COUNT(*) FROM agent_credentials WHERE agent_id = ?`, agentID).Scan(&count); err != nil {
			return s.errorf("revoke agent %q: %w", agentID, err)
		}
		if count == 0 {
			return fmt.Errorf("agent %q never joined: %w", agentID, berth.ErrNotFound)
		}
		res, err := tx.exec(ctx, `UPDATE agent_credentials SET revoked_at = ?, revoked_by = 'admin'
			WHERE agent_id = ? AND revoked_at IS NULL`, ms(now), agentID)
		if err != nil {
			return s.errorf("revoke agent %q: %w", agentID, err)
		}
		m, err := res.RowsAffected()
		if err != nil {
			return s.errorf("revoke agent %q: %w", agentID, err)
		}
		n = int(m)
		// Its host takes no more placements from now on, on every replica (a drain, PLC-5),
		// rather than until it goes stale; an agent that never heartbeated has no row yet.
		err = s.setDrainTx(ctx, tx, agentID, true, RevokedDrainReason, "admin", now)
		if errors.Is(err, berth.ErrNotFound) {
			err = nil
		}
		return err
	})
	return n, err
}

// RevokedDrainReason is the drain reason an admin revoke leaves on its agent.
const RevokedDrainReason = "credential revoked"

func scanAgentCredential(r scanner) (berth.AgentCredential, error) {
	var c berth.AgentCredential
	var created int64
	var revoked sql.NullInt64
	if err := r.Scan(&c.Hash, &c.AgentID, &created, &revoked, &c.RevokedBy); err != nil {
		return c, err
	}
	c.CreatedAt, c.RevokedAt = fromMS(created), fromNullMS(revoked)
	return c, nil
}
