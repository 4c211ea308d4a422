package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// fakeClock is a settable clock for the reconciler's retry times.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (h *harness) do(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (h *harness) app(t *testing.T, name string) berth.App {
	t.Helper()
	a, err := h.st.App(context.Background(), name)
	must(t, err)
	return a
}

// running starts the server's loops (sweeper, app reconciler) until the test ends.
func (h *harness) running(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go h.s.Run(ctx)
}

// createApp posts an app whose command is cmd (JSON array) on port 8080 and fails the test
// unless it is created.
func (h *harness) createApp(t *testing.T, name, cmd string) {
	t.Helper()
	body := `{"name":"` + name + `","template":"python","command":` + cmd + `,"port":8080,"memory_mb":256}`
	if code, out := h.do(t, http.MethodPost, "/v1/apps", body); code != http.StatusCreated {
		t.Fatalf("create app %s: %d %s", name, code, out)
	}
}

func waitUntil(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(10 * time.Millisecond) // real: the server's loops reach fake agents over loopback HTTP
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

// TestAPP2_RefusalsNeverError: an app refused by the scheduler waits in waiting_capacity;
// the reconciler does not retry before the server's Retry-After (30 s for no_healthy_agents),
// retries after it with full jitter on top, never moves the app to error however many
// times it is refused, and once a host appears the app runs and MET-4 counts the wait.
func TestAPP2_RefusalsNeverError(t *testing.T) {
	clk := &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)}
	h := newHarnessWith(t, func(c *Config) {
		c.Clock, c.AppReconcileInterval = clk.Now, 5*time.Millisecond
	})
	h.running(t)
	h.createApp(t, "web", `["python3","-m","http.server","8080"]`)
	waitUntil(t, "waiting_capacity", func() (bool, string) {
		a := h.app(t, "web")
		return a.State == berth.AppWaitingCapacity, string(a.State)
	})
	a := h.app(t, "web")
	if a.RetryCode != berth.ENoHealthyAgents || a.Attempts != 1 {
		t.Fatalf("first refusal: %+v; want no_healthy_agents, attempt 1", a)
	}
	if wait := a.RetryAt.Sub(a.WaitingSince); wait < 30*time.Second || wait >= 30*time.Second+berth.BackoffBase {
		t.Fatalf("next try in %v; want Retry-After (30 s) plus a jitter under the first window (%v)", wait, berth.BackoffBase)
	}
	// Before Retry-After has passed nothing is tried, whatever the rounds.
	clk.Add(29 * time.Second)
	// Ten whole rounds of the app's reconciler after the clock moved (the one in flight may
	// have read the old time: one more); nothing may happen in them.
	from := h.s.appDone.Load()
	waitUntil(t, "10 reconciler rounds", func() (bool, string) {
		n := h.s.appDone.Load() - from
		return n >= 11, fmt.Sprint(n, " rounds")
	})
	if a := h.app(t, "web"); a.Attempts != 1 {
		t.Fatalf("attempts %d before Retry-After passed; want 1", a.Attempts)
	}
	for i := 2; i <= 8; i++ {
		clk.Add(40 * time.Second)
		waitUntil(t, fmt.Sprintf("attempt %d", i), func() (bool, string) {
			a := h.app(t, "web")
			return a.Attempts >= i, fmt.Sprint(a.Attempts, a.State)
		})
		if a := h.app(t, "web"); a.State != berth.AppWaitingCapacity {
			t.Fatalf("after %d refusals: %s (%s); want waiting_capacity", i, a.State, a.Reason)
		}
	}
	evs, err := h.st.Events(context.Background(), berth.EventFilter{Entity: "app/web"})
	must(t, err)
	if len(evs) != 2 || evs[1].To != string(berth.AppWaitingCapacity) {
		t.Fatalf("events %+v; want created, then one deploying→waiting_capacity (retries write none)", evs)
	}

	agent := newFakeAgent(t, "")
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	clk.Add(40 * time.Second)
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	waitUntil(t, "running", func() (bool, string) {
		a := h.app(t, "web")
		return a.State == berth.AppRunning, string(a.State) + " " + a.Reason
	})
	if a := h.app(t, "web"); a.AgentID != "a1" || !a.WaitingSince.IsZero() || a.Attempts != 0 {
		t.Fatalf("running app: %+v; want on a1 with the wait cleared", a)
	}
	if code, body := h.do(t, http.MethodGet, "/apps/web/", ""); code != http.StatusOK || body != "app answer" {
		t.Fatalf("request: %d %q", code, body)
	}
	if n := histogramCount(t, h, "app"); n != 1 {
		t.Fatalf("MET-4 app count %d; want 1", n)
	}
}

