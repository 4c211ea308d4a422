package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/preempt"
	"github.com/berth-dev/berth/server"
)

// appServer is a tiny HTTP app: it answers "<MSG> <path>" on port 8080 inside its sandbox.
const appServer = `import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (os.environ.get("MSG", "hello") + " " + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8080), H).serve_forever()
`

// appSpec is appServer answering msg, in a sandbox of memMiB.
func appSpec(msg string, memMiB int64) berth.AppSpec {
	return berth.AppSpec{
		Template: "python", MemoryMiB: memMiB, Port: 8080,
		Command: []string{"python3", "server.py"},
		Files:   map[string]string{"server.py": appServer},
		Env:     map[string]string{"MSG": msg},
	}
}

// getApp sends one GET to the app through the server (no client retry) and returns the
// status, the Retry-After header, the body and the error code of an error body.
func getApp(t *testing.T, base, name, path string) (int, string, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/apps/"+name+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /apps/%s%s: %v", name, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	code := ""
	if resp.StatusCode >= 400 {
		var eb berth.ErrorBody
		if jsonUnmarshal(b, &eb) == nil {
			code = eb.Error.Code
		}
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b), code
}

// waitApp waits (bounded) until the app is in state.
func waitApp(t *testing.T, c *client.Client, name string, state berth.AppState, limit time.Duration) berth.App {
	t.Helper()
	var a berth.App
	waitFor(t, limit, "app "+name+" "+string(state), func() (bool, string) {
		var err error
		a, err = c.App(context.Background(), name)
		return err == nil && a.State == state, fmt.Sprintf("%s (%s) %v", a.State, a.Reason, err)
	})
	return a
}

// appStory returns the app's transitions as "from→to" (reasons after a colon when full).
func appStory(t *testing.T, c *client.Client, name string, full bool) []string {
	t.Helper()
	evs, err := c.Events(context.Background(), "app/"+name)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		s := e.From + "→" + e.To
		if full {
			s += ": " + e.Reason
		}
		out = append(out, s)
	}
	return out
}

