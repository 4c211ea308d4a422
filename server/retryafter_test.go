package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// reserveHarness is a harness on a fake clock with a 2 s heartbeat, so the reserve hint is
// 3 s (one heartbeat plus one 1 s measurement), and one fake agent.
type reserveHarness struct {
	*harness
	agent *fakeAgent
	mu    sync.Mutex
	now   time.Time
}

func newReserveHarness(t *testing.T) *reserveHarness {
	r := &reserveHarness{now: time.Now()}
	r.harness = newHarnessWith(t, func(c *Config) {
		c.HeartbeatInterval = 2 * time.Second
		c.Clock = func() time.Time { r.mu.Lock(); defer r.mu.Unlock(); return r.now }
	})
	r.agent = newFakeAgent(t, "")
	return r
}

// tick moves the clock past the second for which the estimate is reused.
func (r *reserveHarness) tick() {
	r.mu.Lock()
	r.now = r.now.Add(2 * time.Second)
	r.mu.Unlock()
}

// heartbeatHeld writes agent a1's heartbeat in mode with admittable MiB free, listing held.
func (r *reserveHarness) heartbeatHeld(t *testing.T, mode string, admittable int64, held ...berth.HeldSandbox) {
	t.Helper()
	_, err := r.st.ApplyHeartbeat(context.Background(), berth.Heartbeat{
		AgentID: "a1", Address: r.agent.srv.URL, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: mode, MemoryMiBTotal: 4096, MemoryMiBAdmittable: admittable,
		CPUTotal: 2, HeartbeatAt: r.clock(), Sandboxes: held,
	}, r.clock())
	must(t, err)
}

// refusedAfter posts a create of memoryMiB (0: the template's 512) and returns the 503's
// Retry-After in seconds; anything but a 503 fails the test.
func (r *reserveHarness) refusedAfter(t *testing.T, memoryMiB int64) int {
	t.Helper()
	body := `{"template":"python"}`
	if memoryMiB > 0 {
		b, _ := json.Marshal(berth.CreateRequest{Template: "python", MemoryMiB: memoryMiB})
		body = string(b)
	}
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/v1/sandboxes", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+r.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb berth.ErrorBody
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(b, &eb) != nil {
		t.Fatalf("create of %d MiB: %d %s, want 503", memoryMiB, resp.StatusCode, b)
	}
	if h := resp.Header.Get("Retry-After"); h == "" {
		t.Fatalf("503 without a Retry-After header: %s", b)
	}
	return eb.Error.RetryAfterS
}

// TestAPI3_RetryAfterReservesMeasuredSoon (issue 16, goal 6): a working-set host full only of
// a reserve — first the ledger's reservation of a create the agent has not listed yet, then
// the agent's own reserve of the guest it listed unmeasured — gets its room back at the next
// measurement, so a refusal says one heartbeat plus one measurement (3 s), not the 60 s of the
// ledger TTL or the hour-long sandbox TTL. A create the reserves could not make room for, and
// a host whose guest is measured, keep the TTL estimate.
func TestAPI3_RetryAfterReservesMeasuredSoon(t *testing.T) {
	r := newReserveHarness(t)
	r.heartbeatHeld(t, berth.AdmissionWorkingSet, 512)
	code, sb, _ := r.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}

	r.tick()
	if got := r.refusedAfter(t, 0); got != 3 {
		t.Fatalf("full of a ledger reservation the next heartbeat nets: Retry-After %d s, want 3 (one heartbeat + one measurement)", got)
	}
	// 4096 MiB is charged a 1024 MiB reserve: the 512 MiB the reserve gives back cannot hold it.
	if got := r.refusedAfter(t, 4096); got != 60 {
		t.Fatalf("a create bigger than the reserves: Retry-After %d s, want 60 (the TTL estimate)", got)
	}

	// The heartbeat lists the guest unmeasured: the ledger entry is netted, the agent
	// charges the reserve itself.
	r.tick()
	r.heartbeatHeld(t, berth.AdmissionWorkingSet, 0, berth.HeldSandbox{ID: sb.ID})
	if rs, err := r.st.Reservations(context.Background()); err != nil || len(rs) != 0 {
		t.Fatalf("reservations after the heartbeat listed the sandbox: %v %v, want none (LED-4)", rs, err)
	}
	if got := r.refusedAfter(t, 0); got != 3 {
		t.Fatalf("full of an unmeasured guest's reserve: Retry-After %d s, want 3", got)
	}

	// Measured, and the host is still full: the room is the guest's, back only at its TTL.
	r.tick()
	r.heartbeatHeld(t, berth.AdmissionWorkingSet, 0, berth.HeldSandbox{ID: sb.ID, Measured: true, ResidentMiB: 3000})
	if got := r.refusedAfter(t, 0); got != 60 {
		t.Fatalf("full of a measured guest: Retry-After %d s, want 60 (the hour-long TTL, clamped)", got)
	}
}

// TestAPI3_RetryAfterCommittedReserveStays: on a committed host a create is charged its full
// size before and after the heartbeat nets its reservation, so netting gives nothing back and
// the refusal keeps the TTL estimate.
func TestAPI3_RetryAfterCommittedReserveStays(t *testing.T) {
	r := newReserveHarness(t)
	r.heartbeatHeld(t, berth.AdmissionCommitted, 512)
	if code, _, _ := r.create(t); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	r.tick()
	if got := r.refusedAfter(t, 0); got != 60 {
		t.Fatalf("committed host full of a reservation: Retry-After %d s, want 60", got)
	}
}
