package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/preempt"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/process"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/server"
	"github.com/berth-dev/berth/store/postgres"
)

// pgFleet is Berth on PostgreSQL: in-process replicas, replicas run as real processes, and
// real agents with the process runtime.
type pgFleet struct {
	db, adminKey, nodeToken, data string
	seed                          *postgres.Store
	urls                          []string
	log                           *slog.Logger
}

func newPGFleet(t *testing.T) *pgFleet {
	t.Helper()
	ctx := context.Background()
	f := &pgFleet{db: pgtest.Start(t).NewDatabase(t), nodeToken: server.NewKeySecret(), data: t.TempDir(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	st, err := postgres.Open(ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f.seed = st
	if err := seedTemplates(ctx, st); err != nil {
		t.Fatal(err)
	}
	if f.adminKey, err = ensureAdminKey(ctx, st, filepath.Join(f.data, "admin.key")); err != nil {
		t.Fatal(err)
	}
	return f
}

// replica starts an in-process replica with its own connection pool and returns its URL.
func (f *pgFleet) replica(t *testing.T, mutate func(*server.Config)) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := postgres.Open(ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.NodeToken, cfg.Logger = f.nodeToken, f.log
	cfg.HeartbeatInterval = 100 * time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	srv := server.New(cfg, st)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = hs.Serve(ln) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		_ = hs.Close()
		wg.Wait()
		st.Close()
	})
	url := "http://" + ln.Addr().String()
	f.urls = append(f.urls, url)
	return url
}

// processReplica runs `berth server --store <db>` as a real process (this test binary
// playing berth) and returns its URL and the process, which the test may SIGKILL.
func (f *pgFleet) processReplica(t *testing.T) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "server", "--store", f.db, "--listen", "127.0.0.1:0",
		"--data", f.data, "--reservation-ttl", "3s", "--heartbeat-interval", "1s", "--replica-id", "doomed")
	cmd.Env = append(os.Environ(), envRunMain+"=1", "BERTH_NODE_TOKEN="+f.nodeToken)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by its PID: the process this test started
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("replica process said nothing: %v", err)
	}
	_, url, ok := strings.Cut(strings.TrimSpace(line), " at ")
	if !ok {
		t.Fatalf("unexpected first line from the replica process: %q", line)
	}
	url, _, _ = strings.Cut(url, " ")
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return url, cmd
}

// agent starts a real agent (process runtime, committed admission) heartbeating to url.
func (f *pgFleet) agent(t *testing.T, id, url string, memMiB int64) *agent.Agent {
	t.Helper()
	rt, err := process.New(process.Config{Dir: filepath.Join(t.TempDir(), id), Logger: f.log, Insecure: os.Geteuid() != 0})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.ID, cfg.Admission, cfg.MemoryMiB, cfg.HeadroomMiB = id, berth.AdmissionCommitted, memMiB, 0
	cfg.HeartbeatInterval, cfg.MeasureInterval = 100*time.Millisecond, 100*time.Millisecond
	cfg.ServerURL, cfg.NodeToken, cfg.Logger = url, f.nodeToken, f.log
	a, err := agent.New(cfg, process.AgentRuntime(rt))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = rt.Close()
	})
	waitFor(t, 30*time.Second, "agent "+id+" registered", func() (bool, string) {
		_, err := f.seed.Agent(context.Background(), id)
		return err == nil, fmt.Sprint(err)
	})
	return a
}

func createAt(t *testing.T, url, key, idem string) (int, berth.ErrorDetail) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/sandboxes", strings.NewReader(`{"template":"python"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	if idem != "" {
		req.Header.Set(berth.HeaderIdempotencyKey, idem)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, berth.ErrorDetail{Code: "transport"}
	}
	defer resp.Body.Close()
	var eb berth.ErrorBody
	b, _ := io.ReadAll(resp.Body)
	_ = jsonUnmarshal(b, &eb)
	return resp.StatusCode, eb.Error
}