// watchStates records every state the app is seen in (polled every 20 ms) until stop.
func watchStates(c *client.Client, name string) (stop func() []berth.AppState) {
	var mu sync.Mutex
	var seen []berth.AppState
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
			if a, err := c.App(context.Background(), name); err == nil {
				mu.Lock()
				if len(seen) == 0 || seen[len(seen)-1] != a.State {
					seen = append(seen, a.State)
				}
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return func() []berth.AppState {
		close(done)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// TestAPP1_HibernateAndWakeOnRequest: an app whose server answers HTTP is created on real
// process sandboxes, serves, hibernates when idle (its sandbox stops), and a request to it
// wakes it and gets the app's answer — with an event for every transition.
func TestAPP1_HibernateAndWakeOnRequest(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.AppsDomain = "apps.test" })
	c := adminClient(st, client.WithDeadline(5*time.Second))
	ctx := context.Background()
	req := berth.AppRequest{Name: "hello", AppSpec: appSpec("hello from v1", 256), IdleSeconds: 2}
	if _, err := c.CreateApp(ctx, req); err != nil {
		t.Fatal(err)
	}
	a := waitApp(t, c, "hello", berth.AppRunning, 60*time.Second)
	if code, _, body, _ := getApp(t, st.URL, "hello", "/first?x=1"); code != http.StatusOK || body != "hello from v1 /first?x=1" {
		t.Fatalf("running app answered %d %q", code, body)
	}
	first := a.SandboxID
	// The same app by Host header under --apps-domain, in any case and fully qualified.
	for _, host := range []string{"hello.apps.test", "Hello.Apps.Test.", "hello.apps.test.:80"} {
		byHost, _ := http.NewRequest(http.MethodGet, st.URL+"/by-host", nil)
		byHost.Host = host
		resp, err := http.DefaultClient.Do(byHost)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != "hello from v1 /by-host" {
			t.Fatalf("Host %s: %d %q; want the app's answer", host, resp.StatusCode, b)
		}
	}

	// Idle for 2 s: hibernated, and its sandbox stopped.
	a = waitApp(t, c, "hello", berth.AppHibernated, 60*time.Second)
	if a.SandboxID != "" || a.Desired != berth.DesireHibernated {
		t.Fatalf("hibernated app: %+v; want no sandbox and desired hibernated", a)
	}
	waitFor(t, 30*time.Second, "the hibernated app's sandbox to stop", func() (bool, string) {
		sb, err := c.Sandbox(ctx, first)
		return err == nil && sb.State.Terminal(), fmt.Sprint(sb.State, err)
	})

	// A request wakes it and is held until it answers.
	if code, _, body, _ := getApp(t, st.URL, "hello", "/again"); code != http.StatusOK || body != "hello from v1 /again" {
		t.Fatalf("request to the hibernated app: %d %q; want the app's answer", code, body)
	}
	a, err := c.App(ctx, "hello")
	if err != nil || a.State != berth.AppRunning || a.SandboxID == first || a.SandboxID == "" {
		t.Fatalf("woken app: %+v, %v; want running from a new sandbox", a, err)
	}
	want := []string{"→deploying", "deploying→running", "running→hibernated", "hibernated→waking", "waking→running"}
	if got := appStory(t, c, "hello", false); !slices.Equal(got, want) {
		t.Fatalf("app events %q; want %q", got, want)
	}
	// Unknown apps are 404 app_not_found; /apps/hello redirects to /apps/hello/.
	if code, _, _, ecode := getApp(t, st.URL, "nope", "/"); code != http.StatusNotFound || ecode != berth.EAppNotFound {
		t.Fatalf("unknown app: %d %s", code, ecode)
	}
	if code, _, body, _ := getApp(t, st.URL, "hello", ""); code != http.StatusOK || body != "hello from v1 /" {
		t.Fatalf("/apps/hello (redirected): %d %q", code, body)
	}
}

// fillFleet creates n sandboxes of memMiB: the last one with a TTL of ttl (so it frees room
// by itself), the others living past the test. It returns the short-lived one's id.
func fillFleet(t *testing.T, c *client.Client, n int, memMiB int64, ttl time.Duration) string {
	t.Helper()
	var short string
	for i := range n {
		req := berth.CreateRequest{Template: "shell", MemoryMiB: memMiB, TTLSeconds: 3600}
		if i == n-1 {
			req.TTLSeconds = int64(ttl / time.Second)
		}
		sb, err := c.CreateSandbox(context.Background(), req)
		if err != nil {
			t.Fatalf("filling the fleet (%d of %d): %v", i+1, n, err)
		}
		short = sb.ID
	}
	return short
}

// committedDev is one agent of 1024 MiB under committed admission: four 256 MiB guests fill it.
func committedDev(c *devConfig) {
	c.Admission, c.AgentMemoryMiB, c.HeadroomMiB = berth.AdmissionCommitted, 1024, 0
}

// TestAPP2_WakeOnFullFleetWaitsForCapacity: with the fleet full, a request to a hibernated
// app puts it in waiting_capacity (an event) and gets 503 with Retry-After; when a
// sandbox's TTL frees room the app comes up by itself and serves; at no point was it in
// error; the time from the first refusal to running is in MET-4's histogram (kind="app").
func TestAPP2_WakeOnFullFleetWaitsForCapacity(t *testing.T) {
	st := bootDev(t, committedDev)
	c := adminClient(st, client.WithDeadline(5*time.Second))
	ctx := context.Background()
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "sleepy", AppSpec: appSpec("awake", 256), Desired: berth.DesireHibernated}); err != nil {
		t.Fatal(err)
	}
	short := fillFleet(t, c, 4, 256, 6*time.Second)
	stop := watchStates(c, "sleepy")

	code, retryAfter, _, ecode := getApp(t, st.URL, "sleepy", "/")
	if code != http.StatusServiceUnavailable || ecode != berth.ENoCapacity {
		t.Fatalf("request on a full fleet: %d %s; want 503 no_capacity", code, ecode)
	}
	if n, err := strconv.Atoi(retryAfter); err != nil || n < 1 {
		t.Fatalf("Retry-After %q; want whole seconds ≥ 1", retryAfter)
	}
	a, err := c.App(ctx, "sleepy")
	if err != nil || a.State != berth.AppWaitingCapacity || a.RetryCode != berth.ENoCapacity {
		t.Fatalf("app after the refusal: %+v, %v; want waiting_capacity (no_capacity)", a, err)
	}
	// While it waits, requests keep getting 503 + Retry-After, never an error.
	if code, ra, _, ecode := getApp(t, st.URL, "sleepy", "/"); code == http.StatusServiceUnavailable && (ra == "" || ecode != berth.ENoCapacity) {
		t.Fatalf("second request while waiting: %d %q %s", code, ra, ecode)
	}

	// The short sandbox's TTL frees room; the app comes up by itself.
	waitApp(t, c, "sleepy", berth.AppRunning, 90*time.Second)
	if sb, err := c.Sandbox(ctx, short); err != nil || !sb.State.Terminal() {
		t.Fatalf("the short-lived sandbox: %+v, %v; want ended by its TTL", sb, err)
	}
	if code, _, body, _ := getApp(t, st.URL, "sleepy", "/now"); code != http.StatusOK || body != "awake /now" {
		t.Fatalf("after room freed: %d %q", code, body)
	}
	seen := stop()
	if slices.Contains(seen, berth.AppError) {
		t.Fatalf("the app was in error at some point: %v", seen)
	}
	story := appStory(t, c, "sleepy", true)
	if !slices.ContainsFunc(story, func(s string) bool {
		return strings.HasPrefix(s, "waking→waiting_capacity: no_capacity")
	}) || strings.Contains(strings.Join(story, "\n"), "→error") {
		t.Fatalf("app events %q; want waking→waiting_capacity (no_capacity) and never error", story)
	}
	fams := scrape(t, st)
	if n, ok := value(fams, "berth_api_time_to_success_seconds", map[string]string{"kind": "app"}); !ok || n != 1 {
		t.Fatalf("MET-4 histogram count for apps = %v (%v); want 1 (refused, then running)", n, ok)
	}
	if n, ok := value(fams, "berth_apps", map[string]string{"state": "running"}); !ok || n != 1 {
		t.Fatalf("berth_apps{state=running} = %v (%v); want 1", n, ok)
	}
	if n, ok := value(fams, "berth_apps", map[string]string{"state": "error"}); !ok || n != 0 {
		t.Fatalf("berth_apps{state=error} = %v (%v); want 0", n, ok)
	}
	t.Logf("states seen: %v; events: %q", seen, story)
}

