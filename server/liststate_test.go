package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
)

// TestListSandboxesUnknownStateNamesStates: GET /v1/sandboxes?state=bogus is 400
// invalid_request and says which states the filter takes, every one of them (a new user's
// report: it said only `unknown state "bogus"`).
func TestListSandboxesUnknownStateNamesStates(t *testing.T) {
	h := newHarness(t, 0)
	code, body := call(t, h.srv.URL, http.MethodGet, "/v1/sandboxes?state=bogus", h.key, nil)
	if code != http.StatusBadRequest || !strings.Contains(body, berth.EInvalidRequest) || !strings.Contains(body, `unknown state \"bogus\": want one of pending, starting,`) {
		t.Fatalf("?state=bogus: %d %s; want 400 invalid_request listing the states", code, body)
	}
	for _, s := range berth.SandboxStates {
		if !strings.Contains(body, string(s)) {
			t.Errorf("?state=bogus: %s does not name state %s", body, s)
		}
	}
}
