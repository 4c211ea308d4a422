package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth"
)

// Templates lists the templates sandboxes can be created from (GET /v1/templates).
func (c *Client) Templates(ctx context.Context) ([]berth.Template, error) {
	var out struct {
		Templates []berth.Template `json:"templates"`
	}
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/templates", idempotent: true}, &out)
	return out.Templates, err
}

// Agents lists the agents with their latest heartbeat, every held sandbox included, and its
// age in LastSeenS (GET /v1/agents).
func (c *Client) Agents(ctx context.Context) ([]berth.Agent, error) {
	return c.agents(ctx, "/v1/agents")
}

// AgentCounts is Agents with each held list left out (Sandboxes empty) and counted in
// HeldCount (GET /v1/agents?held=count): at 10,000 hosts, a read of the agent table instead
// of half a million held rows.
func (c *Client) AgentCounts(ctx context.Context) ([]berth.Agent, error) {
	return c.agents(ctx, "/v1/agents?held=count")
}

func (c *Client) agents(ctx context.Context, path string) ([]berth.Agent, error) {
	var out struct {
		Agents []berth.Agent `json:"agents"`
	}
	err := c.call(ctx, request{method: http.MethodGet, path: path, idempotent: true}, &out)
	for i, a := range out.Agents {
		if a.HeldCount == 0 {
			// A server before held_count (it ignores ?held=) sends only the lists: count them.
			out.Agents[i].HeldCount = len(a.Sandboxes)
		}
	}
	return out.Agents, err
}

// drainBody is the body of drain and undrain.
type drainBody struct {
	Reason string `json:"reason,omitempty"`
}

// DrainAgent cordons an agent: no new placements, its sandboxes keep running (POST
// /v1/agents/{id}/drain with {"reason"}, 202; admin key). It is sent once, not retried.
func (c *Client) DrainAgent(ctx context.Context, id, reason string) error {
	r, err := jsonRequest(http.MethodPost, agentPath(id)+"/drain", drainBody{Reason: reason}, false)
	if err != nil {
		return err
	}
	return c.call(ctx, r, nil)
}

// DrainStatus reports whether an agent's drain is complete and, past its deadline, what
// blocks it (GET /v1/agents/{id}/drain; admin key; retried like every GET).
func (c *Client) DrainStatus(ctx context.Context, id string) (berth.DrainStatus, error) {
	var st berth.DrainStatus
	err := c.call(ctx, request{method: http.MethodGet, path: agentPath(id) + "/drain", idempotent: true}, &st)
	return st, err
}

// UndrainAgent reverses DrainAgent (POST /v1/agents/{id}/undrain with {}, 200; admin key).
// It is sent once, not retried.
func (c *Client) UndrainAgent(ctx context.Context, id string) error {
	r, err := jsonRequest(http.MethodPost, agentPath(id)+"/undrain", drainBody{}, false)
	if err != nil {
		return err
	}
	return c.call(ctx, r, nil)
}

// Events returns the recorded state transitions (GET /v1/events?entity=), of one entity
// ("sandbox/sb-1") or a kind when entity ends in "/" ("sandbox/"); "" returns all.
func (c *Client) Events(ctx context.Context, entity string) ([]berth.Event, error) {
	r := request{method: http.MethodGet, path: "/v1/events", idempotent: true}
	if entity != "" {
		r.query = url.Values{"entity": {entity}}
	}
	var out struct {
		Events []berth.Event `json:"events"`
	}
	err := c.call(ctx, r, &out)
	return out.Events, err
}

// Heartbeat posts an agent's heartbeat (POST /v1/agents/heartbeat, AGT-1); the client's key
// must be the agent's node token. It is sent once, not retried: the next heartbeat is the
// retry, and a stale one must not be replayed after a newer one.
func (c *Client) Heartbeat(ctx context.Context, hb berth.Heartbeat) error {
	_, err := c.HeartbeatAck(ctx, hb)
	return err
}

