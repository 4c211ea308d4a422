package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/preempt"
	"github.com/berth-dev/berth/server"
)

// TestAPI4_IdempotentCreate: retries with one Idempotency-Key, even concurrent ones, get
// the first sandbox and never a second running one.
func TestAPI4_IdempotentCreate(t *testing.T) {
	st := bootDev(t, nil)
	ctx := context.Background()
	c := adminClient(st)
	first, err := c.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "shell"}, "job-42")
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "shell"}, "job-42")
	if err != nil || again.ID != first.ID {
		t.Fatalf("retry with the same key: %+v, %v; want sandbox %s", again, err, first.ID)
	}

	var wg sync.WaitGroup
	ids := make([]string, 6)
	for i := range ids {
		wg.Go(func() {
			sb, err := c.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "shell"}, "burst-key")
			if err != nil {
				t.Errorf("concurrent create %d: %v", i, err)
				return
			}
			ids[i] = sb.ID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent creates with one key returned different sandboxes: %v", ids)
		}
	}
	running, err := c.Sandboxes(ctx, berth.SandboxRunning)
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != 2 {
		t.Fatalf("%d sandboxes running, want 2 (one per key): %+v", len(running), running)
	}
	// Copies that lost the race were stopped on the agent: it holds exactly the two.
	waitFor(t, 10*time.Second, "the agent to hold exactly 2 sandboxes", func() (bool, string) {
		n := len(agentByID(t, c, "dev-agent-1").Sandboxes)
		return n == 2, strings.Repeat("x", n)
	})
}

// TestPLC5_DrainStopsPlacementAtOnce: a drain through the API takes effect on the very next
// create (PLC-5 in process) and undrain restores placement (AGT-5).
func TestPLC5_DrainStopsPlacementAtOnce(t *testing.T) {
	st := bootDev(t, nil)
	ctx := context.Background()
	c := adminClient(st)
	if err := c.DrainAgent(ctx, "dev-agent-1", "kernel upgrade"); err != nil {
		t.Fatal(err)
	}
	code, _, _, e := rawCreate(t, st, `{"template":"shell"}`)
	if code != http.StatusServiceUnavailable || e.Code != berth.ENoCapacity || e.Hosts["draining"] != 1 {
		t.Fatalf("create on a drained fleet: %d %+v, want 503 no_capacity with 1 draining", code, e)
	}
	if a := agentByID(t, c, "dev-agent-1"); a.Status != berth.AgentDraining || a.DrainReason != "kernel upgrade" {
		t.Fatalf("agent after drain: %s %q", a.Status, a.DrainReason)
	}
	if err := c.UndrainAgent(ctx, "dev-agent-1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "placement after undrain", func() (bool, string) {
		code, _, _, e := rawCreate(t, st, `{"template":"shell"}`)
		return code == http.StatusCreated, e.Code
	})
	evs, err := c.Events(ctx, "agent/dev-agent-1")
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range evs {
		seen = append(seen, e.From+"→"+e.To)
	}
	if got := strings.Join(seen, ","); !strings.Contains(got, "active→draining") || !strings.Contains(got, "draining→active") {
		t.Fatalf("agent events %s: want the drain and the undrain (LIF-3)", got)
	}
}