// TestAPP2_DeployOnFullFleetKeepsOldVersionServing: a deploy that cannot be placed leaves
// the old version serving and the app waiting_capacity; when room frees, the new version
// takes over and the old sandbox stops. No request in between fails.
func TestAPP2_DeployOnFullFleetKeepsOldVersionServing(t *testing.T) {
	st := bootDev(t, committedDev)
	c := adminClient(st, client.WithDeadline(5*time.Second))
	ctx := context.Background()
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "web", AppSpec: appSpec("v1", 256)}); err != nil {
		t.Fatal(err)
	}
	v1 := waitApp(t, c, "web", berth.AppRunning, 60*time.Second)
	fillFleet(t, c, 3, 256, 6*time.Second)

	// Requests run all along; each must get v1 or v2's answer.
	var served, failed atomic.Int64
	var lastFail atomic.Value
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); {
			select {
			case <-done:
				return
			default:
			}
			code, _, body, _ := getApp(t, st.URL, "web", "/")
			if code == http.StatusOK && (body == "v1 /" || body == "v2 /") {
				served.Add(1)
			} else {
				failed.Add(1)
				lastFail.Store(fmt.Sprintf("%d %q", code, body))
			}
			time.Sleep(20 * time.Millisecond) // real: paces client traffic to a real server during a deploy
		}
	})
	defer func() { close(done); wg.Wait() }()

	if _, err := c.DeployApp(ctx, "web", appSpec("v2", 256)); err != nil {
		t.Fatal(err)
	}
	a := waitApp(t, c, "web", berth.AppWaitingCapacity, 30*time.Second)
	if a.SandboxID != v1.SandboxID || a.ServingVersion != 1 || a.Version != 2 {
		t.Fatalf("deploy on a full fleet: %+v; want version 2 waiting, version 1 still serving from %s", a, v1.SandboxID)
	}
	if code, _, body, _ := getApp(t, st.URL, "web", "/"); code != http.StatusOK || body != "v1 /" {
		t.Fatalf("while v2 waits: %d %q; want v1 serving", code, body)
	}
	a = waitApp(t, c, "web", berth.AppRunning, 90*time.Second)
	if a.ServingVersion != 2 || a.SandboxID == v1.SandboxID {
		t.Fatalf("after room freed: %+v; want version 2 from a new sandbox", a)
	}
	if code, _, body, _ := getApp(t, st.URL, "web", "/"); code != http.StatusOK || body != "v2 /" {
		t.Fatalf("after the switch: %d %q; want v2", code, body)
	}
	waitFor(t, 30*time.Second, "the old version's sandbox to stop", func() (bool, string) {
		sb, err := c.Sandbox(ctx, v1.SandboxID)
		return err == nil && sb.State == berth.SandboxStopped, fmt.Sprint(sb.State, sb.Reason, err)
	})
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests during the deploy failed (last: %v); want none", failed.Load(), failed.Load()+served.Load(), lastFail.Load())
	}
	story := appStory(t, c, "web", false)
	want := []string{"→deploying", "deploying→running", "running→deploying", "deploying→waiting_capacity", "waiting_capacity→running"}
	if !slices.Equal(story, want) {
		t.Fatalf("app events %q; want %q", story, want)
	}
	t.Logf("%d requests served during the deploy, none failed", served.Load())
}

