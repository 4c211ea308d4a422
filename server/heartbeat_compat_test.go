package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// TestHeartbeatFromThePreviousRelease: an agent of the previous release still sends
// natid_free and stream_restore_enabled, which issue 14 retired. Its heartbeat is accepted
// (2xx, the agent recorded with its figures; the answer is 200 with an acknowledgment since
// issue 16, goal 2, which the old agent does not read) rather than refused by strict
// decoding, so a rolling upgrade keeps old agents placeable; any other unknown field is
// still a 400.
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
	if got := post(old); got != http.StatusOK {
		t.Fatalf("heartbeat with the retired fields: %d, want 200", got)
	}
	a, err := h.st.Agent(t.Context(), "old-1")
	if err != nil || a.MemoryMiBAdmittable != 3000 || !a.IntakeOpen {
		t.Fatalf("agent old-1 after its heartbeat: %+v, %v; want admittable 3000, intake open", a, err)
	}
	if got := post(strings.Replace(old, `"natid_free"`, `"natid_freee"`, 1)); got != http.StatusBadRequest {
		t.Fatalf("heartbeat with an unknown field: %d, want 400", got)
	}
}

// TestHeartbeatPreviousReleaseWholeLists (issue 16, goal 2): an agent of the previous release
// sends its whole held list on every heartbeat, no delta marker, and reads no answer body.
// The held list the store keeps follows each whole list — a sandbox it stops listing is gone
// — and a reservation for a sandbox it lists is netted (LED-4), as before deltas existed.
func TestHeartbeatPreviousReleaseWholeLists(t *testing.T) {
	h := newHarness(t, 0)
	ctx := t.Context()
	cred := joinAs(t, h.srv.URL, "old-2")
	c := client.New(h.srv.URL, cred)
	hb := berth.Heartbeat{AgentID: "old-2", Address: "http://127.0.0.1:1", Status: berth.AgentActive, CPUTotal: 2,
		MemoryMiBTotal: 4096, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBAdmittable: 3000, IntakeOpen: true,
		BootID: "b1", Seq: 1, Sandboxes: []berth.HeldSandbox{{ID: "sb-1"}, {ID: "sb-2"}}}
	if err := c.Heartbeat(ctx, hb); err != nil { // the previous release's call: the answer is not read
		t.Fatal(err)
	}
	if ok, err := h.st.Reserve(ctx, berth.Reservation{ID: "r-3", AgentID: "old-2", SandboxID: "sb-3", MiB: 256,
		Owner: "test", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Minute)}, time.Now()); err != nil || !ok {
		t.Fatalf("reserve: %v, %v", ok, err)
	}
	hb.Seq, hb.Sandboxes = 2, []berth.HeldSandbox{{ID: "sb-2"}, {ID: "sb-3"}}
	if err := c.Heartbeat(ctx, hb); err != nil {
		t.Fatal(err)
	}
	a, err := h.st.Agent(ctx, "old-2")
	if err != nil || len(a.Sandboxes) != 2 || a.Sandboxes[0].ID != "sb-2" || a.Sandboxes[1].ID != "sb-3" {
		t.Fatalf("held after two whole lists: %+v, %v; want [sb-2 sb-3]", a.Sandboxes, err)
	}
	if pending, err := h.st.Pending(ctx, time.Now()); err != nil || pending["old-2"] != 0 {
		t.Fatalf("pending on old-2: %v, %v; want r-3 netted by the list naming sb-3", pending, err)
	}
}
