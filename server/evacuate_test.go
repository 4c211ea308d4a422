package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/berth-dev/berth"
)

// TestSPOT3_ReconstructRetriesUntilTheDeadline: a reconstruction that meets a full fleet
// waits out the refusal and tries again until the notice's hard deadline, instead of
// recording a loss on the first no_capacity: room that frees inside the window is used.
func TestSPOT3_ReconstructRetriesUntilTheDeadline(t *testing.T) {
	h := newHarness(t, time.Millisecond)
	ctx := context.Background()
	doomed, spare := newFakeAgent(t, ""), newFakeAgent(t, "")
	h.heartbeat(t, "doomed", doomed.srv.URL, 4096)
	h.heartbeat(t, "spare", spare.srv.URL, 0) // full
	now := time.Now()
	must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-job", Template: "python", Tenant: "acme", AgentID: "doomed",
		State: berth.SandboxRunning, MemoryMiB: 512, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now))
	h.heartbeat(t, "doomed", doomed.srv.URL, 0)
	must(t, h.st.SetAgentDrain(ctx, "doomed", true, "preemption notice", "test", now))

	// Room frees on the spare host inside the window, once the first try has been refused.
	refused := h.s.metrics.refusals.WithLabelValues(berth.ENoCapacity)
	count := func() float64 { var m dto.Metric; _ = refused.Write(&m); return m.GetCounter().GetValue() }
	before := count()
	go func() {
		for deadline := time.Now().Add(20 * time.Second); count() == before && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond) // real: the refusal comes from a handler behind a loopback HTTP server
		}
		h.heartbeat(t, "spare", spare.srv.URL, 4096)
	}()
	body, _ := json.Marshal(berth.EvacuateRequest{Deadline: time.Now().Add(20 * time.Second),
		Steps: []berth.EvacuateStep{{SandboxID: "sb-job", Action: "reconstruct"}}})
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/agents/doomed/evacuate", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+joinAs(t, h.srv.URL, "doomed"))
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	var out struct{ Outcomes []berth.EvacuateOutcome }
	must(t, json.NewDecoder(resp.Body).Decode(&out))
	if len(out.Outcomes) != 1 || out.Outcomes[0].State != berth.SandboxReconstructed || out.Outcomes[0].Replacement == "" {
		t.Fatalf("outcomes %+v; want the job reconstructed once room freed", out.Outcomes)
	}
	repl, err := h.st.Sandbox(ctx, out.Outcomes[0].Replacement)
	if err != nil || repl.AgentID != "spare" || repl.State != berth.SandboxRunning {
		t.Fatalf("replacement %+v, %v; want running on the spare host", repl, err)
	}
}