// TestAPP2_CommandThatExitsIsError: a command that exits at once on every start is the one
// fault a retry cannot fix: after 3 starts the app is in error with the command's output as
// the reason, and requests get 502 app_error. A deploy that fixes it brings it back; a broken
// deploy over a serving version is in error too, but the serving version keeps answering.
func TestAPP2_CommandThatExitsIsError(t *testing.T) {
	st := bootDev(t, nil)
	c := adminClient(st, client.WithDeadline(5*time.Second))
	ctx := context.Background()
	bad := appSpec("x", 128)
	bad.Command = []string{"sh", "-c", "echo boom: no such config >&2; exit 3"}
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "broken", AppSpec: bad}); err != nil {
		t.Fatal(err)
	}
	a := waitApp(t, c, "broken", berth.AppError, 90*time.Second)
	if a.StartFailures != 3 || !strings.Contains(a.Reason, "boom: no such config") || strings.Contains(a.Reason, "\n") {
		t.Fatalf("app in error: %d failures, reason %q; want 3 and the command's output", a.StartFailures, a.Reason)
	}
	if code, _, _, ecode := getApp(t, st.URL, "broken", "/"); code != http.StatusBadGateway || ecode != berth.EAppError {
		t.Fatalf("request to an app in error: %d %s; want 502 app_error", code, ecode)
	}
	sbs, err := c.Sandboxes(ctx, berth.SandboxRunning)
	if err != nil || len(sbs) != 0 {
		t.Fatalf("running sandboxes after the failed starts: %+v, %v; want none", sbs, err)
	}
	if _, err := c.DeployApp(ctx, "broken", appSpec("fixed", 128)); err != nil {
		t.Fatal(err)
	}
	waitApp(t, c, "broken", berth.AppRunning, 60*time.Second)
	if code, _, body, _ := getApp(t, st.URL, "broken", "/"); code != http.StatusOK || body != "fixed /" {
		t.Fatalf("after the fixing deploy: %d %q", code, body)
	}
	// A broken deploy over a serving version: error for the new version, the old one serves on.
	if _, err := c.DeployApp(ctx, "broken", bad); err != nil {
		t.Fatal(err)
	}
	a = waitApp(t, c, "broken", berth.AppError, 90*time.Second)
	if a.ServingVersion != 2 || !strings.Contains(a.Reason, "version 2 still serves") {
		t.Fatalf("broken deploy: %+v; want version 2 still serving, said in the reason", a)
	}
	if code, _, body, _ := getApp(t, st.URL, "broken", "/"); code != http.StatusOK || body != "fixed /" {
		t.Fatalf("after a broken deploy: %d %q; want the previous version's answer", code, body)
	}
}

