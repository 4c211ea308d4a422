package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"

	"github.com/berth-dev/berth"
)

// TestMinSandboxMiB_TinyRequestsAre400: a memory_mb below berth.MinSandboxMiB — which no
// runtime starts, so every host failed it and was quarantined for it (PLC-9; an attack on
// gVisor took the fleet out of placement with three tenant creates of 1 MiB) — is 400
// invalid_request naming the minimum for a sandbox create, an app's create and deploy, and a
// template; no host is asked, nothing is written, and the floor itself is accepted.
func TestMinSandboxMiB_TinyRequestsAre400(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {})
	agent := newFakeAgent(t, "")
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	ok := `"template":"python","command":["sleep","1000"],"port":8080`
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes", `{"template":"python","memory_mb":1}`},
		{"POST", "/v1/sandboxes", fmt.Sprintf(`{"template":"python","memory_mb":%d}`, berth.MinSandboxMiB-1)},
		{"POST", "/v1/apps", `{"name":"tiny",` + ok + `,"memory_mb":1}`},
		{"PUT", "/v1/templates/tiny", `{"memory_mb":16,"vcpus":1}`},
	} {
		for range 3 {
			code, body := h.do(t, tc.method, tc.path, tc.body)
			if code != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_request"`) || !strings.Contains(body, "64") {
				t.Fatalf("%s %s %s: %d %s; want 400 invalid_request naming the minimum, 64 MiB", tc.method, tc.path, tc.body, code, body)
			}
		}
	}
	if code, body := h.do(t, "POST", "/v1/apps", `{"name":"web",`+ok+`,"desired":"stopped"}`); code != http.StatusCreated {
		t.Fatalf("create app: %d %s", code, body)
	}
	if code, body := h.do(t, "POST", "/v1/apps/web/deploy", `{`+ok+`,"memory_mb":8}`); code != http.StatusBadRequest || !strings.Contains(body, "64") {
		t.Fatalf("deploy of 8 MiB: %d %s; want 400 naming the minimum", code, body)
	}
	ctx := context.Background()
	if n := agent.creates.Load(); n != 0 {
		t.Fatalf("the agent was asked %d creates; want none", n)
	}
	if a := h.app(t, "web"); a.Version != 1 || a.Spec.MemoryMiB != 0 {
		t.Fatalf("app after a refused deploy: version %d, memory %d; want version 1 untouched", a.Version, a.Spec.MemoryMiB)
	}
	if _, err := h.st.Template(ctx, "tiny"); err == nil {
		t.Fatal("a refused template was stored")
	}
	if apps, err := h.st.Apps(ctx, ""); err != nil || len(apps) != 1 {
		t.Fatalf("apps %+v, %v; want only web", apps, err)
	}
	// The floor itself starts.
	code, body := h.do(t, "POST", "/v1/sandboxes", fmt.Sprintf(`{"template":"python","memory_mb":%d}`, berth.MinSandboxMiB))
	if code != http.StatusCreated || !strings.Contains(body, `"memory_mb":64`) {
		t.Fatalf("create at the floor: %d %s; want 201 of 64 MiB", code, body)
	}
	if code, body := h.do(t, "PUT", "/v1/templates/tiny", `{"memory_mb":64,"vcpus":1}`); code != http.StatusOK {
		t.Fatalf("template at the floor: %d %s", code, body)
	}
	if a, err := h.st.Agent(ctx, "a1"); err != nil || a.CreateFailures != 0 || !a.QuarantinedUntil.IsZero() {
		t.Fatalf("agent after the tiny requests: %+v, %v; want no failure counted", a, err)
	}
}

// TestMinSandboxMiB_StoredBelowTheFloorStartsAtIt: a template and an app spec stored below
// the floor before it existed are not refused — their sandboxes start at berth.MinSandboxMiB
// (docs/DECISIONS.md), which the agent is asked for and the sandbox shows.
func TestMinSandboxMiB_StoredBelowTheFloorStartsAtIt(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) { c.AppReconcileInterval = 5 * time.Millisecond })
	agent := newFakeAgent(t, "")
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	ctx := context.Background()
	must(t, h.st.PutTemplate(ctx, berth.Template{Name: "old", MemoryMiB: 16, VCPUs: 1}))
	code, body := h.do(t, "POST", "/v1/sandboxes", `{"template":"old"}`)
	if code != http.StatusCreated || !strings.Contains(body, `"memory_mb":64`) {
		t.Fatalf("create from a 16 MiB template: %d %s; want 201 of 64 MiB", code, body)
	}
	old := berth.App{Name: "old", Tenant: "acme", Version: 1, Desired: berth.DesireRunning, State: berth.AppDeploying,
		Spec: berth.AppSpec{Template: "python", MemoryMiB: 1, Command: []string{"sleep", "1000"}, Port: 8080}}
	_, err := h.st.CreateApp(ctx, old, "test", time.Now())
	must(t, err)
	h.running(t)
	waitUntil(t, "the old app running", func() (bool, string) {
		a := h.app(t, "old")
		return a.State == berth.AppRunning, string(a.State) + " " + a.Reason
	})
	if got := agent.sizes(); len(got) != 2 || got[0] != berth.MinSandboxMiB || got[1] != berth.MinSandboxMiB {
		t.Fatalf("the agent was asked for %v MiB; want the floor twice", got)
	}
}

