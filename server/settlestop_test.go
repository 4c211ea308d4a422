package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestSweeperEndsAbandonedStopping: a replica killed mid-delete leaves its sandbox stopping
// (the row was written, the agent's stop never recorded). Once the grace passes and the
// agent's heartbeat no longer lists it, the sweeper ends it with an event and the tenant's
// quota no longer counts it; one its agent still lists gets the delete again and stays
// stopping until the agent lets it go (issue 15, point 5).
func TestSweeperEndsAbandonedStopping(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	h := newHarnessWith(t, func(c *Config) { c.Clock, c.StartingGrace = clock, time.Minute })
	ctx := context.Background()
	a := newFakeAgent(t, "")
	for _, id := range []string{"sb-gone", "sb-held"} {
		must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1",
			State: berth.SandboxRunning, MemoryMiB: 512, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now))
		// The replica recorded stopping, then died before the agent confirmed.
		ok, err := h.st.TransitionSandbox(ctx, id, nil, berth.SandboxStopping, "delete requested", "tenant/acme", now)
		must(t, err)
		if !ok {
			t.Fatalf("%s did not enter stopping", id)
		}
	}
	beat := func(ids ...string) {
		hb := berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive, BootID: "boot-1",
			IntakeOpen: true, HeartbeatAt: now}
		for _, id := range ids {
			hb.Sandboxes = append(hb.Sandboxes, berth.HeldSandbox{ID: id})
		}
		_, err := h.st.ApplyHeartbeat(ctx, hb, now)
		must(t, err)
	}
	beat("sb-gone", "sb-held")
	now = now.Add(30 * time.Second)
	beat("sb-held") // the agent stopped sb-gone; nobody recorded it
	h.s.sweep(ctx)
	if sb, _ := h.st.Sandbox(ctx, "sb-gone"); sb.State != berth.SandboxStopping {
		t.Fatalf("within the grace sb-gone is %s, want stopping (a replica may still be at it)", sb.State)
	}
	now = now.Add(2 * time.Minute)
	beat("sb-held")
	h.s.sweep(ctx)
	sb, err := h.st.Sandbox(ctx, "sb-gone")
	must(t, err)
	if sb.State != berth.SandboxStopped {
		t.Fatalf("sb-gone is %s (%s), want stopped", sb.State, sb.Reason)
	}
	evs, err := h.st.Events(ctx, berth.EventFilter{Entity: "sandbox/sb-gone", To: string(berth.SandboxStopped)})
	must(t, err)
	if len(evs) != 1 || !strings.HasPrefix(evs[0].Actor, "sweeper/") || evs[0].From != string(berth.SandboxStopping) {
		t.Fatalf("events of the settled delete: %+v; want one stopping → stopped by the sweeper", evs)
	}
	if sb, _ := h.st.Sandbox(ctx, "sb-held"); sb.State != berth.SandboxStopping {
		t.Fatalf("sb-held, still listed by its agent, is %s; want stopping", sb.State)
	}
	// The sweeper sends the delete in the background (sweepDelete), so it does not wait on it.
	waitUntil(t, "the agent that still lists sb-held told to stop it again", func() (bool, string) {
		return a.deletes.Load() > 0, fmt.Sprintf("%d deletes", a.deletes.Load())
	})
	n, mib, err := h.st.TenantUsage(ctx, "acme")
	must(t, err)
	if n != 1 || mib != 512 {
		t.Fatalf("acme's quota counts %d sandboxes (%d MiB); want only sb-held (1, 512)", n, mib)
	}
	now = now.Add(10 * time.Second)
	beat() // the agent let sb-held go too
	h.s.sweep(ctx)
	if n, _, _ := h.st.TenantUsage(ctx, "acme"); n != 0 {
		t.Fatalf("acme's quota still counts %d sandboxes after both stopped", n)
	}
}