// TestAPP2_AgentKilledAppRunsElsewhere: SIGKILL of the `berth agent` process that runs an app
// gets the app running on another host within the lease TTL plus one placement, with events
// that tell the story (running → waking because the sandbox was lost → running elsewhere).
func TestAPP2_AgentKilledAppRunsElsewhere(t *testing.T) {
	f := newPGFleet(t)
	url := f.replica(t, func(c *server.Config) {
		c.StaleAfter, c.LeaseEphemeral, c.LeaseStateful, c.SweepInterval = time.Second, 2*time.Second, 2*time.Second, 100*time.Millisecond
	})
	cmd := f.processAgent(t, url, "doomed")
	ctx := context.Background()
	waitFor(t, 30*time.Second, "the agent process to register", func() (bool, string) {
		_, err := f.seed.Agent(ctx, "doomed")
		return err == nil, fmt.Sprint(err)
	})
	c := client.New(url, f.adminKey, client.WithDeadline(5*time.Second))
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "survivor", AppSpec: appSpec("still here", 256)}); err != nil {
		t.Fatal(err)
	}
	a := waitApp(t, c, "survivor", berth.AppRunning, 60*time.Second)
	if a.AgentID != "doomed" {
		t.Fatalf("app runs on %q; want doomed (the only agent)", a.AgentID)
	}
	if code, _, body, _ := getApp(t, url, "survivor", "/"); code != http.StatusOK || body != "still here /" {
		t.Fatalf("before the kill: %d %q", code, body)
	}
	f.agent(t, "spare", url, 2048)

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitFor(t, 60*time.Second, "the app to run on the spare host", func() (bool, string) {
		a, err := c.App(ctx, "survivor")
		return err == nil && a.State == berth.AppRunning && a.AgentID == "spare", fmt.Sprint(a.State, " on ", a.AgentID, " ", a.Reason, err)
	})
	moved := time.Since(killed)
	if code, _, body, _ := getApp(t, url, "survivor", "/"); code != http.StatusOK || body != "still here /" {
		t.Fatalf("after the move: %d %q", code, body)
	}
	story := appStory(t, c, "survivor", true)
	n := len(story)
	if n < 2 || !strings.HasPrefix(story[n-2], "running→waking: sandbox "+a.SandboxID+" lost (lease expired") ||
		!strings.HasPrefix(story[n-1], "waking→running: serving version 1 from sandbox ") || !strings.HasSuffix(story[n-1], "on agent/spare") {
		t.Fatalf("app events %q; want running→waking (its sandbox lost: lease expired) then waking→running on agent/spare", story)
	}
	t.Logf("app moved %.1f s after the kill (lease TTL 2 s); events: %q", moved.Seconds(), story)
}

