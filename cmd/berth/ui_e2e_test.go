package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/chromedp/chromedp"
)

// The web dashboard (issue 17, point 4) driven in a real headless Chromium against a real
// dev stack with two agents. Without Chromium the test skips locally and fails in CI
// (.ci/run installs Debian's chromium when it is missing). With BERTH_UI_SCREENSHOTS=<dir>
// it saves the fleet and events pages there as ui-fleet.png and ui-events.png (the README's
// docs/img/ screenshots come from BERTH_UI_SCREENSHOTS=docs/img).

// chromiumPath finds Debian's chromium (or a Chrome on PATH).
func chromiumPath(t *testing.T) string {
	t.Helper()
	if fi, err := os.Stat("/usr/bin/chromium"); err == nil && !fi.IsDir() {
		return "/usr/bin/chromium"
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("CI runs the dashboard test in Chromium: install Debian's chromium (.ci/run does when it is missing)")
	}
	t.Skip("no chromium: the dashboard test needs Debian's chromium package")
	return ""
}

// browser starts a headless Chromium with a fresh profile that is killed when the test
// ends, pass or fail, and returns its tab's context (bounded by limit in all).
func browser(t *testing.T, limit time.Duration) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1600, 1000),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root otherwise
	}
	ctx, cancelTime := context.WithTimeout(context.Background(), limit)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc(); cancelTime() })
	if err := chromedp.Do(bctx); err != nil { // starts the browser on the tab's own context
		t.Fatalf("start chromium: %v", err)
	}
	// Any uncaught exception, and anything the CSP refused, fails the test when it ends.
	messages := chromedp.Console(bctx)
	var mu sync.Mutex
	var problems []string
	go func() {
		for m, err := range messages {
			if err != nil {
				return // the tab closed
			}
			if m.IsException() || strings.Contains(m.Text, "Content Security Policy") || strings.Contains(m.Text, "Refused to") {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s:%d %s", m.URL, m.Line+1, m.Text))
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range problems {
			t.Errorf("the page's console: %s", p)
		}
	})
	return bctx
}

// step runs actions in the browser, bounded by limit, and fails the test with what it was
// doing when they fail or time out.
func step(t *testing.T, bctx context.Context, what string, limit time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bctx, limit)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		failStep(t, bctx, what, err)
	}
}

