package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/berth-dev/berth/internal/inflight"
)

// joinRequest is the body of POST /v1/agents/join.
type joinRequest struct {
	AgentID string `json:"agent_id"`
}

// joinAgent is POST /v1/agents/join with the fleet's join (node) token (TRUST-1): body
// {"agent_id": "..."} (berth.CheckAgentID: 1–128 letters, digits, ".", "-", "_", ":"). It answers 201 {"agent_id", "credential", "created_at"}:
// credential is a new random 256-bit secret (64 hex characters) bound to agent_id, of which
// the store keeps only the SHA-256. A join for an id with a live credential replaces it (the
// old one is revoked: an agent restarted without its credential file comes back). Errors:
// 401 unauthorized without the join token, 400 invalid_request, 403 forbidden for an id an
// admin revoked.
func (s *Server) joinAgent(w http.ResponseWriter, r *http.Request) {
	if err := s.auth.node(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req joinRequest
	if err := httpjson.Decode(w, r, maxJSONBytes, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := berth.CheckAgentID(req.AgentID); err != nil {
		s.writeError(w, r, err)
		return
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	secret := hex.EncodeToString(b)
	c := berth.AgentCredential{AgentID: req.AgentID, Hash: HashKey(secret), CreatedAt: s.cfg.Clock()}
	release, err := s.joinSlot(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	err = s.store.JoinAgent(r.Context(), c)
	if errors.Is(err, berth.ErrRevoked) {
		s.writeError(w, r, berth.Errorf(berth.EForbidden, "agent %q was revoked by an admin; admit the host under a new agent id", req.AgentID))
		return
	}
	if err != nil {
		s.writeError(w, r, berth.Fault(err, "record agent credential"))
		return
	}
	s.log.Info("agent joined", "agent", req.AgentID)
	httpjson.WriteJSON(w, http.StatusCreated, map[string]any{"agent_id": req.AgentID, "credential": secret, "created_at": c.CreatedAt})
}

// joinSlot takes one of the Config.MaxJoins slots for a join, waiting at most
// Config.JoinWait (and no longer than ctx). A join that gets none is refused with 503
// unavailable, retryable, before it reaches the store: a short queue keeps every join that
// runs well inside its agent's deadline, where a long one let each wait out its deadline and
// be cancelled mid-transaction. Errors: unavailable, or ctx's.
func (s *Server) joinSlot(ctx context.Context) (release func(), err error) {
	release, err = s.joinSlots.Take(ctx, s.cfg.JoinWait)
	switch {
	case errors.Is(err, inflight.ErrNoSlot):
		e := berth.Errorf(berth.EUnavailable, "%d agents are joining through this replica at once, the most it runs (more would wait out their deadlines on the store); join again", s.cfg.MaxJoins)
		e.RetryAfter = time.Second
		return nil, e
	case err != nil:
		return nil, berth.Wrap(berth.EUnavailable, err, "the join ended while it waited for a slot")
	}
	return release, nil
}

// agentCredential resolves the request's bearer as a live agent credential (TRUST-1).
// Errors: 401 unauthorized for a missing, unknown or revoked credential (the join token
// itself is not a credential); unavailable if the store fails. Credentials are read from the
// store on every call, never cached, so a revoke holds at once on every replica. Heartbeats
// alone use heartbeatCredential, whose cache the store's own check inside the heartbeat
// covers.
func (s *Server) agentCredential(ctx context.Context, r *http.Request) (berth.AgentCredential, error) {
	secret := bearer(r)
	if secret == "" {
		return berth.AgentCredential{}, berth.Errorf(berth.EUnauthorized, "missing agent credential: join at POST /v1/agents/join and send Authorization: Bearer <credential>")
	}
	return s.credentialByHash(ctx, HashKey(secret))
}

// credentialByHash is agentCredential for a bearer already hashed (HashKey).
func (s *Server) credentialByHash(ctx context.Context, hash string) (berth.AgentCredential, error) {
	c, err := s.store.AgentCredentialByHash(ctx, hash)
	if errors.Is(err, berth.ErrNotFound) {
		return c, berth.Errorf(berth.EUnauthorized, "unknown agent credential (the node token is a join token only: POST /v1/agents/join)")
	}
	if err != nil {
		return c, berth.Fault(err, "agent credential lookup failed")
	}
	if !c.Live() {
		return c, berth.Errorf(berth.EUnauthorized, "agent credential revoked (%s); join again", c.RevokedBy)
	}
	return c, nil
}

// heartbeatCredential is agentCredential for POST /v1/agents/heartbeat, with the bearer's
// hash and whether the answer came from the cache: a credential this replica has read live
// before is answered from heartbeatCreds, with no store read (issue 16, goal 2: the read was a
// round trip of its own on every heartbeat). That is safe because the binding of a
// credential to its agent id never changes (credentials are never rebound or deleted) and the
// heartbeat's own transaction checks, under the id's credential lock, that the credential is
// still live (Store.RecordHeartbeat's credHash): a revoke, on any replica, holds at the next
// heartbeat as before. A credential is cached only after a read that found it live; unknown
// and revoked ones cost a store read and a 401 before the body is read.
func (s *Server) heartbeatCredential(ctx context.Context, r *http.Request) (c berth.AgentCredential, hash string, cached bool, err error) {
	secret := bearer(r)
	if secret == "" {
		_, err := s.agentCredential(ctx, r)
		return berth.AgentCredential{}, "", false, err
	}
	hash = HashKey(secret)
	if id, ok := s.heartbeatCreds.get(hash, s.cfg.Clock()); ok {
		return berth.AgentCredential{Hash: hash, AgentID: id}, hash, true, nil
	}
	c, err = s.credentialByHash(ctx, hash)
	if err == nil {
		s.heartbeatCreds.put(hash, c.AgentID, s.cfg.Clock())
	}
	return c, hash, false, err
}

// uncacheRevoked is for a heartbeat refused (err) before the store saw it, under a credential
// answered from the cache: the credential may have been revoked since it was cached, and then
// the answer is 401, as it would have been without the cache, and the credential leaves the
// cache. Otherwise it answers err.
func (s *Server) uncacheRevoked(ctx context.Context, hash string, cached bool, err error) error {
	if !cached {
		return err
	}
	if _, cerr := s.credentialByHash(ctx, hash); berth.ErrorCode(cerr) == berth.EUnauthorized {
		s.heartbeatCreds.forget(hash)
		return cerr
	}
	return err
}

// heartbeatCredTTL is how long a replica answers a heartbeat credential from its cache
// (heartbeatCreds) before reading it again. The binding it caches never changes, so this only
// bounds how long departed agents' entries stay; liveness is the store's check, not the cache's.
const heartbeatCredTTL = time.Hour

// sameAgent checks credential c names agentID: a credential of another agent is 403
// forbidden (TRUST-1).
func sameAgent(c berth.AgentCredential, agentID string) error {
	if c.AgentID != agentID {
		return berth.Errorf(berth.EForbidden, "this credential belongs to agent %q, not %q", c.AgentID, agentID)
	}
	return nil
}

// listAgentCredentials is GET /v1/agents/credentials (admin, TRUST-1): {"credentials": [
// {"agent_id", "created_at", "revoked_at"?, "revoked_by"?}]}, by agent id then creation time.
// Secrets are never stored, so never shown.
func (s *Server) listAgentCredentials(w http.ResponseWriter, r *http.Request, _ principal) error {
	cs, err := s.store.AgentCredentials(r.Context())
	if err != nil {
		return berth.Fault(err, "list agent credentials")
	}
	if cs == nil {
		cs = []berth.AgentCredential{} // an empty list is [], never null
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"credentials": cs})
	return nil
}

// revokeAgent is POST /v1/agents/{id}/revoke (admin, TRUST-1): the agent's live credentials
// are revoked, its calls get 401 from then on and its heartbeats stop counting — also one on
// its way while the revoke ran (it goes silent and leases take over) — its host is drained
// ("credential revoked": no replica places on it any more, and an undrain is 409), and it
// cannot join again under this id. Answers 200 {"agent_id", "revoked": n}; 404 not_found for
// an id that never joined.
func (s *Server) revokeAgent(w http.ResponseWriter, r *http.Request, p principal) error {
	id, err := agentIDParam(r)
	if err != nil {
		return err
	}
	n, err := s.store.RevokeAgent(r.Context(), id, s.cfg.Clock())
	if errors.Is(err, berth.ErrNotFound) {
		return berth.Errorf(berth.ENotFound, "agent %q never joined", id)
	}
	if err != nil {
		return berth.Fault(err, "revoke agent")
	}
	if a, err := s.store.Agent(r.Context(), id); err == nil {
		s.sched.observe(a) // drained by the revoke: this replica stops placing on it at once
	}
	s.log.Warn("agent credentials revoked", "agent", id, "revoked", n, "by", p.actor())
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"agent_id": id, "revoked": n})
	return nil
}