// TestCLI_Apps walks `berth apps` as the README shows it: create with a local file and a
// command, list, get, request through /apps/<name>/, hibernate, wake, deploy a change of
// environment only, events, delete.
func TestCLI_Apps(t *testing.T) {
	st := bootDev(t, nil)
	src := filepath.Join(t.TempDir(), "server.py")
	if err := os.WriteFile(src, []byte(appServer), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := berthCLI(t, st, "", "apps", "create", "hi", "--template", "python", "--port", "8080", "--memory-mb", "128",
		"--file", "server.py="+src, "--env", "MSG=cli", "--", "python3", "server.py")
	if err != nil {
		t.Fatalf("apps create: %v (%s)", err, out)
	}
	c := adminClient(st, client.WithDeadline(5*time.Second))
	waitApp(t, c, "hi", berth.AppRunning, 60*time.Second)
	if code, _, body, _ := getApp(t, st.URL, "hi", "/x"); code != http.StatusOK || body != "cli /x" {
		t.Fatalf("GET /apps/hi/x: %d %q", code, body)
	}
	if out, err := berthCLI(t, st, "", "apps", "list"); err != nil || !strings.Contains(out, "hi") || !strings.Contains(out, "running") {
		t.Fatalf("apps list: %q, %v", out, err)
	}
	if _, err := berthCLI(t, st, "", "apps", "hibernate", "hi"); err != nil {
		t.Fatal(err)
	}
	waitApp(t, c, "hi", berth.AppHibernated, 30*time.Second)
	if _, err := berthCLI(t, st, "", "apps", "wake", "hi"); err != nil {
		t.Fatal(err)
	}
	waitApp(t, c, "hi", berth.AppRunning, 60*time.Second)
	if _, err := berthCLI(t, st, "", "apps", "idle", "hi", "300"); err != nil {
		t.Fatal(err)
	}
	if a, err := c.App(context.Background(), "hi"); err != nil || a.IdleSeconds != 300 || a.Version != 1 {
		t.Fatalf("after apps idle: %+v, %v; want idle 300 and no new version", a, err)
	}
	if _, err := berthCLI(t, st, "", "apps", "deploy", "hi", "--env", "MSG=v2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "version 2 serving", func() (bool, string) {
		a, err := c.App(context.Background(), "hi")
		return err == nil && a.ServingVersion == 2 && a.State == berth.AppRunning, fmt.Sprint(a.State, a.ServingVersion, err)
	})
	if code, _, body, _ := getApp(t, st.URL, "hi", "/"); code != http.StatusOK || body != "v2 /" {
		t.Fatalf("after deploy: %d %q", code, body)
	}
	if out, err := berthCLI(t, st, "", "events", "app/hi"); err != nil || !strings.Contains(out, "hibernated") {
		t.Fatalf("events app/hi: %q, %v", out, err)
	}
	if _, err := berthCLI(t, st, "", "apps", "delete", "hi"); err != nil {
		t.Fatal(err)
	}
	if _, err := berthCLI(t, st, "", "apps", "get", "hi"); berth.ErrorCode(err) != berth.EAppNotFound {
		t.Fatalf("get after delete: %v; want app_not_found", err)
	}
	waitFor(t, 30*time.Second, "no running sandbox left", func() (bool, string) {
		sbs, err := c.Sandboxes(context.Background(), berth.SandboxRunning)
		return err == nil && len(sbs) == 0, fmt.Sprint(len(sbs), err)
	})
}