// TestKilledAgentNotQuarantined: an agent killed during creates (its address refuses
// connections) is not quarantined by the creates that could not reach it — a host that is
// down is its lease's business — and once it restarts with a new boot id it takes creates
// again at once (issue 15, point 5; PLC-9).
func TestKilledAgentNotQuarantined(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.Quarantine = berth.QuarantinePolicy{After: 3, Backoff: 10 * time.Minute, MaxBackoff: 10 * time.Minute}
		c.CacheTTL = time.Nanosecond // the restart's heartbeat is written to the store, not posted
	})
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	refused := "http://" + ln.Addr().String()
	must(t, ln.Close()) // the agent was killed: its port now refuses connections
	healthy := newFakeAgent(t, "")
	beat := func(id, addr, boot string, admittable int64) {
		_, err := h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: id, Address: addr, Status: berth.AgentActive,
			IntakeOpen: true, BootID: boot, Seq: 1, MemoryAdmission: berth.AdmissionCommitted,
			MemoryMiBTotal: 8192, MemoryMiBAdmittable: admittable, CPUTotal: 2, HeartbeatAt: h.clock()}, h.clock())
		must(t, err)
	}
	beat("killed", refused, "boot-1", 8192) // more room: placement prefers it
	beat("healthy", healthy.srv.URL, "boot-h", 8192-1024)
	for i := range 5 {
		code, sb, e := h.create(t)
		if code != http.StatusCreated || sb.AgentID != "healthy" {
			t.Fatalf("create %d: %d %+v %+v, want 201 on healthy", i, code, sb, e)
		}
	}
	a, err := h.st.Agent(ctx, "killed")
	must(t, err)
	if a.CreateFailures != 0 || !a.QuarantinedUntil.IsZero() {
		t.Fatalf("killed agent: failures %d, quarantined until %v; refused connections are not create failures",
			a.CreateFailures, a.QuarantinedUntil)
	}
	back := newFakeAgent(t, "")
	beat("killed", back.srv.URL, "boot-2", 8192) // restarted, on a new address
	code, sb, e := h.create(t)
	if code != http.StatusCreated || sb.AgentID != "killed" {
		t.Fatalf("after the restart: %d on %q %+v, want the restarted host (not quarantined)", code, sb.AgentID, e)
	}
}

// TestMisconfiguredTLSAgentIsQuarantined: unlike a host that is down, one that answers but
// whose TLS certificate the replica does not trust fails every create sent to it; it counts
// toward quarantine (PLC-9) and leaves placement, though nothing of a create reached it.
func TestMisconfiguredTLSAgentIsQuarantined(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.Quarantine = berth.QuarantinePolicy{After: 3, Backoff: 10 * time.Minute, MaxBackoff: 10 * time.Minute}
		c.CacheTTL = time.Nanosecond
	})
	ctx := context.Background()
	untrusted := httptest.NewTLSServer(http.NotFoundHandler()) // its certificate: httptest's own
	t.Cleanup(untrusted.Close)
	healthy := newFakeAgent(t, "")
	for _, a := range []struct {
		id, addr   string
		admittable int64
	}{{"bad-tls", untrusted.URL, 8192}, {"healthy", healthy.srv.URL, 8192 - 1024}} { // more room: placement prefers bad-tls
		_, err := h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: a.id, Address: a.addr, Status: berth.AgentActive,
			IntakeOpen: true, BootID: "boot-1", Seq: 1, MemoryAdmission: berth.AdmissionCommitted,
			MemoryMiBTotal: 8192, MemoryMiBAdmittable: a.admittable, CPUTotal: 2, HeartbeatAt: h.clock()}, h.clock())
		must(t, err)
	}
	for i := range 3 {
		if code, sb, e := h.create(t); code != http.StatusCreated || sb.AgentID != "healthy" {
			t.Fatalf("create %d: %d %+v %+v, want 201 on healthy", i, code, sb, e)
		}
	}
	a, err := h.st.Agent(ctx, "bad-tls")
	must(t, err)
	if a.CreateFailures < 3 || a.QuarantinedUntil.IsZero() {
		t.Fatalf("agent with an untrusted certificate: failures %d, quarantined until %v; want quarantined after 3",
			a.CreateFailures, a.QuarantinedUntil)
	}
}
