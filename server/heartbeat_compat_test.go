package server

import (
	"net/http"
	"strings"
	"testing"
)

// TestHeartbeatFromThePreviousRelease: an agent of the previous release still sends
// natid_free and stream_restore_enabled, which issue 14 retired. Its heartbeat is accepted
// (204, the agent recorded with its figures) rather than refused by strict decoding, so a
// rolling upgrade keeps old agents placeable; any other unknown field is still a 400.
func TestHeartbeatFromThePreviousRelease(t *testing.T) {
	h := newHarness(t, 0)
	cred := joinAs(t, h.srv.URL, "old-1")
	post := func(body string) int {
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/agents/heartbeat", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+cred)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	old := `{"agent_id":"old-1","address":"http://127.0.0.1:1","status":"active","cpu_total":2,
		"memory_mb_total":4096,"memory_admission":"committed","memory_mb_admittable":3000,"intake_open":true,
		"natid_free":16384,"stream_restore_enabled":false,"sandboxes":[],"version":"v0","boot_id":"b1"}`
	if got := post(old); got != http.StatusNoContent {
		t.Fatalf("heartbeat with the retired fields: %d, want 204", got)
	}
	a, err := h.st.Agent(t.Context(), "old-1")
	if err != nil || a.MemoryMiBAdmittable != 3000 || !a.IntakeOpen {
		t.Fatalf("agent old-1 after its heartbeat: %+v, %v; want admittable 3000, intake open", a, err)
	}
	if got := post(strings.Replace(old, `"natid_free"`, `"natid_freee"`, 1)); got != http.StatusBadRequest {
		t.Fatalf("heartbeat with an unknown field: %d, want 400", got)
	}
}
