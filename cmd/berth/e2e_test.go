package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/gvisor"
	"github.com/berth-dev/berth/agent/runtime/process"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/pgtest"
)

func TestMain(m *testing.M) {
	process.MaybeRunInit() // this test binary doubles as the sandboxes' init (AGT-3)
	gvisor.MaybeRunInit()
	if os.Getenv(envRunMain) == "1" {
		// This test binary plays the berth binary for a replica the test runs as a real
		// process (so it can be killed with SIGKILL).
		// It exits and prints as the binary does (run), so tests can read its exit code.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := run(ctx, &clientFlags{}, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	pgtest.Main(m) // runs the tests, then stops the shared PostgreSQL
}

// envRunMain makes the test binary run Main with its arguments instead of the tests.
const envRunMain = "BERTH_TEST_RUN_MAIN"

// bootDev starts the dev stack on 127.0.0.1:0 with real process sandboxes (isolated as
// root; unisolated, with --insecure, otherwise) and stops it (and every sandbox) when the
// test ends, pass or fail. Tests of gVisor behaviour use bootGVisor.
func bootDev(t *testing.T, mutate func(*devConfig)) *devStack {
	t.Helper()
	return boot(t, func(c *devConfig) {
		c.Runtime.Runtime, c.Runtime.Insecure = runtimeProcess, os.Geteuid() != 0
		if mutate != nil {
			mutate(c)
		}
	})
}

// bootGVisor is bootDev on the gvisor runtime, as `berth dev` runs where runsc is installed.
// Without runsc (or root) the test skips locally and fails in CI, where .ci/run installs it.
func bootGVisor(t *testing.T, mutate func(*devConfig)) *devStack {
	t.Helper()
	if _, err := gvisor.Find(""); err != nil || os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI runs the gVisor tests as root with runsc installed: %v (euid %d)", err, os.Geteuid())
		}
		t.Skipf("gVisor tests need root and runsc: %v (euid %d)", err, os.Geteuid())
	}
	return boot(t, func(c *devConfig) {
		c.Runtime.Runtime = runtimeGVisor
		if mutate != nil {
			mutate(c)
		}
	})
}

func boot(t *testing.T, mutate func(*devConfig)) *devStack {
	t.Helper()
	cfg := defaultDevConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Data = t.TempDir()
	cfg.Agents = 1
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if mutate != nil {
		mutate(&cfg)
	}
	st, err := startDev(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start dev stack: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("close dev stack: %v", err)
		}
	})
	return st
}

// rawCreate posts one create with the admin key, without any client retry, and returns the
// status, the headers and the decoded body (sandbox or error).
func rawCreate(t *testing.T, st *devStack, body string) (int, http.Header, berth.Sandbox, berth.ErrorDetail) {
	t.Helper()
	code, hdr, b := rawPost(t, st, st.AdminKey, "/v1/sandboxes", body)
	var sb berth.Sandbox
	var eb berth.ErrorBody
	if code == http.StatusCreated {
		if err := json.Unmarshal(b, &sb); err != nil {
			t.Fatalf("decode sandbox %s: %v", b, err)
		}
	} else if err := json.Unmarshal(b, &eb); err != nil {
		t.Fatalf("decode error body %q (status %d): %v", b, code, err)
	}
	return code, hdr, sb, eb.Error
}

// rawPost posts body to path with key, without any client retry, and returns the status, the
// headers and the body.
func rawPost(t *testing.T, st *devStack, key, path, body string) (int, http.Header, []byte) {
	t.Helper()
	code, h, b, err := post(st, key, path, body)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return code, h, b
}

