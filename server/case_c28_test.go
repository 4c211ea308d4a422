package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/blackhole"
)

// TestCase_C28_CallsToAHungAgentEnd: the server's calls to an agent that accepts and never
// answers — a create, a delete, a pause, and a request to an app it hosts — each end with a
// retryable unavailable error by their own deadline, instead of holding the request until
// the client gives up. (The preemption-notice watchers' calls: preempt's C28 tests.)
func TestCase_C28_CallsToAHungAgentEnd(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.AgentTimeout, c.AppHeaderTimeout, c.PauseTimeout = time.Second, time.Second, time.Second
		c.MaxHostsPerCreate = 1
	})
	ctx := context.Background()
	_, err := h.st.ApplyHeartbeat(ctx, berth.Heartbeat{
		AgentID: "a1", Address: blackhole.Start(t), Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096,
		CPUTotal: 2, HeartbeatAt: h.clock(), Runtime: "gvisor", Checkpoint: true, // it can pause
	}, h.clock())
	must(t, err)
	// The client's own patience is far longer than any of the server's deadlines: a call
	// that ends by the client's timeout had none.
	hc := &http.Client{Timeout: 45 * time.Second}
	call := func(method, path, body string) (int, berth.ErrorDetail) {
		t.Helper()
		req, _ := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+h.key)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v (the server held the call until the client gave up: no deadline)", method, path, err)
		}
		defer resp.Body.Close()
		var eb berth.ErrorBody
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &eb)
		return resp.StatusCode, eb.Error
	}

	if code, e := call(http.MethodPost, "/v1/sandboxes", `{"template":"python"}`); code != http.StatusServiceUnavailable {
		t.Errorf("create on a hung agent: %d %+v; want 503", code, e)
	}

	now := h.clock()
	sb := berth.Sandbox{ID: "sb-hung", Template: "python", Tenant: "acme", AgentID: "a1", State: berth.SandboxRunning,
		MemoryMiB: 512, VCPUs: 1, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	must(t, h.st.CreateSandbox(ctx, sb, "test", now))
	if code, e := call(http.MethodPost, "/v1/sandboxes/sb-hung/pause", ""); code < 500 {
		t.Errorf("pause on a hung agent: %d %+v; want a 5xx", code, e)
	}

	app := berth.App{Name: "web", Tenant: "acme", Version: 1, ServingVersion: 1, Desired: berth.DesireRunning,
		State: berth.AppRunning, SandboxID: "sb-app", AgentID: "a1",
		Spec: berth.AppSpec{Template: "python", Command: []string{"python3", "-m", "http.server", "8080"}, Port: 8080}}
	if _, err := h.st.CreateApp(ctx, app, "test", now); err != nil {
		t.Fatal(err)
	}
	if code, e := call(http.MethodGet, "/apps/web/", ""); code != http.StatusServiceUnavailable || e.Code != berth.EUnavailable {
		t.Errorf("app request to a hung host: %d %+v; want 503 unavailable", code, e)
	}

	if code, e := call(http.MethodDelete, "/v1/sandboxes/sb-hung", ""); code != http.StatusNoContent && code < 500 {
		t.Errorf("delete on a hung agent: %d %+v", code, e)
	}
}
