package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/store/sqlite"
)

// TestTextTheStoreCannotKeepIs400 (an attack found each, on PostgreSQL): a NUL or bytes that
// are not UTF-8 in a path segment or a query parameter, and a NUL in any string of a JSON
// body, reached the store and came back 500 (PostgreSQL refuses both) while SQLite stored or
// missed them. Each is 400 invalid_request on both stores; an app name no app can have is 404
// before anything is read or an Idempotency-Key claimed with it (a 4,000-byte one was a 500:
// the claim outgrew its index). Exec's stdin, never stored, may still carry a NUL.
func TestTextTheStoreCannotKeepIs400(t *testing.T) {
	rs := newReplicaSet(t, 1, nil)
	send := func(method, path, body string) (int, string) {
		t.Helper()
		return call(t, rs.https[0].URL, method, path, rs.key, strings.NewReader(body))
	}
	for _, seg := range []string{"%00", "a%00b", "%ff", "%c3%28"} {
		for _, c := range []struct{ method, path, body string }{
			{http.MethodGet, "/v1/sandboxes/" + seg, ""},
			{http.MethodDelete, "/v1/sandboxes/" + seg, ""},
			{http.MethodPost, "/v1/sandboxes/" + seg + "/exec", `{"cmd":["true"]}`},
			{http.MethodPut, "/v1/sandboxes/" + seg + "/files?path=/tmp/x", "x"},
			{http.MethodGet, "/v1/events?entity=sandbox/" + seg, ""},
			{http.MethodGet, "/v1/events?to=" + seg, ""},
			{http.MethodPost, "/v1/tenants/" + seg + "/keys", `{"role":"tenant"}`},
			{http.MethodPut, "/v1/tenants/" + seg + "/quota", `{"max_sandboxes":1}`},
		} {
			if code, got := send(c.method, c.path, c.body); code != http.StatusBadRequest || !strings.Contains(got, berth.EInvalidRequest) {
				t.Errorf("%s %s: %d %s; want 400 invalid_request", c.method, c.path, code, got)
			}
		}
		for _, c := range []struct{ method, path, body string }{
			{http.MethodGet, "/v1/apps/" + seg, ""},
			{http.MethodPost, "/v1/apps/" + seg + "/wake", ""},
			{http.MethodGet, "/apps/" + seg + "/", ""},
		} {
			if code, got := send(c.method, c.path, c.body); code >= 500 {
				t.Errorf("%s %s: %d %s; want a 4xx", c.method, c.path, code, got)
			}
		}
	}
	// A query Go cannot parse lost the pair silently: the filter vanished and every event was
	// listed (found by an attack).
	if code, got := send(http.MethodGet, "/v1/events?entity=agent/a;x=1", ""); code != http.StatusBadRequest {
		t.Errorf("a query that does not parse: %d %s; want 400", code, got)
	}
	// A parameter given twice was read first-value-wins: ?held=count&held=bogus answered 200,
	// the reverse 400 (found by an attack).
	for _, q := range []string{"/v1/agents?held=count&held=bogus", "/v1/agents?held=bogus&held=count", "/v1/events?entity=agent/&entity=sandbox/"} {
		if code, got := send(http.MethodGet, q, ""); code != http.StatusBadRequest || !strings.Contains(got, berth.EInvalidRequest) {
			t.Errorf("GET %s: %d %s; want 400 invalid_request", q, code, got)
		}
	}
	long := randomHex(2000) // incompressible: PostgreSQL compresses what an index keeps
	req, _ := http.NewRequest(http.MethodPost, rs.https[0].URL+"/v1/apps/"+long+"/deploy",
		strings.NewReader(`{"template":"python","command":["x"],"port":8080}`))
	req.Header.Set("Authorization", "Bearer "+rs.key)
	req.Header.Set(berth.HeaderIdempotencyKey, "k1")
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(got), berth.EAppNotFound) {
		t.Errorf("a keyed deploy of a 4,000-byte app name: %d %s; want 404 app_not_found", resp.StatusCode, got)
	}
	for _, body := range []string{
		`{"template":"\u0000"}`,
		`{"template":"python","metadata":{"k":"a\u0000"}}`,
		`{"template":"python","metadata":{"\u0000":"v"}}`,
	} {
		if code, got := send(http.MethodPost, "/v1/sandboxes", body); code != http.StatusBadRequest || !strings.Contains(got, berth.EInvalidRequest) {
			t.Errorf("create %s: %d %s; want 400 invalid_request", body, code, got)
		}
	}
	if code, got := send(http.MethodPost, "/v1/agents/a1/drain", `{"reason":"x\u0000"}`); code != http.StatusBadRequest {
		t.Errorf("a drain reason with a NUL: %d %s; want 400", code, got)
	}
	// Still working: the files API's path is a file name, which need not be UTF-8 (the
	// sandbox is unknown here: 404, not 400), and listings answer.
	if code, got := send(http.MethodGet, "/v1/sandboxes/sb-none/files?path=/tmp/%ff", ""); code != http.StatusNotFound {
		t.Errorf("a file name that is not UTF-8: %d %s; want 404 sandbox_not_found (the name is fine)", code, got)
	}
	for _, path := range []string{"/v1/sandboxes", "/v1/events?limit=10", "/v1/apps", "/v1/agents"} {
		if code, got := send(http.MethodGet, path, ""); code != http.StatusOK {
			t.Errorf("GET %s after the bad calls: %d %s", path, code, got)
		}
	}
}

// failingLoss fails the store's write of an evacuation's budgeted loss.
type failingLoss struct{ berth.Store }

func (f failingLoss) TransitionSandbox(ctx context.Context, id string, from []berth.SandboxState, to berth.SandboxState, reason, actor string, now time.Time) (bool, error) {
	if to == berth.SandboxLost {
		return false, errors.New("the disk is on fire")
	}
	return f.Store.TransitionSandbox(ctx, id, from, to, reason, actor, now)
}

// TestSPOT3_UnrecordedLossIsNotAnswered (found by an attack): an evacuation step the store
// failed to record was answered as done ("lost") while the store still said running, so the
// agent stopped a sandbox the fleet believes live. The answer is the state the store holds.
func TestSPOT3_UnrecordedLossIsNotAnswered(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, ":memory:")
	must(t, err)
	t.Cleanup(func() { st.Close() })
	cfg := DefaultConfig()
	cfg.NodeToken = "node-token"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(New(cfg, failingLoss{st}).Handler())
	t.Cleanup(srv.Close)
	cred := joinAs(t, srv.URL, "doomed")
	now := time.Now()
	_, err = st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "doomed", Address: "http://127.0.0.1:1", Status: berth.AgentActive,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096}, now)
	must(t, err)
	must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
	must(t, st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-db", Template: "python", Tenant: "acme", AgentID: "doomed",
		State: berth.SandboxRunning, MemoryMiB: 512, Stateful: true, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now))
	body, _ := json.Marshal(berth.EvacuateRequest{Deadline: now.Add(20 * time.Second), DeadlineInMS: 20000,
		Steps: []berth.EvacuateStep{{SandboxID: "sb-db", Action: "loss", Reason: "no time"}}})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/agents/doomed/evacuate", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	var out struct{ Outcomes []berth.EvacuateOutcome }
	must(t, json.NewDecoder(resp.Body).Decode(&out))
	if len(out.Outcomes) != 1 || out.Outcomes[0].State != berth.SandboxRunning || !strings.Contains(out.Outcomes[0].Reason, "did not record") {
		t.Fatalf("outcomes %+v; want the sandbox still running, the loss not recorded", out.Outcomes)
	}
}