// post is rawPost for any goroutine: a transport error is returned, not a test failure.
func post(st *devStack, key, path, body string) (int, http.Header, []byte, error) {
	req, _ := http.NewRequest(http.MethodPost, st.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, nil
}

func adminClient(st *devStack, opts ...client.Option) *client.Client {
	return client.New(st.URL, st.AdminKey, opts...)
}

// waitFor polls cond every 50 ms until it holds or limit passes (waiting for a state,
// not asserting a duration).
func waitFor(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	last := ""
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(50 * time.Millisecond) // real: servers, agents and sandboxes are real processes and sockets
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

func agentByID(t *testing.T, c *client.Client, id string) berth.Agent {
	t.Helper()
	as, err := c.Agents(context.Background())
	if err != nil {
		t.Fatalf("agents: %v", err)
	}
	for _, a := range as {
		if a.AgentID == id {
			return a
		}
	}
	t.Fatalf("agent %s not listed", id)
	return berth.Agent{}
}

func outstanding(t *testing.T, st *devStack) []berth.Reservation {
	t.Helper()
	rs, err := st.Store.Reservations(context.Background())
	if err != nil {
		t.Fatalf("reservations: %v", err)
	}
	return rs
}

// TestE2E_README is the README's walk-through: create a python sandbox, print 2+2, write a
// file and read it back, kill it.
func TestE2E_README(t *testing.T) {
	st := bootDev(t, nil)
	ctx := context.Background()
	c := adminClient(st)
	sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	res, err := c.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"python3", "-c", "print(2+2)"}})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if res.Stdout != "4\n" || res.ExitCode != 0 {
		t.Fatalf("exec = %+v, want stdout 4", res)
	}
	// ISO-4: the agent says which runtime it runs, and that this one cannot checkpoint.
	if a := agentByID(t, c, sb.AgentID); a.Runtime != "process" || a.Checkpoint {
		t.Fatalf("agent reports runtime %q, checkpoint %t; want process without checkpoints", a.Runtime, a.Checkpoint)
	}
	if _, err := c.PauseSandbox(ctx, sb.ID); berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("pause on the process runtime: %v, want conflict", err)
	}
	if err := c.WriteFile(ctx, sb.ID, "/tmp/hello.txt", []byte("hello berth")); err != nil {
		t.Fatalf("write: %v", err)
	}
	got, err := c.ReadFile(ctx, sb.ID, "/tmp/hello.txt")
	if err != nil || string(got) != "hello berth" {
		t.Fatalf("read = %q, %v", got, err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	after, err := c.Sandbox(ctx, sb.ID)
	if err != nil || after.State != berth.SandboxStopped {
		t.Fatalf("after delete: %+v, %v", after, err)
	}
	evs, err := c.Events(ctx, "sandbox/"+sb.ID)
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	var path []string
	for _, e := range evs {
		path = append(path, e.From+"→"+e.To)
	}
	if want := "pending→starting,starting→running,running→stopping,stopping→stopped"; strings.Join(path, ",") != want {
		t.Fatalf("events %v, want %s (LIF-3)", path, want)
	}
}

// TestE2E_CommittedAdmitsExactlyFour: ADM-2 with 2048 MiB, no headroom and 512 MiB
// sandboxes admits 4; the 5th is an honest 503 (API-2, C21).
func TestE2E_CommittedAdmitsExactlyFour(t *testing.T) {
	st := bootDev(t, func(c *devConfig) {
		c.Admission, c.AgentMemoryMiB, c.HeadroomMiB = berth.AdmissionCommitted, 2048, 0
	})
	for i := range 4 {
		if code, _, _, e := rawCreate(t, st, `{"template":"python"}`); code != http.StatusCreated {
			t.Fatalf("create %d: %d %+v", i+1, code, e)
		}
	}
	code, h, _, e := rawCreate(t, st, `{"template":"python"}`)
	if code != http.StatusServiceUnavailable || e.Code != berth.ENoCapacity {
		t.Fatalf("5th create: %d %+v, want 503 no_capacity", code, e)
	}
	if h.Get("Retry-After") == "" || e.RetryAfterS < 1 || !e.Retryable || e.RequestID == "" {
		t.Fatalf("5th create: Retry-After %q, body %+v: want a real estimate, retryable, request id", h.Get("Retry-After"), e)
	}
	if e.Hosts["total"] != 1 || e.Hosts["insufficient_memory"] != 1 {
		t.Fatalf("hosts = %v, want total 1, insufficient_memory 1 (C21)", e.Hosts)
	}
}

// TestE2E_WorkingSetAdmitsMore: ADM-3 with the same budget admits at least twice as many
// idle sandboxes once they are measured, and resident follows a real 100 MiB allocation.
func TestE2E_WorkingSetAdmitsMore(t *testing.T) {
	st := bootDev(t, func(c *devConfig) {
		c.Admission, c.AgentMemoryMiB, c.HeadroomMiB = berth.AdmissionWorkingSet, 2048, 0
	})
	const want = 10 // committed admits 4
	var ids []string
	for attempt := 0; len(ids) < want && attempt < 200; attempt++ {
		code, _, sb, e := rawCreate(t, st, `{"template":"python"}`)
		switch {
		case code == http.StatusCreated:
			ids = append(ids, sb.ID)
		case code == http.StatusServiceUnavailable && e.Code == berth.ENoCapacity:
			time.Sleep(200 * time.Millisecond) // real: a real agent's next measurement and heartbeat (bounded: 200 attempts)
		default:
			t.Fatalf("create: %d %+v", code, e)
		}
	}
	if len(ids) < 8 {
		t.Fatalf("working-set admitted %d idle sandboxes, want ≥ 8 (2× committed)", len(ids))
	}
	c := adminClient(st)
	ctx := context.Background()
	probe := ids[0]
	base := residentOf(t, c, probe)
	var last int64
	_, err := c.Exec(ctx, probe, berth.ExecRequest{Cmd: []string{"sh", "-c",
		`python3 -c "b=bytes(range(256))*(100*4096); import time; time.sleep(600)" >/dev/null 2>&1 &`}})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	waitFor(t, 30*time.Second, "resident 100 MiB ± 20 %", func() (bool, string) {
		r := residentOf(t, c, probe)
		last = r
		return r >= 80 && r <= 120, fmt.Sprintf("resident %d MiB, idle %d MiB", r, base)
	})
	t.Logf("idle sandbox resident %d MiB; with a 100 MiB background process %d MiB", base, last)
}

func residentOf(t *testing.T, c *client.Client, id string) int64 {
	t.Helper()
	for _, s := range agentByID(t, c, "dev-agent-1").Sandboxes {
		if s.ID == id {
			return s.ResidentMiB
		}
	}
	return -1
}

// TestCase_C20_ConcurrentCreatesExactlyN: 20 concurrent creates against one agent with room
// for exactly 4 reserves: exactly 4 succeed, the rest are no_capacity, and after deletes
// the ledger is empty (LED-1, LED-3).
func TestCase_C20_ConcurrentCreatesExactlyN(t *testing.T) {
	st := bootDev(t, func(c *devConfig) {
		c.Admission, c.AgentMemoryMiB, c.HeadroomMiB = berth.AdmissionCommitted, 2048, 0
		// No netting during the burst: the ledger alone decides (and the TTL is at least two
		// heartbeats, C31, so nothing expires either; the staleness cutoff too, PLC-1, so the
		// agent's one heartbeat keeps it placeable).
		c.HeartbeatInterval, c.ReservationTTL, c.StaleAfter = time.Hour, 2*time.Hour, 2*time.Hour
	})
	var mu sync.Mutex
	var ids []string
	codes := map[string]int{}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			code, _, sb, e := rawCreate(t, st, `{"template":"python"}`)
			mu.Lock()
			defer mu.Unlock()
			if code == http.StatusCreated {
				ids = append(ids, sb.ID)
				codes["created"]++
			} else {
				codes[e.Code]++
			}
		})
	}
	wg.Wait()
	if codes["created"] != 4 || codes[berth.ENoCapacity] != 16 {
		t.Fatalf("outcomes %v, want 4 created and 16 no_capacity", codes)
	}
	c := adminClient(st)
	for _, id := range ids {
		if err := c.DeleteSandbox(context.Background(), id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	if rs := outstanding(t, st); len(rs) != 0 {
		t.Fatalf("outstanding reservations after deletes: %+v", rs)
	}
}

// TestCase_C10_StaleAgentNeverChosen: an agent whose heartbeats stopped is never chosen;
// when it is the only one the answer is no_healthy_agents (PLC-1, PLC-4).
func TestCase_C10_StaleAgentNeverChosen(t *testing.T) {
	st := bootDev(t, func(c *devConfig) {
		c.Agents, c.StaleAfter = 2, time.Second
		c.AgentMemoryMiB, c.HeadroomMiB = 8192, 0 // the stopped agent has the most room
	})
	c := adminClient(st)
	st.StopAgent(1)
	waitFor(t, 10*time.Second, "dev-agent-2 stale", func() (bool, string) {
		a := agentByID(t, c, "dev-agent-2")
		return a.Status == berth.AgentStale, string(a.Status)
	})
	for i := range 4 {
		code, _, sb, e := rawCreate(t, st, `{"template":"shell"}`)
		if code != http.StatusCreated || sb.AgentID != "dev-agent-1" {
			t.Fatalf("create %d: %d on %q %+v, want placed on dev-agent-1", i, code, sb.AgentID, e)
		}
	}
	st.StopAgent(0)
	waitFor(t, 10*time.Second, "dev-agent-1 stale", func() (bool, string) {
		a := agentByID(t, c, "dev-agent-1")
		return a.Status == berth.AgentStale, string(a.Status)
	})
	code, h, _, e := rawCreate(t, st, `{"template":"shell"}`)
	if code != http.StatusServiceUnavailable || e.Code != berth.ENoHealthyAgents || h.Get("Retry-After") == "" {
		t.Fatalf("create with only stale agents: %d %+v, want 503 no_healthy_agents", code, e)
	}
	if e.Hosts["stale"] != 2 {
		t.Fatalf("hosts %v, want 2 stale", e.Hosts)
	}
}

// countingTransport counts answers by status, to prove the SDK really was refused first.
type countingTransport struct{ n503 atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
		c.n503.Add(1)
	}
	return resp, err
}

