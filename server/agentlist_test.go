package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestListAgents_HeldCount: GET /v1/agents?held=count answers every agent, in id order, with
// its held list counted and not sent — read without any held list (noHeldLists), as the
// dashboard and `berth agents list` read it on every refresh; without held= every list is
// sent and counted; any other held= is a 400.
func TestListAgents_HeldCount(t *testing.T) {
	h := newHarness(t, 0)
	ctx := context.Background()
	for _, hb := range []berth.Heartbeat{
		{AgentID: "a2", Address: "http://127.0.0.1:1", Status: berth.AgentActive, MemoryMiBTotal: 4096, HeartbeatAt: time.Now(),
			Sandboxes: []berth.HeldSandbox{{ID: "sb-1", Measured: true}, {ID: "sb-2"}, {ID: "sb-3", Starting: true}}},
		{AgentID: "a1", Address: "http://127.0.0.1:1", Status: berth.AgentActive, MemoryMiBTotal: 4096, HeartbeatAt: time.Now()},
	} {
		_, err := h.st.ApplyHeartbeat(ctx, hb, time.Now())
		must(t, err)
	}
	list := func(query string) []berth.Agent {
		t.Helper()
		code, body := h.do(t, http.MethodGet, "/v1/agents"+query, "")
		var out struct{ Agents []berth.Agent }
		if code != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil {
			t.Fatalf("GET /v1/agents%s: %d %s", query, code, body)
		}
		return out.Agents
	}
	as := list("")
	if len(as) != 2 || as[1].AgentID != "a2" || len(as[1].Sandboxes) != 3 || as[1].HeldCount != 3 || as[0].HeldCount != 0 {
		t.Fatalf("GET /v1/agents: %+v; want a1 holding none, a2 listing and counting 3", as)
	}
	as = list("?held=count")
	if len(as) != 2 || as[0].AgentID != "a1" || as[1].AgentID != "a2" || as[1].HeldCount != 3 || len(as[1].Sandboxes) != 0 {
		t.Fatalf("GET /v1/agents?held=count: %+v; want a1, then a2 counting 3 and listing none", as)
	}
	code, body := h.do(t, http.MethodGet, "/v1/agents?held=all", "")
	if code != http.StatusBadRequest || !strings.Contains(body, berth.EInvalidRequest) {
		t.Fatalf("held=all: %d %s, want 400 invalid_request", code, body)
	}

	s := &Server{store: noHeldLists{Store: h.st, t: t}, cfg: h.s.cfg}
	if as, err := s.agentsHeld(ctx, "count"); err != nil || len(as) != 2 {
		t.Fatalf("agentsHeld(count) = %d agents, %v", len(as), err)
	}
}