// TestTenantIsolation: a tenant key sees and touches only its tenant's sandboxes, and may
// not call admin endpoints.
func TestTenantIsolation(t *testing.T) {
	st := bootDev(t, nil)
	ctx := context.Background()
	admin := adminClient(st)
	if _, err := admin.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateAPIKey(ctx, "acme", berth.RoleTenant)
	if err != nil {
		t.Fatal(err)
	}
	acme := client.New(st.URL, k.Key)
	mine, err := acme.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil || mine.Tenant != "acme" {
		t.Fatalf("tenant create: %+v, %v", mine, err)
	}
	theirs, err := admin.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acme.Sandbox(ctx, theirs.ID); berth.ErrorCode(err) != berth.ESandboxNotFound {
		t.Fatalf("tenant reading another tenant's sandbox: %v, want sandbox_not_found", err)
	}
	if err := acme.DeleteSandbox(ctx, theirs.ID); berth.ErrorCode(err) != berth.ESandboxNotFound {
		t.Fatalf("tenant deleting another tenant's sandbox: %v", err)
	}
	list, err := acme.Sandboxes(ctx, "")
	if err != nil || len(list) != 1 || list[0].ID != mine.ID {
		t.Fatalf("tenant list: %+v, %v; want only %s", list, err, mine.ID)
	}
	if _, err := acme.Agents(ctx); berth.ErrorCode(err) != berth.EForbidden {
		t.Fatalf("tenant listing agents: %v, want forbidden", err)
	}
	if _, err := acme.Events(ctx, "sandbox/"+mine.ID); err != nil {
		t.Fatalf("tenant reading its own sandbox's events: %v", err)
	}
	if _, err := acme.Events(ctx, "sandbox/"+theirs.ID); berth.ErrorCode(err) != berth.ESandboxNotFound {
		t.Fatalf("tenant reading another tenant's events: %v", err)
	}
}

// TestAPI4_ReplayOnAFullFleet: a retry of a create that succeeded gets that sandbox even
// when the fleet has no room left for a new one.
func TestAPI4_ReplayOnAFullFleet(t *testing.T) {
	st := bootDev(t, func(c *devConfig) {
		c.Admission, c.AgentMemoryMiB, c.HeadroomMiB = berth.AdmissionCommitted, 512, 0
	})
	ctx := context.Background()
	c := adminClient(st, client.WithDeadline(time.Second))
	first, err := c.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "python"}, "only-one")
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "python"}, "only-one")
	if err != nil || again.ID != first.ID {
		t.Fatalf("retry on a full fleet: %+v, %v; want sandbox %s", again, err, first.ID)
	}
	if _, err := c.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "python"}, "another"); !client.IsCapacityUnavailable(err) {
		t.Fatalf("a new create on the full fleet: %v, want capacity unavailable", err)
	}
}