// TestLED1_BurstAcrossReplicasRealAgent: 4 replicas on PostgreSQL, one real agent with room
// for exactly 4 reserves, 40 concurrent creates round-robin over the replicas, 20 rounds:
// every round admits exactly 4, every refusal comes from the ledger (never from the agent
// catching an over-admission), and the ledger is empty at the end (LED-1, LED-3).
func TestLED1_BurstAcrossReplicasRealAgent(t *testing.T) {
	f := newPGFleet(t)
	for range 4 {
		f.replica(t, nil)
	}
	f.agent(t, "burst-agent", f.urls[0], 4*512)
	c := client.New(f.urls[1], f.adminKey)
	ctx := context.Background()
	emptySince := time.Now()
	for round := range 20 {
		// The room N is the agent's own verdict: wait for a heartbeat built after the last
		// round's deletes (an older one still charges them, LED-4's one-heartbeat lag).
		waitFor(t, 30*time.Second, "an empty host", func() (bool, string) {
			a, err := f.seed.Agent(ctx, "burst-agent")
			rs, _ := f.seed.Reservations(ctx)
			return err == nil && a.HeartbeatAt.After(emptySince) && a.MemoryMiBAdmittable == 4*512 && len(a.Sandboxes) == 0 && len(rs) == 0,
				fmt.Sprintf("heartbeat at %v, admittable %d, %d held, %d reservations", a.HeartbeatAt, a.MemoryMiBAdmittable, len(a.Sandboxes), len(rs))
		})
		var mu sync.Mutex
		outcomes := map[string]int{}
		msgs := map[string]int{}
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Go(func() {
				code, e := createAt(t, f.urls[i%4], f.adminKey, "")
				mu.Lock()
				defer mu.Unlock()
				switch {
				case code == http.StatusCreated:
					outcomes["created"]++
				case e.Code == berth.ENoCapacity && e.Hosts["saturated"] == 0:
					outcomes["refused by the ledger"]++
					msgs[e.Message]++
				default:
					outcomes[fmt.Sprintf("%d %s %v", code, e.Code, e.Hosts)]++
				}
			})
		}
		wg.Wait()
		if outcomes["created"] != 4 || outcomes["refused by the ledger"] != 36 {
			a, _ := f.seed.Agent(ctx, "burst-agent")
			rs, _ := f.seed.Reservations(ctx)
			all, _ := f.seed.Sandboxes(ctx, berth.SandboxFilter{})
			for _, sb := range all {
				if !sb.State.Terminal() {
					evs, _ := f.seed.Events(ctx, berth.EventFilter{Entity: "sandbox/" + sb.ID})
					t.Logf("live %s %s %+v", sb.ID, sb.State, evs)
				}
			}
			for _, h := range a.Sandboxes {
				evs, _ := f.seed.Events(ctx, berth.EventFilter{Entity: "sandbox/" + h.ID})
				t.Logf("held %s: %+v", h.ID, evs)
			}
			t.Fatalf("round %d: %v, want 4 created and 36 refused by the ledger; messages %v; agent admittable %d held %v; reservations %+v",
				round, outcomes, msgs, a.MemoryMiBAdmittable, a.Sandboxes, rs)
		}
		running, err := c.Sandboxes(ctx, berth.SandboxRunning)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range running {
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Fatalf("round %d: delete: %v", round, err)
			}
		}
		emptySince = time.Now()
	}
	if rs, _ := f.seed.Reservations(ctx); len(rs) != 0 {
		t.Fatalf("%d reservations outstanding after the last round", len(rs))
	}
}