// TestCLI_AppsCreateOutput (a new user's report: `berth apps create … -o json` failed with
// "unknown shorthand flag: 'o'"): apps create takes -o table|json|yaml like sandbox create,
// JSON by default as it always printed. The apps are created stopped: nothing needs to run.
func TestCLI_AppsCreateOutput(t *testing.T) {
	st := bootDev(t, nil)
	create := func(name string, o ...string) string {
		t.Helper()
		args := append([]string{"apps", "create", name, "--template", "python", "--port", "8080", "--desired", "stopped"}, o...)
		out, err := berthCLI(t, st, "", append(args, "--", "python3", "-m", "http.server", "8080")...)
		if err != nil {
			t.Fatalf("apps create %s %v: %v (%s)", name, o, err, out)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		o    []string
	}{{"out-default", nil}, {"out-json", []string{"-o", "json"}}, {"out-json-long", []string{"--output=json"}}} {
		var a berth.App
		if out := create(tc.name, tc.o...); json.Unmarshal([]byte(out), &a) != nil || a.Name != tc.name || a.Desired != berth.AppDesired("stopped") {
			t.Errorf("apps create %s %v printed %q; want the app as JSON", tc.name, tc.o, out)
		}
	}
	if out := create("out-yaml", "-o", "yaml"); !strings.Contains(out, "\nname: out-yaml\n") || strings.HasPrefix(out, "{") {
		t.Errorf("apps create -o yaml printed %q; want the app as YAML", out)
	}
	if out := create("out-table", "-o", "table"); !regexp.MustCompile(`^NAME +STATE +DESIRED .*\nout-table +\S+ +stopped `).MatchString(out) {
		t.Errorf("apps create -o table printed %q; want a header and the app's row", out)
	}
}

// TestAPP2_TwoReplicasOneSandbox: two replicas reconcile the same apps every 10 ms over one
// PostgreSQL; each start still makes exactly one sandbox (the revision compare-and-set and
// the per-incarnation Idempotency-Key), and a deploy exactly one more.
func TestAPP2_TwoReplicasOneSandbox(t *testing.T) {
	f := newPGFleet(t)
	fast := func(c *server.Config) { c.AppReconcileInterval = 10 * time.Millisecond }
	url1, url2 := f.replica(t, fast), f.replica(t, fast)
	f.agent(t, "a1", url1, 4096)
	c := client.New(url2, f.adminKey, client.WithDeadline(5*time.Second))
	ctx := context.Background()
	names := []string{"one", "two", "three"}
	for _, n := range names {
		if _, err := c.CreateApp(ctx, berth.AppRequest{Name: n, AppSpec: appSpec(n, 128)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		waitApp(t, c, n, berth.AppRunning, 60*time.Second)
		if code, _, body, _ := getApp(t, url1, n, "/"); code != http.StatusOK || body != n+" /" {
			t.Fatalf("app %s through replica 1: %d %q", n, code, body)
		}
		if _, err := c.DeployApp(ctx, n, appSpec(n+"-v2", 128)); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		waitFor(t, 60*time.Second, n+" version 2 serving", func() (bool, string) {
			a, err := c.App(ctx, n)
			return err == nil && a.ServingVersion == 2 && a.State == berth.AppRunning && len(a.Retire) == 0, fmt.Sprint(a.State, a.ServingVersion, a.Retire, err)
		})
	}
	sbs, err := c.Sandboxes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	per := map[string][]string{}
	for _, sb := range sbs {
		per[sb.Metadata["app"]] = append(per[sb.Metadata["app"]], sb.Metadata["app_version"]+":"+string(sb.State))
	}
	for _, n := range names {
		got := per[n]
		slices.Sort(got)
		if want := []string{"1:stopped", "2:running"}; !slices.Equal(got, want) {
			t.Errorf("sandboxes of app %s: %v; want %v (one per version, the old one stopped)", n, got, want)
		}
	}
}

// TestAPP2_PreemptionNoticeMovesApp: a preemption notice on the host of an app hands the app
// to its reconciler at once (SPOT-3): it runs and answers on the other host before the
// notice's deadline, and no bare copy of its sandbox is left running.
func TestAPP2_PreemptionNoticeMovesApp(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.Agents = 2 })
	ctx := context.Background()
	c := adminClient(st, client.WithDeadline(5*time.Second))
	if err := c.DrainAgent(ctx, "dev-agent-2", "setup"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "spot", AppSpec: appSpec("moved", 128)}); err != nil {
		t.Fatal(err)
	}
	before := waitApp(t, c, "spot", berth.AppRunning, 60*time.Second)
	if before.AgentID != "dev-agent-1" {
		t.Fatalf("app on %s; want dev-agent-1", before.AgentID)
	}
	if err := c.UndrainAgent(ctx, "dev-agent-2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "dev-agent-2 back in placement", func() (bool, string) {
		a := agentByID(t, c, "dev-agent-2")
		return a.Status == berth.AgentActive && a.IntakeOpen, string(a.Status)
	})
	deadline := time.Now().Add(30 * time.Second)
	st.Agents[0].HandleNotice(preempt.Notice{Provider: "gcp", Kind: preempt.KindTerminate, ID: "n-1", Deadline: deadline}, time.Now())
	waitFor(t, 30*time.Second, "the app running on dev-agent-2", func() (bool, string) {
		a, err := c.App(ctx, "spot")
		return err == nil && a.State == berth.AppRunning && a.AgentID == "dev-agent-2", fmt.Sprint(a.State, a.AgentID, a.Reason, err)
	})
	if code, _, body, _ := getApp(t, st.URL, "spot", "/"); code != http.StatusOK || body != "moved /" || time.Now().After(deadline) {
		t.Fatalf("after the notice: %d %q (deadline passed: %v)", code, body, time.Now().After(deadline))
	}
	sbs, err := c.Sandboxes(ctx, berth.SandboxRunning)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.Metadata["evacuated_from"] != "" || sb.ID == before.SandboxID {
			t.Fatalf("running after the move: %+v; want only the app's new sandbox", sb)
		}
	}
	story := appStory(t, c, "spot", true)
	if !slices.ContainsFunc(story, func(s string) bool { return strings.Contains(s, "reconciler starts it on another host") }) {
		t.Fatalf("app events %q; want the loss to name the preemption hand-over", story)
	}
}