// TestAGT6_AgentStopsWhatTheStoreEnded: a sandbox the store has ended while its agent still
// runs it (lost during a partition, say) is stopped on the host, so nothing runs that the
// store does not account for: at the next heartbeat that lists it, or at the latest by the
// replica's sweep of everything the agent holds (Config.HeldSweepEvery, a minute by default,
// two seconds here; issue 16 goal 2: heartbeats are deltas, and an unchanged sandbox is not
// listed).
func TestAGT6_AgentStopsWhatTheStoreEnded(t *testing.T) {
	st, c, sb := listedOnDev(t)
	ctx := context.Background()
	if _, err := st.Store.TransitionSandbox(ctx, sb.ID, nil, berth.SandboxLost, "lease expired (test)", "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	waitListed(t, c, sb, false)
}

// listedOnDev boots berth dev sweeping every agent's held list every 2 s and creates one
// sandbox, listed by its agent (waitListed).
func listedOnDev(t *testing.T) (*devStack, *client.Client, berth.Sandbox) {
	t.Helper()
	st := bootDev(t, func(c *devConfig) {
		c.serverHook = func(s *server.Config) { s.HeldSweepEvery = 2 * time.Second }
	})
	c := adminClient(st)
	sb, err := c.CreateSandbox(context.Background(), berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	waitListed(t, c, sb, true)
	return st, c, sb
}

// waitListed waits until sb's agent lists it, started and numbered (berth.HeldSandbox
// Incarnation), or (listed false) no longer lists it: up to 10 s to be listed, 90 s to go.
func waitListed(t *testing.T, c *client.Client, sb berth.Sandbox, listed bool) {
	t.Helper()
	what, within := "the agent to list "+sb.ID, 10*time.Second
	if !listed {
		what, within = "the agent to stop "+sb.ID, 90*time.Second
	}
	waitFor(t, within, what, func() (bool, string) {
		for _, h := range agentByID(t, c, sb.AgentID).Sandboxes {
			if h.ID == sb.ID {
				return listed && !h.Starting && h.Incarnation > 0, fmt.Sprintf("listed: %+v", h)
			}
		}
		return !listed, "not listed"
	})
}

// TestAGT6_AgentStopsACopyTheStorePlacesNowhere: a sandbox the store records paused (a
// checkpoint whose answer was lost, its image stored) while its agent still runs it — the
// agent restored it after an upload it saw fail — is stopped on that agent by its incarnation,
// end to end through a real agent's heartbeats, and its record stays paused. Before, the copy
// ran on beside the paused record, and a resume elsewhere ran the tenant's code twice.
func TestAGT6_AgentStopsACopyTheStorePlacesNowhere(t *testing.T) {
	st, c, sb := listedOnDev(t)
	ctx := context.Background()
	now := time.Now()
	moved, err := st.Store.MoveSandbox(ctx, sb.ID, []berth.SandboxState{berth.SandboxRunning},
		berth.SandboxMove{To: berth.SandboxPaused, ExpiresAt: sb.ExpiresAt, PausedAt: now, Image: sb.ID + "/1"},
		"checkpointed (its answer was lost; the image is stored) (test)", "test", now)
	if err != nil || !moved {
		t.Fatalf("record paused: %v, %v", moved, err)
	}
	waitListed(t, c, sb, false)
	got, err := c.Sandbox(ctx, sb.ID)
	if err != nil || got.State != berth.SandboxPaused {
		t.Fatalf("after its stale copy stopped: %+v, %v; want still paused", got, err)
	}
}

// TestCase_C11_C12_DrainCompletion: a drain is complete only when every sandbox on the host
// is terminal (C11); past its deadline the status names what blocks it instead of waiting
// forever (C12).
func TestCase_C11_C12_DrainCompletion(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.DrainDeadline = 500 * time.Millisecond })
	ctx := context.Background()
	c := adminClient(st)
	sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DrainAgent(ctx, "dev-agent-1", "maintenance"); err != nil {
		t.Fatal(err)
	}
	ds, err := c.DrainStatus(ctx, "dev-agent-1")
	if err != nil {
		t.Fatal(err)
	}
	if !ds.Draining || ds.Complete || len(ds.Remaining) != 1 || ds.Remaining[0].ID != sb.ID || ds.Deadline.IsZero() {
		t.Fatalf("drain with a sandbox still running: %+v, want not complete with it remaining", ds)
	}
	waitFor(t, 10*time.Second, "the drain to report its blocker past the deadline", func() (bool, string) {
		ds, err := c.DrainStatus(ctx, "dev-agent-1")
		return err == nil && ds.Blocked && !ds.Complete && len(ds.Remaining) == 1, fmt.Sprintf("%+v %v", ds, err)
	})
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	ds, err = c.DrainStatus(ctx, "dev-agent-1")
	if err != nil || !ds.Complete || ds.Blocked || len(ds.Remaining) != 0 {
		t.Fatalf("after the last sandbox stopped: %+v, %v; want complete", ds, err)
	}
	if _, err := c.DrainStatus(ctx, "nope"); berth.ErrorCode(err) != berth.ENotFound {
		t.Fatalf("unknown agent: %v", err)
	}
}