// TestKillReplicaMidCreate: a replica process SIGKILLed in the middle of creates leaves no
// reservation behind after the TTL, and retrying each create with its Idempotency-Key on
// another replica yields exactly one sandbox per key, which its agent really runs (API-4,
// LED-2, LIF-1).
func TestKillReplicaMidCreate(t *testing.T) {
	f := newPGFleet(t)
	survivor := f.replica(t, func(c *server.Config) {
		c.ReservationTTL, c.SweepInterval, c.StartingGrace = 3*time.Second, 200*time.Millisecond, 5*time.Second
	})
	f.agent(t, "kill-agent", survivor, 16*512)
	doomed, proc := f.processReplica(t)
	ctx := context.Background()
	keys := make([]string, 8)
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = fmt.Sprintf("job-%d", i)
		wg.Go(func() { createAt(t, doomed, f.adminKey, keys[i]) })
	}
	waitFor(t, 30*time.Second, "the doomed replica to start creating", func() (bool, string) {
		sbs, err := f.seed.Sandboxes(ctx, berth.SandboxFilter{})
		return err == nil && len(sbs) > 0, fmt.Sprint(err)
	})
	if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = proc.Wait()
	wg.Wait()

	c := client.New(survivor, f.adminKey, client.WithDeadline(60*time.Second))
	got := map[string]string{}
	for _, k := range keys {
		sb, err := c.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "python"}, k)
		if err != nil {
			t.Fatalf("retry of %s on the survivor: %v", k, err)
		}
		got[k] = sb.ID
	}
	sbs, err := f.seed.Sandboxes(ctx, berth.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]int{}
	for _, sb := range sbs {
		if sb.State != berth.SandboxFailed {
			live[sb.IdempotencyKey]++
			if got[sb.IdempotencyKey] != sb.ID {
				t.Errorf("live sandbox %s (%s, key %q) is not the one the retry returned", sb.ID, sb.State, sb.IdempotencyKey)
			}
		}
	}
	for _, k := range keys {
		if live[k] != 1 {
			t.Errorf("key %s has %d live sandboxes, want exactly 1", k, live[k])
		}
	}
	waitAgent := func(limit time.Duration, what string, cond func() (bool, string)) {
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			if ok, _ := cond(); ok {
				return
			}
			time.Sleep(50 * time.Millisecond) // real: agents are real processes talking HTTP to servers on PostgreSQL
		}
		_, msg := cond()
		t.Errorf("timed out waiting for %s; last: %s", what, msg)
	}
	waitAgent(30*time.Second, "the agent to run exactly the 8 sandboxes", func() (bool, string) {
		a, err := f.seed.Agent(ctx, "kill-agent")
		if err != nil {
			return false, err.Error()
		}
		held := map[string]bool{}
		for _, h := range a.Sandboxes {
			held[h.ID] = true
		}
		for _, id := range got {
			if !held[id] {
				return false, "missing " + id
			}
		}
		return len(held) == len(got), fmt.Sprintf("agent holds %d", len(held))
	})
	if t.Failed() {
		for _, sb := range sbs {
			evs, _ := f.seed.Events(ctx, berth.EventFilter{Entity: "sandbox/" + sb.ID})
			t.Logf("%s key=%s state=%s events=%+v", sb.ID, sb.IdempotencyKey, sb.State, evs)
		}
	}
	waitFor(t, 30*time.Second, "no reservation left after the TTL", func() (bool, string) {
		rs, err := f.seed.Reservations(ctx)
		return err == nil && len(rs) == 0, fmt.Sprintf("%d left", len(rs))
	})
}

// processAgent runs `berth agent --id id` (committed admission, 2048 MiB, no headroom,
// 100 ms heartbeats, plus extra flags) as a real process heartbeating to url, for a test to
// SIGKILL. Cleanup kills it by its PID and stops the sandboxes it left, as a restarted agent
// on the same directory would.
func (f *pgFleet) processAgent(t *testing.T, url, id string, extra ...string) *exec.Cmd {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"agent", "--server", url, "--id", id, "--admission", "committed", "--memory-mb", "2048",
		"--headroom-mb", "0", "--heartbeat-interval", "100ms", "--dir", dir}, extra...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), envRunMain+"=1", "BERTH_NODE_TOKEN="+f.nodeToken)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by the PID this test started
		_ = cmd.Wait()
		// A killed agent cannot remove its cgroups or stop its sandboxes; a runtime on the
		// same directory cleans up what an earlier run left, as a restarted agent would.
		if rt, err := process.New(process.Config{Dir: dir, Logger: f.log, Insecure: os.Geteuid() != 0}); err == nil {
			_ = rt.Close()
		}
	})
	return cmd
}