// TestAPP2_StaleListRetriesNotEarly: a reconciler round works from the app list it read when
// it began, and the round before may have refused the app after that read (setting its next
// try after Retry-After). Started from that stale copy, with the clock not moving, the app is
// not tried again before Retry-After; once Retry-After has passed, the same stale copy retries
// it. (Under load, rounds overlapped this way and TestAPP2_RefusalsNeverError saw a second
// attempt without the fake clock moving.)
func TestAPP2_StaleListRetriesNotEarly(t *testing.T) {
	clk := &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)}
	h := newHarnessWith(t, func(c *Config) { c.Clock = clk.Now })
	h.createApp(t, "web", `["python3","-m","http.server","8080"]`) // no reconciler loop runs
	ctx := context.Background()
	listed := h.app(t, "web") // what a round's list holds
	h.s.reconcileApp(ctx, listed)
	if a := h.app(t, "web"); a.State != berth.AppWaitingCapacity || a.Attempts != 1 {
		t.Fatalf("after the first round: %s, %d attempts; want waiting_capacity after 1", a.State, a.Attempts)
	}
	h.s.reconcileApp(ctx, listed) // the next round, from the list read before the refusal
	if a := h.app(t, "web"); a.State != berth.AppWaitingCapacity || a.Attempts != 1 {
		t.Fatalf("a round from a stale list, the clock not moved: %s, %d attempts; want still 1 (%s)", a.State, a.Attempts, a.Reason)
	}
	clk.Add(40 * time.Second) // past Retry-After (30 s) and its jitter
	h.s.reconcileApp(ctx, listed)
	if a := h.app(t, "web"); a.State != berth.AppWaitingCapacity || a.Attempts != 2 {
		t.Fatalf("a round from a stale list after Retry-After: %s, %d attempts; want the retry (2)", a.State, a.Attempts)
	}
}

func histogramCount(t *testing.T, h *harness, kind string) uint64 {
	t.Helper()
	mfs, err := h.s.cfg.Registry.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "berth_api_time_to_success_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	t.Fatalf("no MET-4 series for kind %s", kind)
	return 0
}

