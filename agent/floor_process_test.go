package agent_test

import (
	"net/http"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
)

// TestTinyCreateIsInvalidRequestOnTheRealRuntime: over its internal API, an agent on the real
// process runtime answers a create of 1 MiB — which an isolated runtime cannot start: its init
// dies before it is ready — 400 invalid_request, the request's fault, instead of the 503
// unavailable of a failing host that counted toward the host's quarantine (PLC-9); a create
// at berth.MinSandboxMiB starts.
func TestTinyCreateIsInvalidRequestOnTheRealRuntime(t *testing.T) {
	_, base := appAgent(t)
	code, body := postCreate(t, base, berth.AgentCreate{ID: "tiny", Template: "shell", MemoryMiB: 1, TTLMS: 60_000})
	if e := agent.ErrorOf(t, body); code != http.StatusBadRequest || e.Code != berth.EInvalidRequest {
		t.Fatalf("create of 1 MiB: %d %s; want 400 invalid_request", code, body)
	}
	code, body = postCreate(t, base, berth.AgentCreate{ID: "floor", Template: "shell", MemoryMiB: berth.MinSandboxMiB, TTLMS: 60_000})
	if code != http.StatusCreated {
		t.Fatalf("create at the floor: %d %s; want 201", code, body)
	}
	code, body = agent.Call(t, http.MethodDelete, base+"/internal/sandboxes/floor", nil, nil)
	if code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
}
