package server

import (
	"context"
	"encoding/json"
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

// lookupSignal is the real store, telling when the server has looked up an agent credential.
type lookupSignal struct {
	berth.Store
	looked chan struct{}
}

func (l *lookupSignal) AgentCredentialByHash(ctx context.Context, hash string) (berth.AgentCredential, error) {
	select {
	case l.looked <- struct{}{}:
	default:
	}
	return l.Store.AgentCredentialByHash(ctx, hash)
}

// TestTRUST1_RevokeStopsAPlanStillUploading (an attack found it): an evacuation plan whose
// body was still arriving when its agent was revoked was carried out afterwards — a revoked
// credential recorded a tenant's running sandbox lost. The server checked the credential only
// when the headers came. Now each step is checked again: the plan is refused with 401 and the
// sandbox keeps running. The revoke also drains the host, for good.
func TestTRUST1_RevokeStopsAPlanStillUploading(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, ":memory:")
	must(t, err)
	t.Cleanup(func() { st.Close() })
	admin, secret := NewKeySecret(), NewKeySecret()
	must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
	must(t, st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: time.Now()}))
	must(t, st.PutAPIKey(ctx, berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleAdmin, Hash: HashKey(admin), CreatedAt: time.Now()}))
	must(t, st.JoinAgent(ctx, berth.AgentCredential{AgentID: "a1", Hash: HashKey(secret), CreatedAt: time.Now()}))
	a := newFakeAgent(t, "")
	_, err = st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096, CPUTotal: 2, HeartbeatAt: time.Now()}, time.Now())
	must(t, err)
	ls := &lookupSignal{Store: st, looked: make(chan struct{}, 1)}
	cfg := DefaultConfig()
	cfg.NodeToken, cfg.Logger = "node-token", slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(New(cfg, ls).Handler())
	t.Cleanup(srv.Close)
	call := func(method, path, bearer string, body io.Reader) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, body)
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := call(http.MethodPost, "/v1/sandboxes", admin, strings.NewReader(`{"template":"python"}`))
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb berth.Sandbox
	must(t, json.Unmarshal([]byte(body), &sb))

	plan, _ := json.Marshal(berth.EvacuateRequest{DeadlineInMS: 5000,
		Steps: []berth.EvacuateStep{{SandboxID: sb.ID, Action: "loss", Reason: "sent by a revoked credential"}}})
	pr, pw := io.Pipe()
	type answer struct {
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() {
		code, body := call(http.MethodPost, "/v1/agents/a1/evacuate", secret, pr)
		done <- answer{code, body}
	}()
	_, _ = pw.Write(plan[:5])
	<-ls.looked // the server checked the credential: the plan is in, its body still coming
	if code, body := call(http.MethodPost, "/v1/agents/a1/revoke", admin, nil); code != http.StatusOK {
		t.Fatalf("revoke: %d %s", code, body)
	}
	_, _ = pw.Write(plan[5:])
	_ = pw.Close()
	got := <-done
	if got.code != http.StatusUnauthorized {
		t.Errorf("a plan finished after its agent's revoke: %d %s, want 401", got.code, got.body)
	}
	cur, err := st.Sandbox(ctx, sb.ID)
	must(t, err)
	if cur.State != berth.SandboxRunning {
		t.Errorf("sandbox %s is %s (%s) after a revoked credential's plan; want running", sb.ID, cur.State, cur.Reason)
	}
	// The revoke drained the host, and an undrain cannot reopen it.
	if code, body := call(http.MethodPost, "/v1/agents/a1/undrain", admin, nil); code != http.StatusConflict {
		t.Errorf("undrain of a revoked agent: %d %s, want 409", code, body)
	}
	if a, err := st.Agent(ctx, "a1"); err != nil || a.Status != berth.AgentDraining || a.DrainReason != "credential revoked" {
		t.Errorf("revoked agent: %s (drain %q), %v; want draining, \"credential revoked\"", a.Status, a.DrainReason, err)
	}
}
