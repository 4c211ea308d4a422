package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/process"
)

// warmAgent runs an agent with a warm pool on the real process runtime (isolated as root)
// and returns it, its runtime and its internal API's URL; the agent and every sandbox stop
// when the test ends, even on failure.
func warmAgent(t *testing.T, cfg agent.Config) (*agent.Agent, *process.Runtime, string) {
	t.Helper()
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt, err := process.New(process.Config{Dir: t.TempDir(), Logger: discard, Insecure: os.Geteuid() != 0})
	if err != nil {
		t.Fatalf("process.New: %v", err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("runtime Close: %v", err)
		}
	})
	cfg.ID, cfg.NodeToken, cfg.HeadroomMiB, cfg.Logger = "a1", agent.TestToken, 0, discard
	cfg.MeasureInterval = 100 * time.Millisecond
	cfg.PressureSource = func() (float64, bool) { return 0, true } // the shared machine's PSI is not this test's
	a, err := agent.New(cfg, process.AgentRuntime(rt))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a, rt, a.Heartbeat(time.Now()).Address
}

// waitUntil polls cond until it holds, failing the test after a minute (a bound, not a
// timing claim: a warm guest's start is a real process start on a shared machine).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond) // real: the pool's refill loop starts real processes
	}
}

func postCreate(t *testing.T, base string, c berth.AgentCreate) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(c)
	return agent.Call(t, http.MethodPost, base+"/internal/sandboxes", b, nil)
}

// metric returns the value of one series on the agent's /metrics, "" when absent.
func metric(t *testing.T, base, series string) string {
	t.Helper()
	_, body := agent.Call(t, http.MethodGet, base+"/metrics", nil, nil)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			return v
		}
	}
	return ""
}

// TestWarmPool_HitServesFromPoolAndRefills (issue 16, goal 5): a create of a pooled
// template and size is handed the warm guest itself — the sandbox id reaches that running
// guest (exec answers), the hit is counted — and the pool starts a new warm guest after;
// a create of another size is a miss, started cold; a delete stops the warm guest it got.
func TestWarmPool_HitServesFromPoolAndRefills(t *testing.T) {
	cfg := agent.DefaultConfig()
	cfg.MemoryMiB = 8192
	cfg.WarmPool = []agent.WarmPoolEntry{{Template: "shell", MemoryMiB: 256, Size: 1}}
	a, rt, base := warmAgent(t, cfg)
	waitUntil(t, "the pool holds a started shell guest", func() bool { return len(agent.WarmReady(a, "shell")) == 1 })
	warm := agent.WarmReady(a, "shell")[0]

	if code, body := postCreate(t, base, berth.AgentCreate{ID: "s1", Template: "shell", MemoryMiB: 256, TTLMS: 3_600_000}); code != http.StatusCreated {
		t.Fatalf("create = %d %s, want 201", code, body)
	}
	if got := agent.RuntimeID(a, "s1"); got != warm {
		t.Fatalf("s1 runs as %q, want the warm guest %q (served from the pool)", got, warm)
	}
	b, _ := json.Marshal(berth.ExecRequest{Cmd: []string{"echo", "warm"}})
	code, body := agent.Call(t, http.MethodPost, base+"/internal/sandboxes/s1/exec", b, nil)
	var res berth.ExecResult
	if err := json.Unmarshal(body, &res); code != http.StatusOK || err != nil || res.Stdout != "warm\n" {
		t.Fatalf("exec in s1 = %d %s, want 200 with stdout \"warm\\n\"", code, body)
	}
	if got := metric(t, base, `berth_agent_warm_pool_hits_total{agent="a1",template="shell"}`); got != "1" {
		t.Fatalf("hits = %q, want 1", got)
	}
	waitUntil(t, "the pool is refilled with another guest", func() bool {
		r := agent.WarmReady(a, "shell")
		return len(r) == 1 && r[0] != warm
	})
	if hb := a.Heartbeat(time.Now()); len(hb.Sandboxes) != 1 || hb.Sandboxes[0].ID != "s1" || hb.Sandboxes[0].Starting {
		t.Fatalf("heartbeat lists %+v, want s1 running and no warm guest", hb.Sandboxes)
	}

	if code, body := postCreate(t, base, berth.AgentCreate{ID: "s2", Template: "shell", MemoryMiB: 512, TTLMS: 3_600_000}); code != http.StatusCreated {
		t.Fatalf("create of another size = %d %s, want 201", code, body)
	}
	if got := agent.RuntimeID(a, "s2"); got != "s2" {
		t.Fatalf("s2 runs as %q, want itself (a cold start)", got)
	}
	if got := metric(t, base, `berth_agent_warm_pool_misses_total{agent="a1",template="shell"}`); got != "1" {
		t.Fatalf("misses = %q, want 1", got)
	}

	if code, body := agent.Call(t, http.MethodDelete, base+"/internal/sandboxes/s1", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete s1 = %d %s", code, body)
	}
	if _, err := rt.Measure(warm); berth.ErrorCode(err) != berth.ESandboxNotFound {
		t.Fatalf("after deleting s1, its warm guest %s measures %v, want sandbox_not_found (stopped)", warm, err)
	}
}

// TestWarmPool_CreateTakesThePoolsRoom (issue 16, goal 5): the pool never makes a host
// refuse a real create. Committed mode, 1024 MiB, two warm guests of 256 MiB: the agent
// publishes all 1024 MiB as admittable; a cold create of 768 MiB is admitted by stopping
// one warm guest first (only as many as it needs), and the pool refills when the room
// comes back.
func TestWarmPool_CreateTakesThePoolsRoom(t *testing.T) {
	cfg := agent.DefaultConfig()
	cfg.Admission = berth.AdmissionCommitted
	cfg.MemoryMiB = 1024
	cfg.WarmPool = []agent.WarmPoolEntry{{Template: "shell", MemoryMiB: 256, Size: 2}}
	a, rt, base := warmAgent(t, cfg)
	waitUntil(t, "the pool holds two started guests", func() bool { return len(agent.WarmReady(a, "shell")) == 2 })
	warm := agent.WarmReady(a, "shell")
	if got := a.Heartbeat(time.Now()).MemoryMiBAdmittable; got != 1024 {
		t.Fatalf("published admittable = %d MiB with a full pool, want 1024 (the pool's room is a create's)", got)
	}

	if code, body := postCreate(t, base, berth.AgentCreate{ID: "big", Template: "python", MemoryMiB: 768, TTLMS: 3_600_000}); code != http.StatusCreated {
		t.Fatalf("create of 768 MiB beside a 512 MiB pool = %d %s, want 201 (room taken from the pool)", code, body)
	}
	var stopped, running []string
	for _, id := range warm {
		if _, err := rt.Measure(id); berth.ErrorCode(err) == berth.ESandboxNotFound {
			stopped = append(stopped, id)
		} else {
			running = append(running, id)
		}
	}
	if len(stopped) != 1 || !slices.Equal(agent.WarmReady(a, "shell"), running) {
		t.Fatalf("warm guests stopped %v, running %v, pool %v: want exactly one stopped and the other still pooled",
			stopped, running, agent.WarmReady(a, "shell"))
	}
	if got := a.Heartbeat(time.Now()).MemoryMiBAdmittable; got != 256 {
		t.Fatalf("published admittable = %d MiB, want 256 (1024 − 768; the pool's guest is a create's room)", got)
	}

	if code, body := agent.Call(t, http.MethodDelete, base+"/internal/sandboxes/big", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete big = %d %s", code, body)
	}
	waitUntil(t, "the pool refills to two", func() bool { return len(agent.WarmReady(a, "shell")) == 2 })
}