// failStep fails the test with what it was doing, err and the start of the page's text.
func failStep(t *testing.T, bctx context.Context, what string, err error) {
	t.Helper()
	sctx, scancel := context.WithTimeout(bctx, 5*time.Second)
	defer scancel()
	page, _ := chromedp.Run(sctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 1500) : ""`))
	t.Fatalf("%s: %v\npage text:\n%s", what, err, page)
}

// pageEval evaluates expr in the page (bounded) and returns its result as T.
func pageEval[T any](t *testing.T, bctx context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(bctx, 10*time.Second)
	defer cancel()
	out, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		failStep(t, bctx, "evaluate "+expr, err)
	}
	return out
}

// screenshot saves the page (its header and the view, not the empty space under them) as
// <BERTH_UI_SCREENSHOTS>/name when that is set.
func screenshot(t *testing.T, bctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("BERTH_UI_SCREENSHOTS")
	if dir == "" {
		return
	}
	step(t, bctx, "hide the toast", 5*time.Second, chromedp.Evaluate[chromedp.Void](`document.getElementById("toast").hidden = true`),
		chromedp.Sleep(300*time.Millisecond)) // let the last render settle
	ctx, cancel := context.WithTimeout(bctx, 15*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(`#app`)))
	if err != nil {
		failStep(t, bctx, "screenshot "+name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("saved %s", filepath.Join(dir, name))
}

// signIn types key on the sign-in form and submits it.
func signIn(t *testing.T, bctx context.Context, key string) {
	t.Helper()
	step(t, bctx, "sign in", 20*time.Second,
		chromedp.WaitVisible(chromedp.CSS(`#key`)),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("key").value = ""`),
		chromedp.SendKeys(chromedp.CSS(`#key`), key),
		chromedp.Click(chromedp.CSS(`#login-submit`)),
	)
}

// uiRow is the selector of the table row of key in view.
func uiRow(view, key string) string {
	return fmt.Sprintf(`#view-%s tr[data-key=%q]:not([hidden])`, view, key)
}

// TestDashboardInChromium: an admin signs in and sees both agents; a sandbox created through
// the API appears in the sandboxes view without a reload; a drain clicked on the page is what
// the API then reports; the sandbox's events are listed; a tenant key sees its own sandbox,
// never another tenant's, and no admin view. A wrong key shows the server's refusal.
func TestDashboardInChromium(t *testing.T) {
	bctx := browser(t, 4*time.Minute)
	st := bootDev(t, func(c *devConfig) { c.Agents = 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin := adminClient(st)
	keys := map[string]string{}
	for _, tenant := range []string{"acme", "globex"} {
		if _, err := admin.CreateTenant(ctx, tenant); err != nil {
			t.Fatal(err)
		}
		k, err := admin.CreateAPIKey(ctx, tenant, berth.RoleTenant)
		if err != nil {
			t.Fatal(err)
		}
		keys[tenant] = k.Key
	}
	agents, err := admin.Agents(ctx)
	if err != nil || len(agents) != 2 {
		t.Fatalf("agents: %+v, %v; want the dev stack's two", agents, err)
	}

	// A wrong key: the page shows the server's answer, and stays on the sign-in form.
	step(t, bctx, "open /ui", 20*time.Second, chromedp.Navigate(st.URL+"/ui"))
	signIn(t, bctx, "not-a-key")
	step(t, bctx, "see the refusal of a wrong key", 20*time.Second, chromedp.WaitVisible(chromedp.CSS(`#login-error`)))
	loginErr := pageEval[string](t, bctx, `document.getElementById("login-error").innerText`)
	if !strings.Contains(loginErr, berth.EUnauthorized) {
		t.Fatalf("sign-in error %q: want the server's %s", loginErr, berth.EUnauthorized)
	}

	// The admin: both agents in the fleet table.
	signIn(t, bctx, st.AdminKey)
	for _, a := range agents {
		step(t, bctx, "see agent "+a.AgentID, 30*time.Second, chromedp.WaitVisible(chromedp.CSS(uiRow("fleet", a.AgentID))))
	}
	if n := pageEval[int](t, bctx, `document.querySelectorAll("#view-fleet tbody tr:not([hidden])").length`); n != 2 {
		t.Fatalf("fleet table has %d rows, want 2", n)
	}
	step(t, bctx, "mark the page", 5*time.Second, chromedp.Evaluate[chromedp.Void](`window.__notReloaded = true`))

	// A sandbox created through the API shows up in the sandboxes view without a reload.
	step(t, bctx, "open the sandboxes view", 20*time.Second,
		chromedp.Click(chromedp.CSS(`#nav-sandboxes`)),
		chromedp.WaitVisible(chromedp.CSS(`#view-sandboxes`)))
	acme := client.New(st.URL, keys["acme"])
	mine, err := acme.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatalf("acme create: %v", err)
	}
	theirs, err := client.New(st.URL, keys["globex"]).CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatalf("globex create: %v", err)
	}
	step(t, bctx, "see the new sandboxes appear", 30*time.Second,
		chromedp.WaitVisible(chromedp.CSS(uiRow("sandboxes", mine.ID))),
		chromedp.WaitVisible(chromedp.CSS(uiRow("sandboxes", theirs.ID))))
	if !pageEval[bool](t, bctx, `window.__notReloaded === true`) {
		t.Fatal("the page reloaded to show the new sandbox")
	}

	// The fleet with the sandboxes on it (the screenshot for docs/img).
	step(t, bctx, "back to the fleet", 20*time.Second,
		chromedp.Click(chromedp.CSS(`#nav-fleet`)),
		chromedp.WaitVisible(chromedp.CSS(uiRow("fleet", agents[0].AgentID))))
	screenshot(t, bctx, "ui-fleet.png")

	// Drain the first agent from the page (a click, then the confirmation): the API reports it.
	target := agents[0].AgentID
	step(t, bctx, "click drain", 20*time.Second,
		chromedp.Click(chromedp.CSS(uiRow("fleet", target)+` button.drain`)),
		chromedp.WaitVisible(chromedp.CSS(uiRow("fleet", target)+` button.drain.confirm`)),
		chromedp.Click(chromedp.CSS(uiRow("fleet", target)+` button.drain.confirm`)))
	waitFor(t, 20*time.Second, "the API to report the drain", func() (bool, string) {
		ds, err := admin.DrainStatus(ctx, target)
		return err == nil && ds.Draining, fmt.Sprintf("%+v %v", ds, err)
	})
	if ds, _ := admin.DrainStatus(ctx, agents[1].AgentID); ds.Draining {
		t.Fatalf("%s drained too: only %s was clicked", agents[1].AgentID, target)
	}
	// With both hosts drained a create is refused (no_capacity): the refusals chart counts it.
	if err := admin.DrainAgent(ctx, agents[1].AgentID, "test"); err != nil {
		t.Fatal(err)
	}
	if code, _, _, e := rawCreate(t, st, `{"template":"shell"}`); code != 503 || e.Code != berth.ENoCapacity {
		t.Fatalf("create with every host drained: %d %+v, want 503 no_capacity", code, e)
	}
	if err := admin.UndrainAgent(ctx, agents[1].AgentID); err != nil {
		t.Fatal(err)
	}
	step(t, bctx, "see the drain on the page", 20*time.Second,
		chromedp.WaitVisible(chromedp.CSS(uiRow("fleet", target)+` button.undrain`)))
	step(t, bctx, "click undrain", 20*time.Second, chromedp.Click(chromedp.CSS(uiRow("fleet", target)+` button.undrain`)))
	waitFor(t, 20*time.Second, "the API to report the undrain", func() (bool, string) {
		ds, err := admin.DrainStatus(ctx, target)
		return err == nil && !ds.Draining, fmt.Sprintf("%+v %v", ds, err)
	})

	// The sandbox's events, reached from its row.
	step(t, bctx, "open the sandbox's events", 20*time.Second,
		chromedp.Click(chromedp.CSS(`#nav-sandboxes`)),
		chromedp.WaitVisible(chromedp.CSS(uiRow("sandboxes", mine.ID)+` a.link`)),
		chromedp.Click(chromedp.CSS(uiRow("sandboxes", mine.ID)+` a.link`)),
		chromedp.WaitVisible(chromedp.CSS(`#view-events tbody tr:not([hidden])`)))
	waitEventsOf(t, bctx, mine.ID)
	// An entity half typed (no "<kind>/" yet, which the server refuses with 400) waits with a
	// hint, never a refresh error; the kinds tenant and volume can be picked.
	step(t, bctx, "type half an entity", 10*time.Second, chromedp.Evaluate[chromedp.Void](
		`(() => { const i = document.querySelector("#view-events input[name=entity]"); i.value = "sandb"; i.dispatchEvent(new Event("input")); })()`))
	waitPage(t, bctx, "the events view's hint for a half-typed entity", `(() => { const h = document.querySelector("#view-events p.hint"); `+
		`return !h.hidden && h.textContent.includes("<kind>/<id>") && document.querySelectorAll("#view-events tbody tr:not([hidden])").length === 0 })()`)
	if msg := pageEval[string](t, bctx, `document.getElementById("error").hidden ? "" : document.getElementById("error").textContent`); msg != "" {
		t.Fatalf("a half-typed entity showed a refresh error: %s", msg)
	}
	if kinds := pageEval[string](t, bctx, `[...document.querySelectorAll("#view-events select[name=type] option")].map(o => o.value).join(",")`); kinds != ",sandbox,app,agent,reservation,tenant,volume" {
		t.Errorf("the events view's kinds are %q; want every kind the server takes", kinds)
	}
	// The whole stream (an admin key reads every entity's): the drain clicked above is in it.
	step(t, bctx, "clear the entity filter", 10*time.Second, chromedp.Evaluate[chromedp.Void](
		`(() => { const i = document.querySelector("#view-events input[name=entity]"); i.value = ""; i.dispatchEvent(new Event("input")); })()`))
	waitPage(t, bctx, "the drain of "+target+" in the events view", fmt.Sprintf(
		`[...document.querySelectorAll("#view-events tbody tr:not([hidden])")].some(tr => tr.innerText.includes(%q) && tr.innerText.includes("draining"))`, "agent/"+target))
	screenshot(t, bctx, "ui-events.png")

	// The refusals chart draws (this replica refused nothing: an empty hour).
	step(t, bctx, "open the refusals chart", 20*time.Second,
		chromedp.Click(chromedp.CSS(`#nav-refusals`)),
		chromedp.WaitVisible(chromedp.CSS(`#view-refusals svg.chart`)))
	waitPage(t, bctx, "the no_capacity refusal in the chart", `document.querySelector("#view-refusals .legend").innerText.includes("no_capacity — 1") && `+
		`[...document.querySelectorAll("#view-refusals svg.chart rect.bar title")].some(t => t.textContent.endsWith("no_capacity: 1"))`)

	// A tenant key: its own sandbox, not globex's, and no admin view.
	step(t, bctx, "sign out", 10*time.Second, chromedp.Click(chromedp.CSS(`#logout`)))
	signIn(t, bctx, keys["acme"])
	step(t, bctx, "see the tenant's own sandbox", 30*time.Second,
		chromedp.WaitVisible(chromedp.CSS(uiRow("sandboxes", mine.ID))))
	if pageEval[bool](t, bctx, fmt.Sprintf(`document.querySelector('#view-sandboxes tr[data-key=%q]') !== null`, theirs.ID)) {
		t.Fatalf("tenant acme sees globex's sandbox %s", theirs.ID)
	}
	if n := pageEval[int](t, bctx, `document.querySelectorAll("#view-sandboxes tbody tr:not([hidden])").length`); n != 1 {
		t.Fatalf("tenant acme sees %d sandboxes, want its one", n)
	}
	for _, nav := range []string{"fleet", "refusals"} {
		if !pageEval[bool](t, bctx, fmt.Sprintf(`document.getElementById("nav-%s").hidden`, nav)) {
			t.Fatalf("a tenant key is shown the admin view %s", nav)
		}
	}
	step(t, bctx, "tenant: open its sandbox's events", 20*time.Second,
		chromedp.Click(chromedp.CSS(uiRow("sandboxes", mine.ID)+` a.link`)),
		chromedp.WaitVisible(chromedp.CSS(`#view-events tbody tr:not([hidden])`)))
	waitEventsOf(t, bctx, mine.ID)
	if txt := pageEval[string](t, bctx, `document.getElementById("view-events").innerText`); strings.Contains(txt, theirs.ID) {
		t.Fatalf("tenant acme's events view shows globex's sandbox %s", theirs.ID)
	}
}

// waitEventsOf waits (bounded) until the events view lists sandbox id's transition to running.
func waitEventsOf(t *testing.T, bctx context.Context, id string) {
	t.Helper()
	waitPage(t, bctx, "sandbox/"+id+" → running in the events view", fmt.Sprintf(
		`[...document.querySelectorAll("#view-events tbody tr:not([hidden])")].some(tr => tr.innerText.includes(%q) && tr.innerText.includes("running"))`, "sandbox/"+id))
}

// waitPage polls the page until the JavaScript expression expr is true, for at most 30 s.
func waitPage(t *testing.T, bctx context.Context, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !pageEval[bool](t, bctx, expr) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; the page shows:\n%s", what,
				pageEval[string](t, bctx, `document.querySelector("main").innerText.slice(0, 3000)`))
		}
		time.Sleep(200 * time.Millisecond) // real: a real browser redraws the page on its own refresh (every 3 s)
	}
}

