package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// joinAs joins agentID at POST /v1/agents/join with the test join token ("node-token") and
// returns its credential (TRUST-1): what a test sends as the bearer of an agent's heartbeat
// or evacuation plan.
func joinAs(t *testing.T, baseURL, agentID string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/agents/join", strings.NewReader(`{"agent_id":"`+agentID+`"}`))
	req.Header.Set("Authorization", "Bearer node-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("join %s: %v", agentID, err)
	}
	defer resp.Body.Close()
	var out struct{ Credential string }
	if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&out) != nil || out.Credential == "" {
		t.Fatalf("join %s: %d, want 201 with a credential", agentID, resp.StatusCode)
	}
	return out.Credential
}
