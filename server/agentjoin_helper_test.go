package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// joinAs joins agentID at POST /v1/agents/join with the test join token ("node-token") and
// returns its credential (TRUST-1): what a test sends as the bearer of an agent's heartbeat
// or evacuation plan.
func joinAs(t *testing.T, baseURL, agentID string) string {
	t.Helper()
	code, _, body := postJoin(baseURL, agentID)
	var out struct{ Credential string }
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &out) != nil || out.Credential == "" {
		t.Fatalf("join %s: %d %s, want 201 with a credential", agentID, code, body)
	}
	return out.Credential
}

// postJoin posts a join for id with the test join token, bounded so that a join held up by
// the server fails the test instead of hanging it, and returns the status, headers and body
// (a transport error as status 0 and its text); it may run on any goroutine.
func postJoin(baseURL, id string) (int, http.Header, string) {
	req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/agents/join", strings.NewReader(`{"agent_id":"`+id+`"}`))
	req.Header.Set("Authorization", "Bearer node-token")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}
