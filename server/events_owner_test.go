package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth"
)

// TestReusedAppNameStartsFreshHistory: tenant A's app "leak" ends in error with a reason
// that carries a secret its command printed; A deletes it, and tenant B creates "leak" in
// the same millisecond. B's GET /v1/events?entity=app/leak shows only its own incarnation's
// history, never A's secret; A's history stays readable by an admin (issue 15, point 6).
func TestReusedAppNameStartsFreshHistory(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	h := newHarnessWith(t, func(c *Config) { c.Clock = func() time.Time { return now } })
	ctx := context.Background()
	keys := map[string]string{}
	for _, tenant := range []string{"a", "b"} {
		must(t, tenantErr(h.st.PutTenant(ctx, berth.Tenant{Name: tenant, CreatedAt: now})))
		keys[tenant] = NewKeySecret()
		must(t, h.st.PutAPIKey(ctx, berth.APIKey{ID: "k-" + tenant, Tenant: tenant, Role: berth.RoleTenant,
			Hash: HashKey(keys[tenant]), CreatedAt: now}))
	}
	spec := berth.AppSpec{Template: "python", MemoryMiB: 128, Command: []string{"python3", "app.py"}, Port: 8080}
	a, err := h.st.CreateApp(ctx, berth.App{Name: "leak", Tenant: "a", Version: 1, Desired: berth.DesireRunning,
		State: berth.AppDeploying, Spec: spec}, "tenant/a", now)
	must(t, err)
	a.State, a.Reason = berth.AppError, "version 1 never served: output tail: DB_PASSWORD=hunter2-secret"
	a, err = h.st.UpdateApp(ctx, a, a.Reason, "reconciler", now)
	must(t, err)
	must(t, h.st.DeleteApp(ctx, "leak", a.Revision, "tenant/a", now))
	b, err := h.st.CreateApp(ctx, berth.App{Name: "leak", Tenant: "b", Version: 1, Desired: berth.DesireRunning,
		State: berth.AppDeploying, Spec: spec}, "tenant/b", now) // the same millisecond: the hardest case
	must(t, err)
	b.Reason = "deploy of version 1"
	_, err = h.st.UpdateApp(ctx, b, b.Reason, "tenant/b", now.Add(time.Second))
	must(t, err)

	read := func(key string) (int, []berth.Event, string) {
		req, _ := http.NewRequest(http.MethodGet, h.srv.URL+"/v1/events?entity=app/leak", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		defer resp.Body.Close()
		var body struct{ Events []berth.Event }
		raw := new(strings.Builder)
		must(t, json.NewDecoder(resp.Body).Decode(&body))
		for _, e := range body.Events {
			raw.WriteString(e.From + ">" + e.To + " " + e.Reason + " by " + e.Actor + "\n")
		}
		return resp.StatusCode, body.Events, raw.String()
	}
	code, evs, raw := read(keys["b"])
	if code != http.StatusOK {
		t.Fatalf("B reads its app's events: %d", code)
	}
	if strings.Contains(raw, "hunter2") || strings.Contains(raw, "tenant/a") {
		t.Fatalf("B reads A's history of the name:\n%s", raw)
	}
	if len(evs) == 0 || evs[0].From != "" || evs[0].Actor != "tenant/b" {
		t.Fatalf("B's history does not start with its own create:\n%s", raw)
	}
	if code, _, _ := read(keys["a"]); code != http.StatusNotFound {
		t.Fatalf("A reads the events of an app it no longer owns: %d", code)
	}
	if _, _, raw := read(h.key); !strings.Contains(raw, "hunter2") || !strings.Contains(raw, "tenant/b") {
		t.Fatalf("an admin reads the whole history of the name; got:\n%s", raw)
	}
}

// TestAppReasonBoundsCommandOutput: a start that fails with the command's output (service_exited
// carries its output tail) leaves a reason, and an event, of at most ReasonExcerptBytes of it
// (issue 15, point 6; docs/API.md).
func TestAppReasonBoundsCommandOutput(t *testing.T) {
	h := newHarness(t, time.Second)
	ctx := context.Background()
	spec := berth.AppSpec{Template: "python", MemoryMiB: 128, Command: []string{"python3", "app.py"}, Port: 8080}
	a, err := h.st.CreateApp(ctx, berth.App{Name: "chatty", Tenant: "acme", Version: 1, Desired: berth.DesireRunning,
		State: berth.AppDeploying, Spec: spec}, "tenant/acme", time.Now())
	must(t, err)
	output := strings.Repeat("é secret line\n", 1000) // 15 kB, multi-byte runes
	h.s.startFailed(ctx, a, true, berth.Errorf(berth.EServiceExited, "the service exited with code 1; output tail:\n%s", output))
	got := h.app(t, "chatty")
	if len(got.Reason) > 600 || !strings.Contains(got.Reason, "…(cut)") || !utf8.ValidString(got.Reason) {
		t.Fatalf("reason is %d bytes (valid UTF-8: %v): %.80q…", len(got.Reason), utf8.ValidString(got.Reason), got.Reason)
	}
	evs, err := h.st.Events(ctx, berth.EventFilter{Entity: "app/chatty"})
	must(t, err)
	for _, e := range evs {
		if len(e.Reason) > 600 {
			t.Fatalf("event %s>%s carries %d bytes of reason", e.From, e.To, len(e.Reason))
		}
	}
}

// TestEventActorNamesTheKeysRole (LIF-3): an event caused through the API names who caused it
// — an admin key's drain and delete are "admin/<tenant>", a tenant key's create and delete
// "tenant/<tenant>" — so an operator's action is never read as the tenant's own.
func TestEventActorNamesTheKeysRole(t *testing.T) {
	h := newHarness(t, 0)
	ctx := context.Background()
	tenantKey := NewKeySecret()
	must(t, h.st.PutAPIKey(ctx, berth.APIKey{ID: "k-t", Tenant: "acme", Role: berth.RoleTenant, Hash: HashKey(tenantKey), CreatedAt: time.Now()}))
	agent := newFakeAgent(t, "")
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	call := func(key, method, path, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
	code, sb, e := h.create(t) // the harness's key is acme's admin key
	if code != http.StatusCreated {
		t.Fatalf("create: %d %+v", code, e)
	}
	call(h.key, http.MethodDelete, "/v1/sandboxes/"+sb.ID, "")
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/sandboxes", strings.NewReader(`{"template":"python"}`))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	var own berth.Sandbox
	must(t, json.NewDecoder(resp.Body).Decode(&own))
	resp.Body.Close()
	call(tenantKey, http.MethodDelete, "/v1/sandboxes/"+own.ID, "")
	call(h.key, http.MethodPost, "/v1/agents/a1/drain", `{"reason":"kernel upgrade"}`)

	actors := func(entity string) map[string]string { // to → actor
		evs, err := h.st.Events(ctx, berth.EventFilter{Entity: entity})
		must(t, err)
		m := map[string]string{}
		for _, e := range evs {
			m[e.To] = e.Actor
		}
		return m
	}
	for _, c := range []struct{ entity, to, want string }{
		{"sandbox/" + sb.ID, string(berth.SandboxStarting), "admin/acme"},
		{"sandbox/" + sb.ID, string(berth.SandboxStopping), "admin/acme"},
		{"sandbox/" + own.ID, string(berth.SandboxStarting), "tenant/acme"},
		{"sandbox/" + own.ID, string(berth.SandboxStopping), "tenant/acme"},
		{"agent/a1", string(berth.AgentDraining), "admin/acme"},
	} {
		if got := actors(c.entity)[c.to]; got != c.want {
			t.Errorf("%s → %s: actor %q, want %q (all: %v)", c.entity, c.to, got, c.want, actors(c.entity))
		}
	}
}