// TestE2E_SDKWaitsForTTL: the SDK, refused while a sandbox's TTL is about to free room,
// retries (honouring Retry-After, SDK-1) and succeeds within its deadline (AGT-7, API-3).
func TestE2E_SDKWaitsForTTL(t *testing.T) {
	st := bootDev(t, func(c *devConfig) {
		c.Admission, c.AgentMemoryMiB, c.HeadroomMiB = berth.AdmissionCommitted, 1024, 0
	})
	ctx := context.Background()
	for _, ttl := range []int{5, 3600} {
		code, _, _, e := rawCreate(t, st, fmt.Sprintf(`{"template":"python","ttl_seconds":%d}`, ttl))
		if code != http.StatusCreated {
			t.Fatalf("fill: %d %+v", code, e)
		}
	}
	// API-3: the refusal's Retry-After comes from the TTL ending in ~5 s (plus a heartbeat).
	code, h, _, e := rawCreate(t, st, `{"template":"python"}`)
	if code != http.StatusServiceUnavailable || e.Code != berth.ENoCapacity {
		t.Fatalf("full fleet: %d %+v", code, e)
	}
	if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < 1 || ra > 10 {
		t.Fatalf("Retry-After %q with a TTL ending in about 5 s, want 1..10 s", h.Get("Retry-After"))
	}
	ct := &countingTransport{}
	c := adminClient(st, client.WithHTTPClient(&http.Client{Transport: ct}), client.WithDeadline(60*time.Second))
	sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
	if err != nil {
		t.Fatalf("SDK create after TTL: %v", err)
	}
	if ct.n503.Load() == 0 {
		t.Fatalf("the SDK was never refused; the test proves nothing")
	}
	if sb.State != berth.SandboxRunning {
		t.Fatalf("sandbox %+v", sb)
	}
}