// TestPOOL2_VolumePinnedToItsHost: a volume is pinned to the host it first lands on; every
// later sandbox naming it lands there and sees the data the first one wrote, after that
// sandbox is gone (POOL-2, POOL-4).
func TestPOOL2_VolumePinnedToItsHost(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.Agents = 2 })
	ctx := context.Background()
	c := adminClient(st)
	first, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell", Volume: "pgdata"})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Stateful {
		t.Fatalf("a sandbox with a volume must be stateful: %+v", first)
	}
	if err := c.WriteFile(ctx, first.ID, "/tmp/volume/hello", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell", Volume: "pgdata"})
		if err != nil {
			t.Fatal(err)
		}
		if sb.AgentID != first.AgentID {
			t.Fatalf("create %d with the volume landed on %s, want its host %s", i, sb.AgentID, first.AgentID)
		}
		got, err := c.ReadFile(ctx, sb.ID, "/tmp/volume/hello")
		if err != nil || string(got) != "kept" {
			t.Fatalf("create %d: volume content %q, %v; want what the first sandbox wrote", i, got, err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := c.Events(ctx, "volume/default/pgdata")
	if err != nil || len(evs) != 1 || evs[0].To != "pinned" {
		t.Fatalf("volume events: %+v, %v; want one pin", evs, err)
	}
}

// TestADM11_TenantQuota: a tenant's quota refuses the create past it with 403
// tenant_over_quota before any placement, not retryable; ending a sandbox makes room; other
// tenants are not limited by it; a retry of a create that succeeded is still answered.
func TestADM11_TenantQuota(t *testing.T) {
	st := bootDev(t, nil)
	ctx := context.Background()
	admin := adminClient(st)
	if _, err := admin.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateAPIKey(ctx, "acme", berth.RoleTenant)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.SetQuota(ctx, berth.Quota{Tenant: "acme", MaxSandboxes: 2}); err != nil {
		t.Fatal(err)
	}
	acme := client.New(st.URL, k.Key, client.WithDeadline(2*time.Second))
	first, err := acme.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "shell"}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acme.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"}); err != nil {
		t.Fatal(err)
	}
	_, err = acme.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	var be *berth.Error
	if !errors.As(err, &be) || be.Code != berth.ETenantOverQuota || client.IsCapacityUnavailable(err) {
		t.Fatalf("third create over a 2-sandbox quota: %v, want tenant_over_quota at once", err)
	}
	if again, err := acme.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "shell"}, "k1"); err != nil || again.ID != first.ID {
		t.Fatalf("retry of a create that succeeded, at the quota: %+v, %v", again, err)
	}
	if _, err := admin.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"}); err != nil {
		t.Fatalf("another tenant is not limited by acme's quota: %v", err)
	}
	if err := acme.DeleteSandbox(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := acme.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"}); err != nil {
		t.Fatalf("create after a sandbox ended: %v", err)
	}
}

// TestADM9_EvictionBeforeTheOOMKiller: on real process sandboxes in working-set mode, memory
// grows until the host's available memory crosses the critical line; the agent evicts the
// largest stateless sandbox, leaves the stateful one untouched, records the eviction as an
// event, and the kernel OOM killer kills nothing (the cgroups' oom_kill counters stay 0).
func TestADM9_EvictionBeforeTheOOMKiller(t *testing.T) {
	st := bootDev(t, func(c *devConfig) {
		c.Admission, c.AgentMemoryMiB, c.HeadroomMiB, c.EvictFloorMiB = berth.AdmissionWorkingSet, 2048, 0, 1000
	})
	ctx := context.Background()
	c := adminClient(st)
	grow := func(id string, mib int) {
		t.Helper()
		_, err := c.Exec(ctx, id, berth.ExecRequest{Cmd: []string{"sh", "-c",
			fmt.Sprintf(`python3 -c "b=bytes(range(256))*(%d*4096); import time; time.sleep(600)" >/dev/null 2>&1 &`, mib)}})
		if err != nil {
			t.Fatal(err)
		}
	}
	stateful, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python", Stateful: true})
	if err != nil {
		t.Fatal(err)
	}
	small, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
	if err != nil {
		t.Fatal(err)
	}
	big, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
	if err != nil {
		t.Fatal(err)
	}
	grow(stateful.ID, 400)
	grow(small.ID, 300)
	grow(big.ID, 450) // together ~1,150 MiB of 2,048: available under the 1,000 MiB floor
	waitFor(t, 60*time.Second, "the largest stateless sandbox evicted", func() (bool, string) {
		sb, err := c.Sandbox(ctx, big.ID)
		return err == nil && sb.State == berth.SandboxEvicted, fmt.Sprint(sb.State, err)
	})
	for _, id := range []string{stateful.ID, small.ID} {
		if sb, err := c.Sandbox(ctx, id); err != nil || sb.State != berth.SandboxRunning {
			t.Fatalf("%s after the eviction: %+v, %v; want running", id, sb.State, err)
		}
	}
	evs, err := c.Events(ctx, "sandbox/"+big.ID)
	if err != nil || evs[len(evs)-1].To != "evicted" || !strings.Contains(evs[len(evs)-1].Reason, "memory critical") {
		t.Fatalf("eviction event: %+v, %v", evs, err)
	}
	for _, h := range agentByID(t, c, "dev-agent-1").Sandboxes {
		if h.OOMKills != 0 {
			t.Fatalf("the kernel OOM killer killed in %s: %d", h.ID, h.OOMKills)
		}
	}
}