// TestDashboardAt10000Hosts: with 10,000 hosts more than the dev stack's own, the fleet view
// keeps one page of 100 rows in the DOM, pages through the rest, filters across all of them,
// and a refresh rewrites the rows it has instead of building new ones.
func TestDashboardAt10000Hosts(t *testing.T) {
	bctx := browser(t, 4*time.Minute)
	st := bootDev(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n = 10000
	now := time.Now()
	for i := range n {
		// Straight into the store, as 10,000 agents' heartbeats would leave it; their address
		// refuses connections, and nothing is placed on them (this test creates nothing).
		hb := berth.Heartbeat{AgentID: fmt.Sprintf("fleet-%05d", i), Address: "http://127.0.0.1:1", Pool: berth.PoolEphemeral,
			Status: berth.AgentActive, IntakeOpen: true, MemoryAdmission: berth.AdmissionCommitted, HeartbeatAt: now,
			CPUTotal: 16, MemoryMiBTotal: 65536, MemoryMiBCommitted: int64(i % 60000), MemoryMiBAdmittable: 65536 - int64(i%60000),
			MemoryPressure: float64(i%20) + 0.5} // PSI percent: fleet-09999's is 19.5
		if i == n-1 {
			for j := range 7 {
				hb.Sandboxes = append(hb.Sandboxes, berth.HeldSandbox{ID: fmt.Sprintf("sb-held-%d", j), Measured: true})
			}
		}
		if _, err := st.Store.ApplyHeartbeat(ctx, hb, now); err != nil {
			t.Fatalf("heartbeat %d: %v", i, err)
		}
	}
	step(t, bctx, "open /ui", 20*time.Second, chromedp.Navigate(st.URL+"/ui/"))
	signIn(t, bctx, st.AdminKey)
	total := fmt.Sprintf("of %d", n+1)
	total = total[:len(total)-3] + "," + total[len(total)-3:] // "of 10,001"
	waitPage(t, bctx, "the pager to count every host", fmt.Sprintf(`document.querySelector("#view-fleet .pager-info").innerText === "1–100 %s"`, total))
	if rows := pageEval[int](t, bctx, `document.querySelectorAll("#view-fleet tbody tr").length`); rows != 100 {
		t.Fatalf("the fleet table holds %d rows in the DOM, want one page of 100", rows)
	}

	// A refresh rewrites the same 100 <tr>s: mark them, wait for the next refresh, look again.
	before := pageEval[string](t, bctx, `document.getElementById("updated").innerText`)
	step(t, bctx, "mark the rows", 5*time.Second, chromedp.Evaluate[chromedp.Void](
		`document.querySelectorAll("#view-fleet tbody tr").forEach(tr => { tr.__mark = true; })`))
	waitPage(t, bctx, "the next refresh", fmt.Sprintf(`document.getElementById("updated").innerText !== %q`, before))
	if kept := pageEval[int](t, bctx, `[...document.querySelectorAll("#view-fleet tbody tr")].filter(tr => tr.__mark).length`); kept != 100 {
		t.Fatalf("after a refresh %d of the 100 rows are the same elements: the table was rebuilt", kept)
	}

	step(t, bctx, "next page", 10*time.Second, chromedp.Click(chromedp.CSS(`#view-fleet .pager button:last-of-type`)))
	waitPage(t, bctx, "page 2", fmt.Sprintf(`document.querySelector("#view-fleet .pager-info").innerText === "101–200 %s"`, total))
	step(t, bctx, "filter by host", 10*time.Second, chromedp.SendKeys(chromedp.CSS(`#view-fleet input[name=host]`), "fleet-09999"))
	waitPage(t, bctx, "the one host the filter matches", `document.querySelectorAll("#view-fleet tbody tr:not([hidden])").length === 1 && `+
		`document.querySelector('#view-fleet tr[data-key="fleet-09999"]:not([hidden])') !== null`)
	// Memory pressure is PSI, already a percentage: 19.5 shows as 19.5 %, hot (over the
	// gate's 10 % close line), not as 1,950 %.
	cell := `(() => { const i = [...document.querySelectorAll("#view-fleet thead th")].findIndex(th => th.dataset.key === "pressure");` +
		` return document.querySelector('#view-fleet tr[data-key="fleet-09999"]').children[i]; })()`
	if got := pageEval[string](t, bctx, cell+`.innerText + " " + `+cell+`.className`); got != "19.5% num hot" {
		t.Errorf("fleet-09999's pressure cell reads %q, want \"19.5%% num hot\"", got)
	}
	// The held lists are counted by the server (GET /v1/agents?held=count), not sent.
	held := strings.ReplaceAll(cell, `"pressure"`, `"sandboxes"`)
	if got := pageEval[string](t, bctx, held+`.innerText`); got != "7" {
		t.Errorf("fleet-09999's sandboxes cell reads %q, want 7", got)
	}
}

// evilApp is a tenant's app that tries what a page served from the API's own origin could do
// to the dashboard: read the operator's key from sessionStorage, and install a service worker
// over the whole origin (its script answered with Service-Worker-Allowed: /) to read the
// Authorization header of every later dashboard call. The page writes what it got into #out.
const evilApp = `import http.server
PAGE = b"""<!doctype html><p id="out">pending</p><script>
const got = [];
try { got.push("key=" + sessionStorage.getItem("berth.key")); } catch (e) { got.push("storage:" + e.name); }
let sw;
try { sw = navigator.serviceWorker.register("/apps/evil/sw.js", {scope: "/"}).then(() => "sw:registered", (e) => "sw:" + e.name); }
catch (e) { sw = Promise.resolve("sw:" + e.name); }
sw.then((r) => { got.push(r); document.getElementById("out").textContent = got.join(" "); });
</script>"""
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        js = self.path.endswith("sw.js")
        body = b"self.addEventListener('fetch', () => {});" if js else PAGE
        self.send_response(200)
        self.send_header("Content-Type", "text/javascript" if js else "text/html")
        self.send_header("Service-Worker-Allowed", "/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8080), H).serve_forever()
`

// TestDashboardKeyOutOfAppsReach: a tenant's app served at /apps/NAME/ shares the API's
// origin, where the dashboard keeps the operator's key (an attack found F1 in review). In a
// real Chromium, an admin signed in to /ui who then opens the app's page in the same tab:
// the app's script cannot read sessionStorage, and cannot register a service worker (the
// page runs sandboxed in an opaque origin; the server strips Service-Worker-Allowed and
// refuses worker script fetches on /apps/). Under the apps domain the app keeps its headers.
func TestDashboardKeyOutOfAppsReach(t *testing.T) {
	bctx := browser(t, 4*time.Minute)
	st := bootDev(t, func(c *devConfig) { c.AppsDomain = "apps.test" })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := adminClient(st)
	if _, err := admin.CreateTenant(ctx, "mallory"); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateAPIKey(ctx, "mallory", berth.RoleTenant)
	if err != nil {
		t.Fatal(err)
	}
	mallory := client.New(st.URL, k.Key)
	if _, err := mallory.CreateApp(ctx, berth.AppRequest{Name: "evil", AppSpec: berth.AppSpec{
		Template: "python", MemoryMiB: 256, Port: 8080, Command: []string{"python3", "server.py"},
		Files: map[string]string{"server.py": evilApp}}}); err != nil {
		t.Fatal(err)
	}
	waitApp(t, mallory, "evil", berth.AppRunning, 90*time.Second)

	get := func(host string, header http.Header) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, st.URL+"/apps/evil/sw.js", nil)
		if host != "" {
			req.URL.Path, req.Host = "/sw.js", host
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := get("", nil)
	if csp := resp.Header.Get("Content-Security-Policy"); resp.StatusCode != http.StatusOK ||
		!strings.HasPrefix(csp, "sandbox ") || strings.Contains(csp, "allow-same-origin") || resp.Header.Get("Service-Worker-Allowed") != "" {
		t.Errorf("/apps/evil/sw.js: %d, CSP %q, Service-Worker-Allowed %q; want 200, a sandbox without allow-same-origin, no worker scope",
			resp.StatusCode, csp, resp.Header.Get("Service-Worker-Allowed"))
	}
	if resp := get("", http.Header{"Service-Worker": {"script"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a service worker script fetched under /apps/: %d, want 403", resp.StatusCode)
	}
	if resp := get("evil.apps.test", nil); resp.StatusCode != http.StatusOK ||
		resp.Header.Get("Content-Security-Policy") != "" || resp.Header.Get("Service-Worker-Allowed") != "/" {
		t.Errorf("the app under its own host: %d, CSP %q, Service-Worker-Allowed %q; want its answer as it sent it",
			resp.StatusCode, resp.Header.Get("Content-Security-Policy"), resp.Header.Get("Service-Worker-Allowed"))
	}

	step(t, bctx, "open /ui", 20*time.Second, chromedp.Navigate(st.URL+"/ui/"))
	signIn(t, bctx, st.AdminKey)
	step(t, bctx, "see the fleet", 30*time.Second, chromedp.WaitVisible(chromedp.CSS(uiRow("fleet", "dev-agent-1"))))
	if got := pageEval[string](t, bctx, `sessionStorage.getItem("berth.key")`); got != st.AdminKey {
		t.Fatalf("the dashboard keeps %q in sessionStorage; this test expects the admin key there", got)
	}
	step(t, bctx, "open the tenant's app in the same tab", 30*time.Second,
		chromedp.Navigate(st.URL+"/apps/evil/"),
		chromedp.WaitVisible(chromedp.CSS(`#out`)))
	waitPage(t, bctx, "the app's script to finish", `document.getElementById("out").textContent !== "pending"`)
	out := pageEval[string](t, bctx, `document.getElementById("out").textContent`)
	if strings.Contains(out, st.AdminKey) || strings.Contains(out, "sw:registered") || !strings.Contains(out, "storage:SecurityError") {
		t.Fatalf("the app's page got %q; want no key (storage:SecurityError) and no service worker", out)
	}
}