// TestAgentKilled: `kill -9` of an agent process (a real `berth agent`): no placement lands
// there after the staleness cutoff, and its sandboxes become lost within the lease TTL, each
// with an event, so nothing is reported running that is not (LIF-2, SPOT-5, PLC-1).
func TestAgentKilled(t *testing.T) {
	f := newPGFleet(t)
	url := f.replica(t, func(c *server.Config) {
		c.StaleAfter, c.LeaseEphemeral, c.SweepInterval = time.Second, 2*time.Second, 100*time.Millisecond
	})
	cmd := f.processAgent(t, url, "doomed-agent", "--pool", "ephemeral")
	ctx := context.Background()
	waitFor(t, 30*time.Second, "the agent process to register", func() (bool, string) {
		_, err := f.seed.Agent(ctx, "doomed-agent")
		return err == nil, fmt.Sprint(err)
	})
	c := client.New(url, f.adminKey, client.WithDeadline(time.Second))
	var ids []string
	for range 2 {
		sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for _, id := range ids {
		waitFor(t, 30*time.Second, id+" lost", func() (bool, string) {
			sb, err := f.seed.Sandbox(ctx, id)
			return err == nil && sb.State == berth.SandboxLost, fmt.Sprint(sb.State, err)
		})
		evs, err := f.seed.Events(ctx, berth.EventFilter{Entity: "sandbox/" + id})
		if err != nil || len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Reason, "lease expired") {
			t.Fatalf("events of %s: %+v, %v; want the last one to say the lease expired", id, evs, err)
		}
	}
	code, e := createAt(t, url, f.adminKey, "")
	if code != http.StatusServiceUnavailable || e.Code != berth.ENoHealthyAgents {
		t.Fatalf("create with the only agent dead: %d %+v, want 503 no_healthy_agents", code, e)
	}
	running, err := c.Sandboxes(ctx, berth.SandboxRunning)
	if err != nil || len(running) != 0 {
		t.Fatalf("running sandboxes after the agent died: %+v, %v; want none", running, err)
	}
}

