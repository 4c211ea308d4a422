package client

import (
	"context"
	"net/http"

	"github.com/berth-dev/berth"
)

// JoinAgent joins an agent (POST /v1/agents/join {"agent_id"}; the client's key is the
// fleet's join token, TRUST-1) and returns the credential bound to agentID: a 64-hex-character
// secret the agent then sends as its key on heartbeats and evacuation plans. A join revokes
// the id's earlier credential. Errors: unauthorized (wrong join token), forbidden (an admin
// revoked the id). Not retried: the caller joins again on its next round.
func (c *Client) JoinAgent(ctx context.Context, agentID string) (string, error) {
	body := struct {
		AgentID string `json:"agent_id"`
	}{agentID}
	r, err := jsonRequest(http.MethodPost, "/v1/agents/join", body, false)
	if err != nil {
		return "", err
	}
	var out struct {
		Credential string `json:"credential"`
	}
	err = c.call(ctx, r, &out)
	return out.Credential, err
}

// AgentCredentials lists agent credentials (GET /v1/agents/credentials; admin key, TRUST-1),
// never their secrets.
func (c *Client) AgentCredentials(ctx context.Context) ([]berth.AgentCredential, error) {
	var out struct {
		Credentials []berth.AgentCredential `json:"credentials"`
	}
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/agents/credentials", idempotent: true}, &out)
	return out.Credentials, err
}

// RevokeAgent revokes an agent's credentials (POST /v1/agents/{id}/revoke; admin key,
// TRUST-1) and returns how many were live. Errors: not_found for an id that never joined.
// Revoking is idempotent, so it is retried.
func (c *Client) RevokeAgent(ctx context.Context, agentID string) (int, error) {
	var out struct {
		Revoked int `json:"revoked"`
	}
	err := c.call(ctx, request{method: http.MethodPost, path: agentPath(agentID) + "/revoke", idempotent: true}, &out)
	return out.Revoked, err
}
