package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/noop"
	"github.com/berth-dev/berth/server"
	"github.com/berth-dev/berth/store/sqlite"
)

// TestTRUST1_AgentCredentialBindsItsID: two real agents (noop runtime, real HTTP on
// 127.0.0.1, a real server on SQLite) join with the fleet's join token and heartbeat with
// their own credentials. Agent A's credential cannot heartbeat as B, report B's sandbox
// ended, evacuate B (403 forbidden) or announce a new id; the join token itself is no
// heartbeat credential (401); creates land only on A and B; after an admin revoke, A's
// credential gets 401 and A cannot rejoin under its id (403).
func TestTRUST1_AgentCredentialBindsItsID(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now()
	admin := server.NewKeySecret()
	_, putErr := st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: now})
	for _, err := range []error{
		st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 256, VCPUs: 1}),
		putErr,
		st.PutAPIKey(ctx, berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleAdmin, Hash: server.HashKey(admin), CreatedAt: now}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := server.DefaultConfig()
	cfg.NodeToken, cfg.Logger, cfg.CacheTTL = "node-token", log, time.Millisecond
	srv := httptest.NewServer(server.New(cfg, st).Handler())
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	start := func(id string) *agent.Agent {
		acfg := agent.DefaultConfig()
		acfg.ID, acfg.Admission, acfg.MemoryMiB, acfg.HeadroomMiB = id, berth.AdmissionCommitted, 4096, 0
		acfg.HeartbeatInterval, acfg.MeasureInterval = 50*time.Millisecond, 50*time.Millisecond
		acfg.ServerURL, acfg.NodeToken, acfg.Logger = srv.URL, "node-token", log
		acfg.CredentialFile = filepath.Join(dir, id, "agent-credential")
		a, err := agent.New(acfg, &noop.Runtime{})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-done })
		return a
	}
	start("a")
	start("b")
	cred := func(id string) string {
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			if _, err := st.Agent(ctx, id); err == nil {
				if b, err := os.ReadFile(filepath.Join(dir, id, "agent-credential")); err == nil {
					return strings.TrimSpace(string(b))
				}
			}
			time.Sleep(20 * time.Millisecond) // real: the agent joins and heartbeats over loopback HTTP
		}
		t.Fatalf("agent %s never joined and heartbeated", id)
		return ""
	}
	credA, _ := cred("a"), cred("b")

	call := func(path, key string, body any) (int, string) {
		t.Helper()
		code, eb, _ := postAs(t, srv.URL+path, key, body)
		return code, eb.Error.Code
	}
	fake := func(id string) berth.Heartbeat {
		return berth.Heartbeat{AgentID: id, Address: "http://127.0.0.1:1", Status: berth.AgentActive, IntakeOpen: true,
			MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 1_000_000, MemoryMiBAdmittable: 1_000_000, CPUTotal: 64,
			BootID: "evil"}
	}
	ended := fake("b")
	ended.Ended = []berth.EndedSandbox{{ID: "sb-of-b", State: berth.SandboxFailed, Reason: "forged"}}
	for _, tc := range []struct {
		what, path, key string
		body            any
		code            int
		want            string
	}{
		{"A's credential heartbeats as B", "/v1/agents/heartbeat", credA, fake("b"), 403, berth.EForbidden},
		{"A's credential reports B's sandbox ended", "/v1/agents/heartbeat", credA, ended, 403, berth.EForbidden},
		{"A's credential announces a new agent", "/v1/agents/heartbeat", credA, fake("ghost"), 403, berth.EForbidden},
		{"A's credential evacuates B", "/v1/agents/b/evacuate", credA, berth.EvacuateRequest{DeadlineInMS: 1000}, 403, berth.EForbidden},
		{"the join token heartbeats as B", "/v1/agents/heartbeat", "node-token", fake("b"), 401, berth.EUnauthorized},
		{"the join token evacuates B", "/v1/agents/b/evacuate", "node-token", berth.EvacuateRequest{DeadlineInMS: 1000}, 401, berth.EUnauthorized},
		{"an unknown credential heartbeats as B", "/v1/agents/heartbeat", server.NewKeySecret(), fake("b"), 401, berth.EUnauthorized},
	} {
		if code, got := call(tc.path, tc.key, tc.body); code != tc.code || got != tc.want {
			t.Errorf("%s: %d %s, want %d %s", tc.what, code, got, tc.code, tc.want)
		}
	}
	if _, err := st.Agent(ctx, "ghost"); err == nil {
		t.Errorf("agent ghost is in the store after a heartbeat with another agent's credential")
	}
	if b, err := st.Agent(ctx, "b"); err != nil || b.Address == "http://127.0.0.1:1" || b.MemoryMiBTotal == 1_000_000 {
		t.Errorf("agent b after forged heartbeats: %+v, %v; want its own address and figures", b, err)
	}
	for i := range 4 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/sandboxes", strings.NewReader(`{"template":"python"}`))
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var sb berth.Sandbox
		_ = json.NewDecoder(resp.Body).Decode(&sb)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || (sb.AgentID != "a" && sb.AgentID != "b") {
			t.Errorf("create %d: %d on agent %q; want 201 on a or b", i, resp.StatusCode, sb.AgentID)
		}
	}

	// Revoke A: its credential gets 401 and it cannot come back under its id.
	if code, _ := call("/v1/agents/a/revoke", credA, nil); code != http.StatusUnauthorized {
		t.Errorf("revoke with an agent credential: %d, want 401 (admin only)", code)
	}
	if code, got := call("/v1/agents/a/revoke", admin, nil); code != http.StatusOK {
		t.Fatalf("admin revoke of a: %d %s", code, got)
	}
	hb := fake("a")
	if code, got := call("/v1/agents/heartbeat", credA, hb); code != 401 || got != berth.EUnauthorized {
		t.Errorf("heartbeat with a revoked credential: %d %s, want 401 unauthorized", code, got)
	}
	if code, got := call("/v1/agents/join", "node-token", map[string]string{"agent_id": "a"}); code != 403 || got != berth.EForbidden {
		t.Errorf("rejoin of a revoked id: %d %s, want 403 forbidden", code, got)
	}
	// The listing shows who holds what, never a secret.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/agents/credentials", nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.Contains(string(body), credA) || !strings.Contains(string(body), `"revoked_by":"admin"`) {
		t.Errorf("GET /v1/agents/credentials: %d %s; want a's credential listed revoked by admin, no secret", resp.StatusCode, body)
	}
}