// TestAPP1_BadInput: every malformed app call is a 4xx with a stable code and writes
// nothing; never a 500.
func TestAPP1_BadInput(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {})
	ok := `"template":"python","command":["x"],"port":8080`
	cases := []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/apps", `{"name":"Web",` + ok + `}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"-web",` + ok + `}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"` + strings.Repeat("a", 64) + `",` + ok + `}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web","template":"python","command":[],"port":8080}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web","template":"python","command":["x"],"port":0}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web","template":"python","command":["x"],"port":70000}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web","template":"nope","command":["x"],"port":8080}`, 404, berth.ETemplateNotFound},
		{"POST", "/v1/apps", `{"name":"web",` + ok + `,"memory_mb":-1}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web",` + ok + `,"files":{"../x":"a"}}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web",` + ok + `,"files":{"/etc/x":"a"}}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web",` + ok + `,"env":{"A=B":"a"}}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web",` + ok + `,"desired":"dancing"}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web",` + ok + `,"idle_seconds":-5}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web",` + ok + `,"extra":1}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web",`, 400, berth.EInvalidRequest},
		{"GET", "/v1/apps/nope", ``, 404, berth.EAppNotFound},
		{"POST", "/v1/apps/nope/deploy", `{` + ok + `}`, 404, berth.EAppNotFound},
		{"POST", "/v1/apps/nope/wake", ``, 404, berth.EAppNotFound},
		{"DELETE", "/v1/apps/nope", ``, 404, berth.EAppNotFound},
		{"GET", "/apps/nope/", ``, 404, berth.EAppNotFound},
		{"GET", "/apps/nope/a/%2e%2e/%2e%2e/exec", ``, 400, berth.EInvalidRequest},
		// A path past what an agent's listener reads was a retryable 503 (found by an attack).
		{"GET", "/apps/nope/" + strings.Repeat("p", 100<<10), ``, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps", `{"name":"web",` + ok + `,"files":{"a/./b//c":"x"}}`, 400, berth.EInvalidRequest},
		{"POST", "/v1/apps/nope/idle", `{"idle_seconds":5}`, 404, berth.EAppNotFound},
	}
	for _, tc := range cases {
		code, body := h.do(t, tc.method, tc.path, tc.body)
		if code != tc.status || !strings.Contains(body, `"code":"`+tc.code+`"`) {
			t.Errorf("%s %s %s: %d %s; want %d %s", tc.method, tc.path, tc.body, code, body, tc.status, tc.code)
		}
	}
	if apps, err := h.st.Apps(context.Background(), ""); err != nil || len(apps) != 0 {
		t.Fatalf("apps after bad input: %+v, %v; want none written", apps, err)
	}
	// A taken name is a conflict; a stopped app answers app_stopped and is not woken.
	if code, body := h.do(t, "POST", "/v1/apps", `{"name":"web",`+ok+`,"desired":"stopped"}`); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := h.do(t, "POST", "/v1/apps", `{"name":"web",`+ok+`}`); code != 409 || !strings.Contains(body, berth.EConflict) {
		t.Fatalf("taken name: %d %s", code, body)
	}
	if code, body := h.do(t, "GET", "/apps/web/", ""); code != 409 || !strings.Contains(body, berth.EAppStopped) {
		t.Fatalf("request to a stopped app: %d %s", code, body)
	}
	if a := h.app(t, "web"); a.Desired != berth.DesireStopped || a.State != berth.AppStopped {
		t.Fatalf("stopped app after a request: %+v", a)
	}
	for _, body := range []string{`{}`, `{"idle_seconds":-1}`, `{"idle_seconds":99999999999}`} {
		if code, out := h.do(t, "POST", "/v1/apps/web/idle", body); code != 400 || !strings.Contains(out, berth.EInvalidRequest) {
			t.Errorf("idle %s: %d %s; want 400 invalid_request", body, code, out)
		}
	}
	if code, out := h.do(t, "POST", "/v1/apps/web/idle", `{"idle_seconds":0}`); code != 202 || h.app(t, "web").IdleSeconds != 0 {
		t.Fatalf("idle 0: %d %s", code, out)
	}
	// Memory no host can ever hold is refused at once, like a sandbox create (not an app
	// in error later).
	h.heartbeat(t, "a1", "http://127.0.0.1:1", 4096)
	must(t, h.s.sched.refresh(context.Background())) // the heartbeat went straight to the store
	if code, out := h.do(t, "POST", "/v1/apps", `{"name":"huge",`+ok+`,"memory_mb":999999}`); code != 400 || !strings.Contains(out, "can never be placed") {
		t.Fatalf("app larger than any host: %d %s; want 400", code, out)
	}
}

// TestAPP2_NeverListensIsError: a command that runs but never answers on its port within
// AppStartTimeout is the app's own fault: after AppStartFailures starts the app is in error
// with a one-line reason naming the port, and its sandboxes are stopped; before that the
// reason says what failed even though the state did not change.
func TestAPP2_NeverListensIsError(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.AppReconcileInterval, c.AppStartTimeout, c.AppBackoffBase, c.AppBackoffCap = 5*time.Millisecond, 100*time.Millisecond, time.Millisecond, 10*time.Millisecond
	})
	agent := newFakeAgent(t, "")
	agent.appDown = true
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	h.running(t)
	h.createApp(t, "deaf", `["sleep","1000"]`)
	waitUntil(t, "error", func() (bool, string) {
		a := h.app(t, "deaf")
		return a.State == berth.AppError, string(a.State) + " " + a.Reason
	})
	a := h.app(t, "deaf")
	if a.StartFailures != 3 || !strings.Contains(a.Reason, "nothing answered on port 8080") || strings.Contains(a.Reason, "\n") || !a.RetryAt.IsZero() {
		t.Fatalf("app: %d failures, reason %q, retry_at %v; want 3, the port named on one line, no retry time", a.StartFailures, a.Reason, a.RetryAt)
	}
	if n := agent.deletes.Load(); n != 3 {
		t.Fatalf("%d sandboxes stopped; want the 3 that never served", n)
	}
}