// TestBenchApp: `berth bench app` wakes the app the asked number of times and serves every
// request through Berth (figures go to docs/PERFORMANCE.md; nothing here asserts a time).
func TestBenchApp(t *testing.T) {
	st := bootDev(t, nil)
	c := adminClient(st, client.WithDeadline(5*time.Second))
	if _, err := c.CreateApp(context.Background(), berth.AppRequest{Name: "b", AppSpec: appSpec("b", 128)}); err != nil {
		t.Fatal(err)
	}
	waitApp(t, c, "b", berth.AppRunning, 60*time.Second)
	out, err := berthCLI(t, st, "", "bench", "app", "b", "--requests", "200", "--clients", "4", "--wakes", "2")
	if err != nil {
		t.Fatalf("bench app: %v (%s)", err, out)
	}
	if !strings.Contains(out, "wake (hibernated → first answer), 2 rounds") || !strings.Contains(out, "requests: 200 ok, 0 failed") {
		t.Fatalf("bench app printed %q; want 2 wakes and 200 requests served", out)
	}
	story := appStory(t, c, "b", false)
	if n := strings.Count(strings.Join(story, " "), "hibernated→waking"); n != 2 {
		t.Fatalf("app events %q; want 2 wakes", story)
	}
	if _, err := berthCLI(t, st, "", "bench", "app", "b", "--requests", "0"); berth.ErrorCode(err) != berth.EInvalidRequest {
		t.Fatalf("--requests 0: %v; want invalid_request", err)
	}
}

// TestAPP2_RoomFreedByDeleteStartsWaitingApp: the fleet is full of sandboxes that live an
// hour, so Retry-After says a minute; when one is deleted, the waiting app starts as soon as a
// heartbeat shows the room, long before its next scheduled try (a found field case).
func TestAPP2_RoomFreedByDeleteStartsWaitingApp(t *testing.T) {
	st := bootDev(t, committedDev)
	c := adminClient(st, client.WithDeadline(5*time.Second))
	ctx := context.Background()
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "patient", AppSpec: appSpec("ok", 256), Desired: berth.DesireHibernated}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 4 {
		sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell", MemoryMiB: 256, TTLSeconds: 3600})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if code, ra, _, ecode := getApp(t, st.URL, "patient", "/"); code != http.StatusServiceUnavailable || ecode != berth.ENoCapacity {
		t.Fatalf("request on a full fleet: %d %s (Retry-After %s)", code, ecode, ra)
	}
	waiting, err := c.App(ctx, "patient")
	if err != nil || waiting.State != berth.AppWaitingCapacity || time.Until(waiting.RetryAt) < 30*time.Second {
		t.Fatalf("waiting app: %+v, %v; want waiting_capacity with its next try ≥ 30 s away", waiting, err)
	}
	if err := c.DeleteSandbox(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	a := waitApp(t, c, "patient", berth.AppRunning, 25*time.Second)
	story, err := c.Events(ctx, "app/patient")
	if err != nil {
		t.Fatal(err)
	}
	if last := story[len(story)-1]; last.To != string(berth.AppRunning) || !last.At.Before(waiting.RetryAt) {
		t.Fatalf("running at %v; want before the scheduled retry at %v", last.At, waiting.RetryAt)
	}
	if code, _, body, _ := getApp(t, st.URL, "patient", "/"); code != http.StatusOK || body != "ok /" {
		t.Fatalf("after the delete: %d %q (app %+v)", code, body, a)
	}
}