// postAs POSTs body as JSON to url with the bearer key and returns the status, the answer
// read as an error body (zero unless it is one) and the answer's bytes.
func postAs(t *testing.T, url, key string, body any) (int, berth.ErrorBody, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb berth.ErrorBody
	out, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(out, &eb)
	return resp.StatusCode, eb, out
}

// credentialReads counts the store's credential reads under a real store.
type credentialReads struct {
	berth.Store
	n atomic.Int64
}

func (c *credentialReads) AgentCredentialByHash(ctx context.Context, hash string) (berth.AgentCredential, error) {
	c.n.Add(1)
	return c.Store.AgentCredentialByHash(ctx, hash)
}

// TestTRUST1_HeartbeatCredentialCachedYetRevocable: a replica reads a heartbeat credential
// from the store once, not on every heartbeat (issue 16, goal 2), and a revoke still holds at
// the next heartbeat (TRUST-1): after a rejoin the old credential's heartbeat is refused 401
// and applies nothing, though this replica had it cached; after an admin revoke, likewise
// for the new one; unknown credentials are never cached. Real SQLite, real HTTP.
func TestTRUST1_HeartbeatCredentialCachedYetRevocable(t *testing.T) {
	ctx := context.Background()
	inner, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	st := &credentialReads{Store: inner}
	cfg := server.DefaultConfig()
	cfg.NodeToken, cfg.Logger = "node-token", slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(server.New(cfg, st).Handler())
	t.Cleanup(srv.Close)
	admin := server.NewKeySecret()
	if _, err := st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutAPIKey(ctx, berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleAdmin, Hash: server.HashKey(admin), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	call := func(path, key string, body any) (int, berth.ErrorBody) {
		t.Helper()
		code, eb, out := postAs(t, srv.URL+path, key, body)
		if code == http.StatusCreated { // a join answers the credential
			var j struct{ Credential string }
			_ = json.Unmarshal(out, &j)
			eb.Error.Message = j.Credential
		}
		return code, eb
	}
	join := func() string {
		t.Helper()
		code, eb := call("/v1/agents/join", "node-token", map[string]string{"agent_id": "a"})
		if code != http.StatusCreated || eb.Error.Message == "" {
			t.Fatalf("join: %d %+v", code, eb)
		}
		return eb.Error.Message
	}
	var seq int64
	beatAs := func(cred, agentID, address string) (int, berth.ErrorBody) {
		t.Helper()
		seq++
		return call("/v1/agents/heartbeat", cred, berth.Heartbeat{AgentID: agentID, Address: address, Status: berth.AgentActive,
			IntakeOpen: true, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096,
			CPUTotal: 2, BootID: "boot-1", Seq: seq})
	}
	beat := func(cred, address string) (int, berth.ErrorBody) { t.Helper(); return beatAs(cred, "a", address) }
	address := func() string {
		t.Helper()
		a, err := st.Agent(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		return a.Address
	}

	old := join()
	for range 5 {
		if code, eb := beat(old, "http://127.0.0.1:1"); code != http.StatusOK {
			t.Fatalf("heartbeat: %d %+v", code, eb)
		}
	}
	if n := st.n.Load(); n != 1 {
		t.Errorf("5 heartbeats under one credential read it %d times from the store, want once", n)
	}

	// A rejoin on any replica (here, through the store's own path) revokes the old credential:
	// this replica has it cached, and its next heartbeat is still refused.
	fresh := join()
	if code, eb := beat(old, "http://127.0.0.1:2"); code != http.StatusUnauthorized || eb.Error.Code != berth.EUnauthorized ||
		!strings.Contains(eb.Error.Message, "rejoin") {
		t.Errorf("heartbeat under the credential a rejoin replaced: %d %+v; want 401 unauthorized saying rejoin", code, eb)
	}
	if got := address(); got != "http://127.0.0.1:1" {
		t.Errorf("address %q after the refused heartbeat: it was applied", got)
	}
	if code, eb := beat(fresh, "http://127.0.0.1:3"); code != http.StatusOK || address() != "http://127.0.0.1:3" {
		t.Errorf("heartbeat under the new credential: %d %+v, address %q", code, eb, address())
	}
	// Cached on another path: a heartbeat refused before the store sees it (another agent's
	// id, a bad body) under a credential revoked since it was cached is 401 as well, and
	// leaves the cache, rather than the 403 or 400 the cache alone would answer.
	stale := join()
	if code, eb := beat(stale, "http://127.0.0.1:3"); code != http.StatusOK {
		t.Fatalf("heartbeat under a third credential: %d %+v", code, eb)
	}
	fresh = join()
	if code, eb := beatAs(fresh, "b", "http://127.0.0.1:3"); code != http.StatusForbidden {
		t.Errorf("a live cached credential heartbeating as another agent: %d %+v; want 403", code, eb)
	}
	if code, eb := beatAs(stale, "b", "http://127.0.0.1:3"); code != http.StatusUnauthorized {
		t.Errorf("revoked cached credential heartbeating as another agent: %d %+v; want 401", code, eb)
	}
	if code, eb := call("/v1/agents/heartbeat", stale, map[string]any{"agent_id": 7}); code != http.StatusUnauthorized {
		t.Errorf("revoked credential with a bad body: %d %+v; want 401", code, eb)
	}
	before := st.n.Load()
	if code, _ := beat(old, "http://127.0.0.1:2"); code != http.StatusUnauthorized || st.n.Load() != before+1 {
		t.Errorf("the replaced credential again: %d after %d store reads; want 401 from a store read (refused ones leave the cache)", code, st.n.Load()-before)
	}

	// An admin revoke: the new credential, cached, is refused at its next heartbeat.
	if code, eb := call("/v1/agents/a/revoke", admin, nil); code != http.StatusOK {
		t.Fatalf("admin revoke: %d %+v", code, eb)
	}
	if code, eb := beat(fresh, "http://127.0.0.1:4"); code != http.StatusUnauthorized || !strings.Contains(eb.Error.Message, "admin") {
		t.Errorf("heartbeat under a cached credential after an admin revoke: %d %+v; want 401 saying admin", code, eb)
	}
	if got := address(); got != "http://127.0.0.1:3" {
		t.Errorf("address %q after the refused heartbeat: it was applied", got)
	}

	// Unknown credentials are read each time, never cached.
	unknown := server.NewKeySecret()
	before = st.n.Load()
	for range 3 {
		if code, _ := beat(unknown, "http://127.0.0.1:5"); code != http.StatusUnauthorized {
			t.Errorf("heartbeat under an unknown credential: %d, want 401", code)
		}
	}
	if n := st.n.Load() - before; n != 3 {
		t.Errorf("3 heartbeats under an unknown credential read the store %d times, want 3", n)
	}
}