// TestAPP1_DeleteDuringSetUpStopsTheSandbox: an app deleted while its start waits for the
// command to answer does not keep that sandbox for the rest of the wait (AppStartTimeout is
// an hour here): the start notices and stops it, saying why.
func TestAPP1_DeleteDuringSetUpStopsTheSandbox(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.AppReconcileInterval, c.AppStartTimeout = 5*time.Millisecond, time.Hour
	})
	agent := newFakeAgent(t, "")
	agent.appDown = true
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	h.running(t)
	h.createApp(t, "gone", `["sleep","1000"]`)
	waitUntil(t, "the start's sandbox", func() (bool, string) { return agent.creates.Load() == 1, "" })
	if code, body := h.do(t, http.MethodDelete, "/v1/apps/gone", ""); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	// The agent is told first and the row recorded after: wait for both.
	waitUntil(t, "the sandbox stopped", func() (bool, string) {
		sbs, err := h.st.Sandboxes(context.Background(), berth.SandboxFilter{})
		must(t, err)
		return agent.deletes.Load() == 1 && len(sbs) == 1 && sbs[0].State.Terminal(), fmt.Sprintf("%d deletes, %+v", agent.deletes.Load(), sbs)
	})
	sbs, err := h.st.Sandboxes(context.Background(), berth.SandboxFilter{})
	must(t, err)
	if len(sbs) != 1 || sbs[0].State != berth.SandboxStopped || !strings.Contains(sbs[0].Reason, "deleted or changed") {
		t.Fatalf("sandboxes %+v; want the one start's sandbox stopped because the app went", sbs)
	}
}

// TestAPP2_TenantQuotaWaitsNotErrors: an app its tenant's quota holds back (ADM-11) waits in
// waiting_capacity with the code tenant_over_quota — a retry fixes it once the tenant's other
// sandboxes end — and runs when one does.
func TestAPP2_TenantQuotaWaitsNotErrors(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.AppReconcileInterval, c.AppBackoffBase, c.AppBackoffCap = 5*time.Millisecond, time.Millisecond, 20*time.Millisecond
	})
	agent := newFakeAgent(t, "")
	h.heartbeat(t, "a1", agent.srv.URL, 8192)
	must(t, h.st.SetQuota(context.Background(), berth.Quota{Tenant: "acme", MaxSandboxes: 1}, "test", time.Now()))
	code, sb, _ := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("first sandbox: %d", code)
	}
	h.running(t)
	h.createApp(t, "q", `["x"]`)
	waitUntil(t, "waiting for quota", func() (bool, string) {
		a := h.app(t, "q")
		return a.State == berth.AppWaitingCapacity && a.RetryCode == berth.ETenantOverQuota && a.Attempts >= 3, fmt.Sprint(a.State, a.RetryCode, a.Attempts)
	})
	if code, body := h.do(t, http.MethodDelete, "/v1/sandboxes/"+sb.ID, ""); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	waitUntil(t, "running", func() (bool, string) {
		a := h.app(t, "q")
		return a.State == berth.AppRunning, string(a.State) + " " + a.Reason
	})
	evs, err := h.st.Events(context.Background(), berth.EventFilter{Entity: "app/q"})
	must(t, err)
	for _, e := range evs {
		if e.To == string(berth.AppError) {
			t.Fatalf("app events %+v: never error for a quota", evs)
		}
	}
}
