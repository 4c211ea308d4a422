package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/berth-dev/berth"
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
	h := newHarness(t, 0)
	secret := NewKeySecret()
	must(t, h.st.JoinAgent(ctx, berth.AgentCredential{AgentID: "a1", Hash: HashKey(secret), CreatedAt: time.Now()}))
	h.heartbeat(t, "a1", newFakeAgent(t, "").srv.URL, 4096)
	ls := &lookupSignal{Store: h.st, looked: make(chan struct{}, 1)}
	h.s.store = ls // the handlers' store; the scheduler keeps the real one
	code, sb, _ := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}

	plan, _ := json.Marshal(berth.EvacuateRequest{DeadlineInMS: 5000,
		Steps: []berth.EvacuateStep{{SandboxID: sb.ID, Action: "loss", Reason: "sent by a revoked credential"}}})
	pr, pw := io.Pipe()
	type answer struct {
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() { // not call: a goroutine must not end the test
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/agents/a1/evacuate", pr)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- answer{resp.StatusCode, string(b)}
	}()
	_, _ = pw.Write(plan[:5])
	<-ls.looked // the server checked the credential: the plan is in, its body still coming
	if code, body := call(t, h.srv.URL, http.MethodPost, "/v1/agents/a1/revoke", h.key, nil); code != http.StatusOK {
		t.Fatalf("revoke: %d %s", code, body)
	}
	_, _ = pw.Write(plan[5:])
	_ = pw.Close()
	got := <-done
	if got.code != http.StatusUnauthorized {
		t.Errorf("a plan finished after its agent's revoke: %d %s, want 401", got.code, got.body)
	}
	cur, err := h.st.Sandbox(ctx, sb.ID)
	must(t, err)
	if cur.State != berth.SandboxRunning {
		t.Errorf("sandbox %s is %s (%s) after a revoked credential's plan; want running", sb.ID, cur.State, cur.Reason)
	}
	// The revoke drained the host, and an undrain cannot reopen it.
	if code, body := call(t, h.srv.URL, http.MethodPost, "/v1/agents/a1/undrain", h.key, nil); code != http.StatusConflict {
		t.Errorf("undrain of a revoked agent: %d %s, want 409", code, body)
	}
	if a, err := h.st.Agent(ctx, "a1"); err != nil || a.Status != berth.AgentDraining || a.DrainReason != "credential revoked" {
		t.Errorf("revoked agent: %s (drain %q), %v; want draining, \"credential revoked\"", a.Status, a.DrainReason, err)
	}
}