// TestAPP2_SetUpRefusedIsTheAppsError: an agent that refuses an app's set-up as
// invalid_request (an env value with a NUL, stored before the API refused it) refuses it at
// every start: the app goes to error on the first refusal, with the agent's reason, and is
// not started again (it was retried as transient: 15 sandboxes started and stopped in 70 s,
// the app stuck in deploying).
func TestAPP2_SetUpRefusedIsTheAppsError(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.AppReconcileInterval, c.AppBackoffBase, c.AppBackoffCap = 5*time.Millisecond, time.Millisecond, 10*time.Millisecond
	})
	agent := newFakeAgent(t, "")
	agent.refuseSetUp = berth.EInvalidRequest
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	h.running(t)
	h.createApp(t, "refused", `["sleep","1000"]`)
	waitUntil(t, "error", func() (bool, string) {
		a := h.app(t, "refused")
		return a.State == berth.AppError, fmt.Sprintf("%s %q after %d starts", a.State, a.Reason, agent.creates.Load())
	})
	from := h.s.appDone.Load()
	waitUntil(t, "20 more reconciler rounds", func() (bool, string) {
		n := h.s.appDone.Load() - from
		return n >= 20, fmt.Sprint(n, " rounds")
	})
	a := h.app(t, "refused")
	if n := agent.creates.Load(); n != 1 || a.State != berth.AppError || !strings.Contains(a.Reason, "refused its set-up") ||
		!strings.Contains(a.Reason, "values without NUL") {
		t.Fatalf("%d starts, app %s %q; want 1 start and error naming the agent's refusal", n, a.State, a.Reason)
	}
	waitUntil(t, "its sandbox stopped", func() (bool, string) { return agent.deletes.Load() == 1, fmt.Sprint(agent.deletes.Load()) })
}

// TestAPP1_SpecTheKernelRefusesIs400: an app whose command or env the kernel would refuse
// to start (over MAX_ARG_STRLEN or the total) or whose file path no file system takes is
// refused at create and at deploy — it was accepted, and failed at every start.
func TestAPP1_SpecTheKernelRefusesIs400(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {})
	big := strings.Repeat("a", berth.MaxAppArgBytes+1)
	ok := `"template":"python","port":8080`
	specs := []string{
		`"command":["echo","` + big + `"]`,
		`"command":["echo"],"env":{"A":"` + big + `"}`,
		`"command":["echo"` + strings.Repeat(`,"`+big[:berth.MaxAppArgBytes]+`"`, 8) + `]`,
		`"command":["echo"],"files":{"` + strings.Repeat("f", 256) + `":"x"}`,
		`"command":["echo"],"files":{"` + strings.Repeat("d/", 600) + `f":"x"}`,
	}
	if code, body := h.do(t, "POST", "/v1/apps", `{"name":"web",`+ok+`,"command":["echo"],"desired":"stopped"}`); code != http.StatusCreated {
		t.Fatalf("create app: %d %s", code, body)
	}
	for i, spec := range specs {
		if code, body := h.do(t, "POST", "/v1/apps", `{"name":"k`+fmt.Sprint(i)+`",`+ok+`,`+spec+`}`); code != http.StatusBadRequest ||
			!strings.Contains(body, `"code":"invalid_request"`) {
			t.Errorf("create with spec %d: %d %.200s; want 400 invalid_request", i, code, body)
		}
		if code, body := h.do(t, "POST", "/v1/apps/web/deploy", `{`+ok+`,`+spec+`}`); code != http.StatusBadRequest ||
			!strings.Contains(body, `"code":"invalid_request"`) {
			t.Errorf("deploy of spec %d: %d %.200s; want 400 invalid_request", i, code, body)
		}
	}
	if apps, err := h.st.Apps(context.Background(), ""); err != nil || len(apps) != 1 || apps[0].Version != 1 {
		t.Fatalf("apps %+v, %v; want web alone, at version 1", apps, err)
	}
}

// TestOpenAPI_MemoryFloorInTheSchema: api/openapi.yaml says what the server does — a
// memory_mb of 1…63 breaks the schema of a sandbox create, an app create and a template,
// while 0 (the template's) and the floor itself are valid.
func TestOpenAPI_MemoryFloorInTheSchema(t *testing.T) {
	o := newOAClient(t, "http://127.0.0.1:1")
	app := func(mem int) string {
		return fmt.Sprintf(`{"name":"web","template":"shell","command":["x"],"port":8080,"memory_mb":%d}`, mem)
	}
	for _, tc := range []struct {
		method, path, body string
		valid              bool
	}{
		{"POST", "/v1/sandboxes", `{"template":"shell","memory_mb":1}`, false},
		{"POST", "/v1/sandboxes", `{"template":"shell","memory_mb":63}`, false},
		{"POST", "/v1/sandboxes", `{"template":"shell","memory_mb":0}`, true},
		{"POST", "/v1/sandboxes", `{"template":"shell","memory_mb":64}`, true},
		{"POST", "/v1/apps", app(1), false},
		{"POST", "/v1/apps", app(0), true},
		{"POST", "/v1/apps", app(64), true},
		{"PUT", "/v1/templates/tiny", `{"memory_mb":16,"vcpus":1}`, false},
		{"PUT", "/v1/templates/tiny", `{"memory_mb":64,"vcpus":1}`, true},
	} {
		req, _ := http.NewRequest(tc.method, o.base+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		route, params, err := o.router.FindRoute(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		err = openapi3filter.ValidateRequest(context.Background(), &openapi3filter.RequestValidationInput{Request: req, PathParams: params,
			Route: route, Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}})
		if (err == nil) != tc.valid {
			t.Errorf("%s %s %s: schema says %v; want valid %v", tc.method, tc.path, tc.body, err, tc.valid)
		}
	}
}