// TestE2E_BadInput sends bad input to every endpoint: each gets its 4xx and code, never a
// 500, and nothing is left half-written.
func TestE2E_BadInput(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.Admission = berth.AdmissionCommitted })
	ctx := context.Background()
	c := adminClient(st)
	sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	before, _ := st.Store.Sandboxes(ctx, berth.SandboxFilter{})
	evBefore, _ := st.Store.Events(ctx, berth.EventFilter{Limit: 10000})
	admin := "Bearer " + st.AdminKey
	big := `{"template":"python","metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`
	sbPath := "/v1/sandboxes/" + sb.ID
	cases := []struct {
		name, method, path, auth, body string
		status                         int
		code                           string
	}{
		{"malformed JSON", "POST", "/v1/sandboxes", admin, `{"template":`, 400, berth.EInvalidRequest},
		{"not an object", "POST", "/v1/sandboxes", admin, `[1,2]`, 400, berth.EInvalidRequest},
		{"empty body", "POST", "/v1/sandboxes", admin, ``, 400, berth.EInvalidRequest},
		{"unknown field", "POST", "/v1/sandboxes", admin, `{"template":"python","memroy_mb":5}`, 400, berth.EInvalidRequest},
		{"trailing data", "POST", "/v1/sandboxes", admin, `{"template":"python"}{}`, 400, berth.EInvalidRequest},
		{"missing template", "POST", "/v1/sandboxes", admin, `{}`, 400, berth.EInvalidRequest},
		{"unknown template", "POST", "/v1/sandboxes", admin, `{"template":"cobol"}`, 404, berth.ETemplateNotFound},
		{"negative memory", "POST", "/v1/sandboxes", admin, `{"template":"python","memory_mb":-1}`, 400, berth.EInvalidRequest},
		{"larger than any host", "POST", "/v1/sandboxes", admin, `{"template":"python","memory_mb":100000}`, 400, berth.EInvalidRequest},
		{"absurd memory", "POST", "/v1/sandboxes", admin, `{"template":"python","memory_mb":99999999999}`, 400, berth.EInvalidRequest},
		{"memory overflow", "POST", "/v1/sandboxes", admin, `{"template":"python","memory_mb":1e30}`, 400, berth.EInvalidRequest},
		{"memory as string", "POST", "/v1/sandboxes", admin, `{"template":"python","memory_mb":"512"}`, 400, berth.EInvalidRequest},
		{"negative vcpus", "POST", "/v1/sandboxes", admin, `{"template":"python","vcpus":-2}`, 400, berth.EInvalidRequest},
		{"huge TTL", "POST", "/v1/sandboxes", admin, `{"template":"python","ttl_seconds":9999999999}`, 400, berth.EInvalidRequest},
		{"negative TTL", "POST", "/v1/sandboxes", admin, `{"template":"python","ttl_seconds":-5}`, 400, berth.EInvalidRequest},
		{"bad pool", "POST", "/v1/sandboxes", admin, `{"template":"python","pool":"gold"}`, 400, berth.EInvalidRequest},
		{"bad volume name", "POST", "/v1/sandboxes", admin, `{"template":"python","volume":"../etc"}`, 400, berth.EInvalidRequest},
		{"volume on ephemeral", "POST", "/v1/sandboxes", admin, `{"template":"python","volume":"v1","pool":"ephemeral"}`, 400, berth.EInvalidRequest},
		{"oversized body", "POST", "/v1/sandboxes", admin, big, 413, berth.ETooLarge},
		{"missing key", "POST", "/v1/sandboxes", "", `{"template":"python"}`, 401, berth.EUnauthorized},
		{"wrong key", "POST", "/v1/sandboxes", "Bearer nope", `{"template":"python"}`, 401, berth.EUnauthorized},
		{"unknown sandbox get", "GET", "/v1/sandboxes/sb-nope", admin, ``, 404, berth.ESandboxNotFound},
		{"unknown sandbox delete", "DELETE", "/v1/sandboxes/sb-nope", admin, ``, 404, berth.ESandboxNotFound},
		{"unknown sandbox exec", "POST", "/v1/sandboxes/sb-nope/exec", admin, `{"cmd":["true"]}`, 404, berth.ESandboxNotFound},
		{"bad state filter", "GET", "/v1/sandboxes?state=melting", admin, ``, 400, berth.EInvalidRequest},
		{"exec empty cmd", "POST", sbPath + "/exec", admin, `{"cmd":[]}`, 400, berth.EInvalidRequest},
		{"exec malformed", "POST", sbPath + "/exec", admin, `{"cmd":"ls"}`, 400, berth.EInvalidRequest},
		{"exec negative timeout", "POST", sbPath + "/exec", admin, `{"cmd":["true"],"timeout_s":-1}`, 400, berth.EInvalidRequest},
		{"exec huge timeout", "POST", sbPath + "/exec", admin, `{"cmd":["true"],"timeout_s":999999}`, 400, berth.EInvalidRequest},
		{"exec missing key", "POST", sbPath + "/exec", "", `{"cmd":["true"]}`, 401, berth.EUnauthorized},
		{"file relative path", "PUT", sbPath + "/files?path=etc/x", admin, `x`, 400, berth.EInvalidRequest},
		{"file dotdot path", "PUT", sbPath + "/files?path=/tmp/../etc/x", admin, `x`, 400, berth.EInvalidRequest},
		{"file no path", "GET", sbPath + "/files", admin, ``, 400, berth.EInvalidRequest},
		{"file missing", "GET", sbPath + "/files?path=/tmp/nothing-here", admin, ``, 404, berth.ENotFound},
		{"file unknown sandbox", "GET", "/v1/sandboxes/sb-nope/files?path=/tmp/x", admin, ``, 404, berth.ESandboxNotFound},
		{"drain unknown agent", "POST", "/v1/agents/nope/drain", admin, `{}`, 404, berth.ENotFound},
		{"drain malformed", "POST", "/v1/agents/dev-agent-1/drain", admin, `{"reason":`, 400, berth.EInvalidRequest},
		{"drain reason too long", "POST", "/v1/agents/dev-agent-1/drain", admin, `{"reason":"` + strings.Repeat("x", 100_000) + `"}`, 400, berth.EInvalidRequest},
		{"events entity of no kind", "GET", "/v1/events?entity=bogus", admin, ``, 400, berth.EInvalidRequest},
		{"events to no state", "GET", "/v1/events?to=bogus", admin, ``, 400, berth.EInvalidRequest},
		{"tenant that exists", "POST", "/v1/tenants", admin, `{"name":"default"}`, 409, berth.EConflict},
		{"memory beyond an integer", "POST", "/v1/sandboxes", admin, `{"template":"python","memory_mb":9223372036854775808}`, 400, berth.EInvalidRequest},
		{"undrain unknown agent", "POST", "/v1/agents/nope/undrain", admin, ``, 404, berth.ENotFound},
		{"agents missing key", "GET", "/v1/agents", "", ``, 401, berth.EUnauthorized},
		{"events bad since", "GET", "/v1/events?since=yesterday", admin, ``, 400, berth.EInvalidRequest},
		{"events bad limit", "GET", "/v1/events?limit=-3", admin, ``, 400, berth.EInvalidRequest},
		{"events bad until", "GET", "/v1/events?until=tomorrow", admin, ``, 400, berth.EInvalidRequest},
		{"events bad type", "GET", "/v1/events?type=volcano", admin, ``, 400, berth.EInvalidRequest},
		{"events type and entity disagree", "GET", "/v1/events?type=agent&entity=sandbox/x", admin, ``, 400, berth.EInvalidRequest},
		{"drain status unknown agent", "GET", "/v1/agents/nope/drain", admin, ``, 404, berth.ENotFound},
		{"templates wrong key", "GET", "/v1/templates", "Bearer nope", ``, 401, berth.EUnauthorized},
		{"template bad memory", "PUT", "/v1/templates/big", admin, `{"memory_mb":-1,"vcpus":1}`, 400, berth.EInvalidRequest},
		{"heartbeat wrong token", "POST", "/v1/agents/heartbeat", admin, `{"agent_id":"x"}`, 401, berth.EUnauthorized},
		{"tenant bad name", "POST", "/v1/tenants", admin, `{"name":"Not OK!"}`, 400, berth.EInvalidRequest},
		{"key unknown tenant", "POST", "/v1/tenants/nobody/keys", admin, `{"role":"tenant"}`, 404, berth.ENotFound},
		{"key bad role", "POST", "/v1/tenants/default/keys", admin, `{"role":"root"}`, 400, berth.EInvalidRequest},
		{"quota negative", "PUT", "/v1/tenants/default/quota", admin, `{"max_sandboxes":-1}`, 400, berth.EInvalidRequest},
		{"quota unknown tenant", "PUT", "/v1/tenants/nobody/quota", admin, `{"max_sandboxes":1}`, 404, berth.ENotFound},
		{"quota malformed", "PUT", "/v1/tenants/default/quota", admin, `{"max_sandboxes":"lots"}`, 400, berth.EInvalidRequest},
		{"unknown route", "GET", "/v1/nothing", admin, ``, 404, berth.ENotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, st.URL+tc.path, bytes.NewReader([]byte(tc.body)))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var eb berth.ErrorBody
			b, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(b, &eb); err != nil {
				t.Fatalf("status %d, body %q is not an error body", resp.StatusCode, b)
			}
			if resp.StatusCode != tc.status || eb.Error.Code != tc.code {
				t.Fatalf("got %d %s (%s), want %d %s", resp.StatusCode, eb.Error.Code, eb.Error.Message, tc.status, tc.code)
			}
		})
	}
	after, _ := st.Store.Sandboxes(ctx, berth.SandboxFilter{})
	if len(after) != len(before) {
		t.Fatalf("bad input changed the sandbox table: %d → %d rows", len(before), len(after))
	}
	evAfter, _ := st.Store.Events(ctx, berth.EventFilter{Limit: 10000})
	for _, e := range evAfter[len(evBefore):] {
		if strings.HasPrefix(e.Entity, "sandbox/") {
			t.Errorf("bad input wrote a sandbox event: %+v", e)
		}
	}
	if rs := outstanding(t, st); len(rs) > 1 {
		t.Fatalf("bad input left reservations: %+v", rs)
	}
	if _, err := c.Sandbox(ctx, sb.ID); err != nil {
		t.Fatalf("the good sandbox is gone: %v", err)
	}
	var berr *berth.Error
	_, err = c.CreateSandbox(ctx, berth.CreateRequest{Template: "cobol"})
	if !errors.As(err, &berr) || berr.Code != berth.ETemplateNotFound {
		t.Fatalf("SDK unknown template: %v", err)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// TestE2E_ShutdownRecordsStopped: an agent that shuts down (berth dev's Ctrl-C, SIGTERM to
// berth agent) stops its sandboxes and says so on a last heartbeat: they end stopped, not
// left running for the next boot to call lost.
func TestE2E_ShutdownRecordsStopped(t *testing.T) {
	st := bootDev(t, nil)
	ctx := context.Background()
	c := adminClient(st)
	sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	st.StopAgent(0)
	got, err := c.Sandbox(ctx, sb.ID)
	if err != nil || got.State != berth.SandboxStopped || got.Reason != "agent shut down" {
		t.Fatalf("after the agent's shutdown: %s (%s), %v; want stopped, agent shut down", got.State, got.Reason, err)
	}
}