// TestSPOT3_Evacuate: a preemption notice on a host with
// reconstructible sandboxes gets them recreated on another host before the notice deadline,
// each with events; an irreproducible one the process runtime cannot snapshot is reported as
// a budgeted loss, not silently dropped (SPOT-2, SPOT-3).
func TestSPOT3_Evacuate(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.Agents = 2 })
	ctx := context.Background()
	c := adminClient(st)
	// Put everything on dev-agent-1: cordon the other host while creating.
	if err := c.DrainAgent(ctx, "dev-agent-2", "setup"); err != nil {
		t.Fatal(err)
	}
	var stateless []berth.Sandbox
	for range 2 {
		sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
		if err != nil {
			t.Fatal(err)
		}
		stateless = append(stateless, sb)
	}
	stateful, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell", Stateful: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UndrainAgent(ctx, "dev-agent-2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "dev-agent-2 back in placement", func() (bool, string) {
		a := agentByID(t, c, "dev-agent-2")
		return a.Status == berth.AgentActive && a.IntakeOpen, string(a.Status)
	})
	notice := time.Now()
	deadline := notice.Add(30 * time.Second)
	st.Agents[0].HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindTerminate, ID: "i-1", Deadline: deadline}, notice)
	st.Agents[0].HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindTerminate, ID: "i-1", Deadline: deadline}, notice) // repeated: nothing new
	for _, old := range stateless {
		waitFor(t, 30*time.Second, old.ID+" reconstructed", func() (bool, string) {
			sb, err := c.Sandbox(ctx, old.ID)
			return err == nil && sb.State == berth.SandboxReconstructed, fmt.Sprint(sb.State, err)
		})
		evs, err := c.Events(ctx, "sandbox/"+old.ID)
		if err != nil || len(evs) < 2 || evs[len(evs)-2].To != "evacuating" || !evs[len(evs)-1].At.Before(deadline) {
			t.Fatalf("events of %s: %+v, %v; want evacuating → reconstructed before the deadline", old.ID, evs, err)
		}
	}
	running, err := c.Sandboxes(ctx, berth.SandboxRunning)
	if err != nil {
		t.Fatal(err)
	}
	replacements := 0
	for _, sb := range running {
		if sb.Metadata["evacuated_from"] != "" {
			replacements++
			if sb.AgentID != "dev-agent-2" {
				t.Fatalf("replacement %s placed on %s, the host under notice", sb.ID, sb.AgentID)
			}
		}
	}
	if replacements != 2 {
		t.Fatalf("%d replacements running, want 2 (one per reconstructible sandbox, the repeat changed nothing)", replacements)
	}
	waitFor(t, 30*time.Second, "the stateful sandbox reported as a budgeted loss", func() (bool, string) {
		sb, err := c.Sandbox(ctx, stateful.ID)
		return err == nil && sb.State == berth.SandboxLost && strings.Contains(sb.Reason, "budgeted loss"), fmt.Sprint(sb.State, sb.Reason, err)
	})
	if a := agentByID(t, c, "dev-agent-1"); a.Status != berth.AgentDraining {
		t.Fatalf("the host under notice is %s, want cordoned", a.Status)
	}
}