// startAgentIn runs an agent with the process runtime in dir until the returned stop is
// called (which waits for it to end). The same id and dir again is a restart.
func (f *pgFleet) startAgentIn(t *testing.T, id, url, dir string, rt agent.Runtime, memMiB int64, mutate ...func(*agent.Config)) (stop func()) {
	t.Helper()
	var prt *process.Runtime
	if rt == nil {
		var err error
		prt, err = process.New(process.Config{Dir: dir, Logger: f.log, Insecure: os.Geteuid() != 0})
		if err != nil {
			t.Fatal(err)
		}
		rt = process.AgentRuntime(prt)
	}
	cfg := agent.DefaultConfig()
	cfg.ID, cfg.Admission, cfg.MemoryMiB, cfg.HeadroomMiB = id, berth.AdmissionCommitted, memMiB, 0
	cfg.HeartbeatInterval, cfg.MeasureInterval = 100*time.Millisecond, 100*time.Millisecond
	cfg.ServerURL, cfg.NodeToken, cfg.Logger = url, f.nodeToken, f.log
	for _, m := range mutate {
		m(&cfg)
	}
	a, err := agent.New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if prt != nil {
				_ = prt.Close()
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestAGT6_RestartedAgentReconciles: an agent restarted with the same id (a new boot) holds
// nothing of its old sandboxes; the store marks them lost with an event, and the host takes
// new work again.
func TestAGT6_RestartedAgentReconciles(t *testing.T) {
	f := newPGFleet(t)
	url := f.replica(t, nil)
	ctx := context.Background()
	// A real `berth agent` process, killed with SIGKILL: the host goes down with its
	// sandbox, without a last word (a clean shutdown reports its sandboxes stopped instead).
	rt := []string{"--runtime", "process"}
	if os.Geteuid() != 0 {
		rt = append(rt, "--insecure")
	}
	first := f.processAgent(t, url, "phoenix", rt...)
	waitFor(t, 30*time.Second, "phoenix registered", func() (bool, string) {
		_, err := f.seed.Agent(ctx, "phoenix")
		return err == nil, fmt.Sprint(err)
	})
	c := client.New(url, f.adminKey, client.WithDeadline(5*time.Second))
	old, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	_ = first.Process.Kill() // by the PID this test started
	_ = first.Wait()
	f.processAgent(t, url, "phoenix", rt...)
	waitFor(t, 30*time.Second, "the old sandbox lost after the restart", func() (bool, string) {
		sb, err := f.seed.Sandbox(ctx, old.ID)
		return err == nil && sb.State == berth.SandboxLost, fmt.Sprint(sb.State, err)
	})
	evs, err := f.seed.Events(ctx, berth.EventFilter{Entity: "sandbox/" + old.ID})
	if err != nil || evs[len(evs)-1].Reason != "agent restarted without it" {
		t.Fatalf("events: %+v, %v", evs, err)
	}
	waitFor(t, 30*time.Second, "the restarted host to take work", func() (bool, string) {
		sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
		return err == nil && sb.AgentID == "phoenix", fmt.Sprint(err)
	})
}

// failingRuntime accepts nothing: every start fails, as a host with a broken runtime would.
type failingRuntime struct{ starts atomic.Int64 }

func (r *failingRuntime) Start(context.Context, agent.Spec) error {
	r.starts.Add(1)
	return errors.New("runtime broken: cannot create the sandbox")
}
func (r *failingRuntime) Stop(context.Context, string) error { return nil }
func (r *failingRuntime) Exec(context.Context, string, berth.ExecRequest) (berth.ExecResult, error) {
	return berth.ExecResult{}, errors.New("broken")
}
func (r *failingRuntime) WriteFile(context.Context, string, string, io.Reader) error {
	return errors.New("broken")
}
func (r *failingRuntime) ReadFile(context.Context, string, string) (io.ReadCloser, int64, error) {
	return nil, 0, errors.New("broken")
}
func (r *failingRuntime) Measure(string) (agent.Measurement, error) { return agent.Measurement{}, nil }

// TestCase_C19_RealAgentQuarantined: a real agent whose runtime fails every create is
// quarantined after 3 failures while a healthy host takes the creates (PLC-9).
func TestCase_C19_RealAgentQuarantined(t *testing.T) {
	f := newPGFleet(t)
	url := f.replica(t, func(c *server.Config) {
		c.Quarantine = berth.QuarantinePolicy{After: 3, Backoff: time.Hour, MaxBackoff: time.Hour}
	})
	broken := &failingRuntime{}
	// Far more room on the broken host: placement prefers it whatever the CPU figures say,
	// so it is tried until quarantined (0.3 per free GiB outweighs 0.6 per free core).
	f.startAgentIn(t, "a-broken", url, t.TempDir(), broken, 64<<10)
	f.startAgentIn(t, "b-healthy", url, t.TempDir(), nil, 4096)
	ctx := context.Background()
	waitFor(t, 30*time.Second, "both agents registered", func() (bool, string) {
		as, err := f.seed.Agents(ctx)
		return err == nil && len(as) == 2, fmt.Sprint(len(as), err)
	})
	c := client.New(url, f.adminKey, client.WithDeadline(5*time.Second))
	for i := range 6 {
		sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
		if err != nil || sb.AgentID != "b-healthy" {
			t.Fatalf("create %d: %+v, %v; want it on the healthy host", i, sb, err)
		}
	}
	if n := broken.starts.Load(); n != 3 {
		t.Fatalf("the broken host got %d starts, want exactly 3 before its quarantine", n)
	}
	a, err := f.seed.Agent(ctx, "a-broken")
	if err != nil || a.QuarantinedUntil.IsZero() {
		t.Fatalf("broken agent: %+v, %v; want quarantined", a, err)
	}
	evs, err := f.seed.Events(ctx, berth.EventFilter{Entity: "agent/a-broken", To: string(berth.AgentQuarantined)})
	if err != nil || len(evs) != 1 {
		t.Fatalf("quarantine events: %+v, %v", evs, err)
	}
}

// noticeServer serves one provider's documented metadata formats on loopback, with the
// notice present from the start and repeated on every poll (C13). polls counts the requests.
func noticeServer(t *testing.T, provider string, acks, polls *atomic.Int64) *httptest.Server {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute).UTC()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		polls.Add(1)
		switch provider {
		case "gcp":
			time.Sleep(20 * time.Millisecond) // real: paces a real HTTP handler (a hanging GET that answers at once, again and again)
			if strings.HasSuffix(r.URL.Path, "/maintenance-event") {
				io.WriteString(w, "NONE")
				return
			}
			io.WriteString(w, "TRUE")
		case "aws":
			switch r.URL.Path {
			case "/latest/api/token":
				io.WriteString(w, "token")
			case "/latest/meta-data/spot/instance-action":
				fmt.Fprintf(w, `{"action": "terminate", "time": %q}`, deadline.Format(time.RFC3339))
			default:
				w.WriteHeader(http.StatusNotFound)
			}
		case "azure":
			if r.Method == http.MethodPost {
				acks.Add(1)
				return
			}
			if r.URL.Path == "/metadata/instance/compute/name" {
				io.WriteString(w, "doomed-vm") // this VM's name, which the event names (C27)
				return
			}
			fmt.Fprintf(w, `{"DocumentIncarnation": 8, "Events": [{"EventId": "ev-1", "EventType": "Preempt", "Resources": ["doomed-vm"], "NotBefore": %q}]}`,
				deadline.Format(time.RFC1123))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestSPOT1_NoticeCordonsOnEveryReplica: for each provider, a notice from a loopback metadata
// server cordons the host, and every replica's next placement avoids it; the notice repeated
// on every poll yields one cordon and one evacuation plan (SPOT-1, SPOT-2, C13).
func TestSPOT1_NoticeCordonsOnEveryReplica(t *testing.T) {
	for _, provider := range []string{"gcp", "aws", "azure"} {
		t.Run(provider, func(t *testing.T) {
			f := newPGFleet(t)
			r1 := f.replica(t, nil)
			r2 := f.replica(t, nil)
			ctx := context.Background()
			f.startAgentIn(t, "spare", r2, t.TempDir(), nil, 4096)
			var acks, polls atomic.Int64
			srv := noticeServer(t, provider, &acks, &polls)
			var w preempt.Watcher
			switch provider {
			case "gcp":
				w = preempt.GCP{BaseURL: srv.URL}
			case "aws":
				w = preempt.AWS{BaseURL: srv.URL, Poll: 50 * time.Millisecond}
			case "azure":
				w = preempt.Azure{BaseURL: srv.URL, Poll: 50 * time.Millisecond}
			}
			// The doomed host has far more room, so it would win every placement if it could.
			f.startAgentIn(t, "doomed", r1, t.TempDir(), nil, 64<<10, func(c *agent.Config) { c.Notices = w })
			waitFor(t, 30*time.Second, "the doomed host cordoned", func() (bool, string) {
				a, err := f.seed.Agent(ctx, "doomed")
				return err == nil && a.Status == berth.AgentDraining, fmt.Sprint(a.Status, err)
			})
			for _, url := range []string{r1, r2} {
				sb, err := client.New(url, f.adminKey, client.WithDeadline(5*time.Second)).
					CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
				if err != nil || sb.AgentID != "spare" {
					t.Fatalf("create through %s after the notice: %+v, %v; want it on the spare host", url, sb, err)
				}
			}
			// Several more polls of the repeated notice (the agent has handled all but the last).
			from := polls.Load()
			waitFor(t, 30*time.Second, "5 more polls of the notice", func() (bool, string) {
				return polls.Load() >= from+5, fmt.Sprint(polls.Load()-from, " polls")
			})
			evs, err := f.seed.Events(ctx, berth.EventFilter{Entity: "agent/doomed", To: string(berth.AgentDraining)})
			if err != nil || len(evs) != 1 {
				t.Fatalf("cordon events: %+v, %v; want exactly one", evs, err)
			}
			if provider == "azure" {
				waitFor(t, 10*time.Second, "the Azure event acknowledged once", func() (bool, string) {
					return acks.Load() == 1, fmt.Sprint(acks.Load())
				})
			}
		})
	}
}