// HeartbeatAck is Heartbeat returning the server's answer (issue 16, goal 2): the seq whose
// held list it keeps (the base of the next delta), or Resync. A server of the previous release
// answers 204 without a body: the zero HeartbeatAck, so the agent keeps sending whole lists.
func (c *Client) HeartbeatAck(ctx context.Context, hb berth.Heartbeat) (berth.HeartbeatAck, error) {
	var ack berth.HeartbeatAck
	r, err := jsonRequest(http.MethodPost, "/v1/agents/heartbeat", hb, false)
	if err != nil {
		return ack, err
	}
	resp, err := c.do(ctx, r)
	if err != nil || len(resp.body) == 0 {
		return ack, err
	}
	return ack, decodeJSON(r, resp, &ack)
}

// CreateTenant creates a tenant (POST /v1/tenants {"name"}; admin key). It is sent once, not
// retried; an existing name is a conflict.
func (c *Client) CreateTenant(ctx context.Context, name string) (berth.Tenant, error) {
	body := struct {
		Name string `json:"name"`
	}{name}
	r, err := jsonRequest(http.MethodPost, "/v1/tenants", body, false)
	if err != nil {
		return berth.Tenant{}, err
	}
	var t berth.Tenant
	return t, c.call(ctx, r, &t)
}

// APIKeySecret is a newly minted API key. Key is the secret itself: the server keeps only
// its hash (API-1), so this answer is the only time it is ever shown.
type APIKeySecret struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	Role   string `json:"role"`
	Key    string `json:"key"`
}

// CreateAPIKey mints a key for tenant with role berth.RoleTenant or berth.RoleAdmin (POST
// /v1/tenants/{name}/keys {"role"}; admin key). It is sent once, not retried: a retry could
// mint a second secret.
func (c *Client) CreateAPIKey(ctx context.Context, tenant, role string) (APIKeySecret, error) {
	body := struct {
		Role string `json:"role"`
	}{role}
	r, err := jsonRequest(http.MethodPost, "/v1/tenants/"+url.PathEscape(tenant)+"/keys", body, false)
	if err != nil {
		return APIKeySecret{}, err
	}
	var k APIKeySecret
	return k, c.call(ctx, r, &k)
}

func agentPath(id string) string { return "/v1/agents/" + url.PathEscape(id) }

// QuotaUsage is a tenant's quota with what its live sandboxes use now (GET
// /v1/tenants/{name}/quota).
type QuotaUsage struct {
	Quota berth.Quota `json:"quota"`
	// Sandboxes counts the tenant's live sandboxes; MemoryMiB adds up their configured memory.
	Sandboxes int   `json:"sandboxes"`
	MemoryMiB int64 `json:"memory_mb"`
}

// Quota returns a tenant's quota and usage (GET /v1/tenants/{name}/quota; admin key; ADM-11).
// Zero limits mean no limit. Retried like every GET.
func (c *Client) Quota(ctx context.Context, tenant string) (QuotaUsage, error) {
	var q QuotaUsage
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/tenants/" + url.PathEscape(tenant) + "/quota", idempotent: true}, &q)
	return q, err
}

// SetQuota sets a tenant's quota (PUT /v1/tenants/{name}/quota; admin key; ADM-11). Zero
// limits mean no limit. It is sent once, not retried.
func (c *Client) SetQuota(ctx context.Context, q berth.Quota) error {
	r, err := jsonRequest(http.MethodPut, "/v1/tenants/"+url.PathEscape(q.Tenant)+"/quota", q, false)
	if err != nil {
		return err
	}
	return c.call(ctx, r, nil)
}

// Evacuate hands an agent's evacuation plan to the server (POST /v1/agents/{id}/evacuate;
// the key is the node token; SPOT-3) and returns what became of each sandbox. Not retried.
func (c *Client) Evacuate(ctx context.Context, agentID string, req berth.EvacuateRequest) ([]berth.EvacuateOutcome, error) {
	r, err := jsonRequest(http.MethodPost, agentPath(agentID)+"/evacuate", req, false)
	if err != nil {
		return nil, err
	}
	var out struct {
		Outcomes []berth.EvacuateOutcome `json:"outcomes"`
	}
	err = c.call(ctx, r, &out)
	return out.Outcomes, err
}
