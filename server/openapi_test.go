package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/api"
)

// notAPIRoutes are the patterns the server's mux registers that api/openapi.yaml does not
// describe, each with why. Nothing under /v1/ may be here: every /v1/ route is API.
var notAPIRoutes = map[string]string{
	"/":                        "the catch-all 404 not_found answer; its body is checked against ErrorBody below",
	"GET /debug/pprof/":        "the Go profiler (admin key, issue 15): Go's own formats, not the API",
	"GET /debug/pprof/cmdline": "the Go profiler",
	"GET /debug/pprof/profile": "the Go profiler",
	"GET /debug/pprof/symbol":  "the Go profiler",
	"POST /debug/pprof/symbol": "the Go profiler",
	"GET /debug/pprof/trace":   "the Go profiler",
	"GET /{$}":                 "the bare address: a redirect to the dashboard, not the API",
	"GET /ui":                  "the web dashboard (issue 17, point 4): HTML, CSS and JavaScript, not the API",
	"GET /ui/{file...}":        "the web dashboard's files",
}

// loadOpenAPI loads and validates api/openapi.yaml (OpenAPI 3.1: kin-openapi v0.153.0 loads
// it and validates with JSON Schema 2020-12).
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("load api/openapi.yaml: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("api/openapi.yaml is OpenAPI %s; want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	return doc
}

var wildcard = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*)(\.\.\.)?\}`)

// anyMethod are the operations a pattern without a method (it serves every method) must
// have in the document.
var anyMethod = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// TestOpenAPI_EveryRouteDocumented (issue 17, point 1): every pattern the server's mux
// registers is an operation of api/openapi.yaml (a {rest...} wildcard is the path parameter
// {rest}; a pattern with no method needs every method), except the explicit notAPIRoutes,
// none of them under /v1/; and every operation of the document is a registered route.
func TestOpenAPI_EveryRouteDocumented(t *testing.T) {
	doc := loadOpenAPI(t)
	h := newHarness(t, time.Millisecond)
	_, patterns := h.s.routeTable()
	if len(patterns) < 40 {
		t.Fatalf("the mux recorded %d patterns; the recorder misses routes", len(patterns))
	}
	for p, why := range notAPIRoutes {
		if strings.Contains(p, "/v1/") || strings.HasPrefix(p, "/v1") {
			t.Errorf("notAPIRoutes holds %q (%s): every route under /v1/ belongs in api/openapi.yaml", p, why)
		}
	}
	served := map[string]bool{} // "METHOD /path" as the document writes it
	for _, p := range patterns {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			method, path = "", p
		}
		docPath := wildcard.ReplaceAllString(path, "{$1}")
		methods := []string{method}
		if method == "" {
			methods = anyMethod
		}
		for _, m := range methods {
			served[m+" "+docPath] = true
		}
		if _, skip := notAPIRoutes[p]; skip {
			continue
		}
		item := doc.Paths.Value(docPath)
		for _, m := range methods {
			if item == nil || item.GetOperation(m) == nil {
				t.Errorf("route %q is registered on the server's mux but api/openapi.yaml has no %s %s: describe it there (or, for a route outside the API and not under /v1/, add it to notAPIRoutes with why)", p, m, docPath)
			}
		}
	}
	for path, item := range doc.Paths.Map() {
		for m := range item.Operations() {
			if !served[m+" "+path] {
				t.Errorf("api/openapi.yaml describes %s %s, which the server does not register", m, path)
			}
		}
	}
	for p := range notAPIRoutes {
		if !slices.Contains(patterns, p) {
			t.Logf("notAPIRoutes lists %q, which the mux does not register (yet)", p)
		}
	}
}

// oaClient sends requests to a running server and holds each answer against the document.
type oaClient struct {
	t      *testing.T
	base   string
	router routers.Router
	doc    *openapi3.T
	seen   map[string]bool // operationId + " " + status, for the coverage check
}

func newOAClient(t *testing.T, base string) *oaClient {
	doc := loadOpenAPI(t)
	doc.Servers = openapi3.Servers{{URL: base}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("router over api/openapi.yaml: %v", err)
	}
	return &oaClient{t: t, base: base, router: router, doc: doc, seen: map[string]bool{}}
}

// oaCall is one request and the status it must get.
type oaCall struct {
	method, path, key string
	body              any // nil, []byte (raw) or a value sent as JSON
	header            map[string]string
	want              int
	code              string // the error code a non-2xx answer must carry
	// invalid marks a request that breaks the document on purpose (a bad body or
	// parameter): it is not validated against the document, its answer is.
	invalid bool
}

// do sends c, checks its status (and error code), validates the request (unless
// c.invalid) and the answer — status, headers and body, no field the document does not
// describe — against the document, and returns the answer's body.
func (o *oaClient) do(c oaCall) []byte {
	t := o.t
	t.Helper()
	var raw []byte
	ctype := ""
	switch b := c.body.(type) {
	case nil:
	case []byte:
		raw, ctype = b, "application/octet-stream"
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			t.Fatal(err)
		}
		ctype = "application/json"
	}
	newReq := func() *http.Request {
		req, err := http.NewRequest(c.method, o.base+c.path, bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		if raw == nil {
			req.Body, req.ContentLength = http.NoBody, 0
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		return req
	}
	what := c.method + " " + c.path
	req := newReq()
	route, params, err := o.router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s: not in api/openapi.yaml: %v", what, err)
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	if !c.invalid {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			t.Errorf("%s: the request does not match api/openapi.yaml: %s", what, short(err))
		}
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(newReq())
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: read answer: %v", what, err)
	}
	if resp.StatusCode != c.want {
		t.Errorf("%s: %d %s; want %d", what, resp.StatusCode, trim(body), c.want)
	}
	o.checkError(what, resp, body, c.code)
	in.Request = newReq() // the validator reads nothing from it but its shape
	rin := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	rin.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), rin); err != nil {
		t.Errorf("%s: the answer (%d %s) does not match api/openapi.yaml: %s", what, resp.StatusCode, trim(body), short(err))
	}
	o.seen[route.Operation.OperationID+" "+strconv.Itoa(resp.StatusCode)] = true
	return body
}

// checkError checks what a schema cannot: a non-2xx answer carries the wanted code, and a
// retryable one's Retry-After header equals its retry_after_s.
func (o *oaClient) checkError(what string, resp *http.Response, body []byte, code string) {
	t := o.t
	t.Helper()
	if resp.StatusCode < 400 {
		return
	}
	var eb berth.ErrorBody
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Errorf("%s: error answer %s is not an error body: %v", what, trim(body), err)
		return
	}
	if code != "" && eb.Error.Code != code {
		t.Errorf("%s: code %q (%s); want %q", what, eb.Error.Code, eb.Error.Message, code)
	}
	if ra := resp.Header.Get("Retry-After"); eb.Error.Retryable && ra != strconv.Itoa(eb.Error.RetryAfterS) {
		t.Errorf("%s: Retry-After %q, retry_after_s %d: want the same", what, ra, eb.Error.RetryAfterS)
	}
	if eb.Error.RequestID == "" || eb.Error.RequestID != resp.Header.Get(berth.HeaderRequestID) {
		t.Errorf("%s: request_id %q, X-Request-Id %q: want the same", what, eb.Error.RequestID, resp.Header.Get(berth.HeaderRequestID))
	}
}

// short is a validation error without the schema and value dumps: each schema error's
// reason and where in the body it is.
func short(err error) string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		var me openapi3.MultiError
		var se *openapi3.SchemaError
		switch {
		case errors.As(err, &me):
			for _, e := range me {
				walk(e)
			}
		case errors.As(err, &se):
			out = append(out, fmt.Sprintf("at /%s: %s", strings.Join(se.JSONPointer(), "/"), se.Reason))
		default:
			out = append(out, err.Error())
		}
	}
	walk(err)
	if len(out) == 0 {
		return err.Error()
	}
	return strings.Join(out, "; ")
}

func trim(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// decode unmarshals an answer the test reads on.
func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", trim(b), err)
	}
	return v
}

// buildBerth builds this repository's berth binary into dir.
func buildBerth(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "berth")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/berth-dev/berth/cmd/berth")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build berth: %v\n%s", err, out)
	}
	return bin
}

// startAgent runs a real `berth agent` (process runtime: isolated as root, --insecure
// otherwise) that joins base with the node token; it is stopped when the test ends, SIGTERM
// then SIGKILL after 10 s, and dies with the test process (Pdeathsig).
func startAgent(t *testing.T, bin, base, id string) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"agent", "--server", base, "--id", id, "--runtime", "process", "--admission", "committed",
		"--memory-mb", "4096", "--headroom-mb", "0", "--heartbeat-interval", "200ms", "--listen", "127.0.0.1:0",
		"--dir", filepath.Join(dir, "agent"), "--volume-dir", filepath.Join(dir, "volumes")}
	if os.Geteuid() != 0 {
		args = append(args, "--insecure")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "BERTH_NODE_TOKEN=node-token")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if runtime.GOOS == "linux" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("agent %s output:\n%s", id, logs.String())
		}
	})
}

// TestOpenAPI_AnswersMatchTheDocument (issue 17, point 1): a real server (real HTTP on
// 127.0.0.1, SQLite) with a real `berth agent` (process runtime) answers a request for
// every documented operation — successes and the main errors — and every request and
// answer (status, headers, body; a field the document does not describe fails:
// additionalProperties is false on every answer object) matches api/openapi.yaml.
func TestOpenAPI_AnswersMatchTheDocument(t *testing.T) {
	if testing.Short() {
		t.Skip("builds berth and starts an agent")
	}
	h := newHarnessWith(t, func(c *Config) { c.CacheTTL, c.AppReconcileInterval = time.Millisecond, 50*time.Millisecond })
	h.running(t)
	o := newOAClient(t, h.srv.URL)
	admin := h.key
	type m = map[string]any

	// Operations and the catch-all.
	o.do(oaCall{method: "GET", path: "/healthz", want: 200})
	o.do(oaCall{method: "GET", path: "/readyz", want: 200})
	o.do(oaCall{method: "GET", path: "/metrics", want: 200})
	if b := o.do(oaCall{method: "GET", path: "/v1/openapi.yaml", want: 200}); !bytes.Equal(b, api.OpenAPI) {
		t.Errorf("GET /v1/openapi.yaml is not api/openapi.yaml")
	}
	o.checkCatchAll(admin)

	// Tenants, keys, quotas (admin).
	o.do(oaCall{method: "POST", path: "/v1/tenants", key: admin, body: m{"name": "beta"}, want: 201})
	o.do(oaCall{method: "POST", path: "/v1/tenants", key: admin, body: m{"name": "beta"}, want: 409, code: berth.EConflict})
	o.do(oaCall{method: "POST", path: "/v1/tenants", key: admin, body: m{"name": "Not A Name"}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/tenants", key: admin, body: m{"name": "x", "extra": 1}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/tenants", key: admin, body: []byte(`{"name":"` + strings.Repeat("x", maxJSONBytes) + `"}`), want: 413, code: berth.ETooLarge, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/tenants", body: m{"name": "gamma"}, want: 401, code: berth.EUnauthorized})
	o.do(oaCall{method: "POST", path: "/v1/tenants", key: "bk_unknown", body: m{"name": "gamma"}, want: 401, code: berth.EUnauthorized})
	key := decode[APIKeySecret](t, o.do(oaCall{method: "POST", path: "/v1/tenants/beta/keys", key: admin, body: m{"role": "tenant"}, want: 201}))
	tenant := key.Key
	o.do(oaCall{method: "POST", path: "/v1/tenants/beta/keys", key: admin, want: 201}) // no body: a tenant key
	o.do(oaCall{method: "POST", path: "/v1/tenants/ghost/keys", key: admin, body: m{}, want: 404, code: berth.ENotFound})
	o.do(oaCall{method: "POST", path: "/v1/tenants", key: tenant, body: m{"name": "gamma"}, want: 403, code: berth.EForbidden})
	o.do(oaCall{method: "PUT", path: "/v1/tenants/beta/quota", key: admin, body: m{"max_sandboxes": 1, "max_memory_mb": 0}, want: 200})
	o.do(oaCall{method: "PUT", path: "/v1/tenants/beta/quota", key: admin, body: m{"max_sandboxes": -1}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "PUT", path: "/v1/tenants/ghost/quota", key: admin, body: m{"max_sandboxes": 1}, want: 404, code: berth.ENotFound})
	o.do(oaCall{method: "GET", path: "/v1/tenants/beta/quota", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/tenants/ghost/quota", key: admin, want: 404, code: berth.ENotFound})

	// Templates.
	o.do(oaCall{method: "GET", path: "/v1/templates", key: tenant, want: 200})
	o.do(oaCall{method: "PUT", path: "/v1/templates/tiny", key: admin, body: m{"memory_mb": 64, "vcpus": 1}, want: 200})
	o.do(oaCall{method: "PUT", path: "/v1/templates/tiny", key: admin, body: m{"memory_mb": 0, "vcpus": 1}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "PUT", path: "/v1/templates/tiny", key: admin, body: m{"memory_mb": 16, "vcpus": 1}, want: 400, code: berth.EInvalidRequest, invalid: true})

	// No host yet: a create is refused with 503 and Retry-After.
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: tenant, body: m{"template": "tiny"}, want: 503, code: berth.ENoHealthyAgents})
	o.do(oaCall{method: "GET", path: "/v1/agents/credentials", key: admin, want: 200}) // none yet: null

	// A real agent joins.
	startAgent(t, buildBerth(t, t.TempDir()), h.srv.URL, "oa-agent")
	for deadline := time.Now().Add(60 * time.Second); ; {
		if a, err := h.st.Agent(context.Background(), "oa-agent"); err == nil && a.IntakeOpen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent did not join and heartbeat within 60 s")
		}
		time.Sleep(50 * time.Millisecond) // real: the agent joins and heartbeats over loopback HTTP
	}
	o.do(oaCall{method: "GET", path: "/v1/agents", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/agents?held=count", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/agents?held=everything", key: admin, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "GET", path: "/v1/agents", key: tenant, want: 403, code: berth.EForbidden})
	o.do(oaCall{method: "GET", path: "/v1/agents/credentials", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/agents/oa-agent/drain", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/agents/ghost/drain", key: admin, want: 404, code: berth.ENotFound})

	// Sandboxes.
	idem := map[string]string{berth.HeaderIdempotencyKey: "oa-1", berth.HeaderFirstAttempt: time.Now().UTC().Format(time.RFC3339), berth.HeaderAttempt: "1"}
	sb := decode[berth.Sandbox](t, o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: tenant, header: idem,
		body: m{"template": "tiny", "ttl_seconds": 600, "metadata": m{"purpose": "openapi"}}, want: 201}))
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: tenant, header: idem, body: m{"template": "tiny", "ttl_seconds": 600, "metadata": m{"purpose": "openapi"}}, want: 201})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: tenant, header: idem, body: m{"template": "tiny", "ttl_seconds": 60}, want: 422, code: berth.EIdempotencyMismatch})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: tenant, body: m{"template": "tiny"}, want: 403, code: berth.ETenantOverQuota})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: admin, body: m{"template": "nope"}, want: 404, code: berth.ETemplateNotFound})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: admin, body: m{"template": "tiny", "memory_mb": 2_000_000}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: admin, body: m{"template": "tiny", "memory_mb": 1}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: admin, body: m{"template": "tiny", "memory_mb": 8192}, want: 400, code: berth.EInvalidRequest})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes", key: admin, body: m{"template": "tiny", "tll": 5}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "GET", path: "/v1/sandboxes/" + sb.ID, key: tenant, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/sandboxes/sb-ghost", key: tenant, want: 404, code: berth.ESandboxNotFound})
	o.do(oaCall{method: "GET", path: "/v1/sandboxes", key: tenant, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/sandboxes?state=running", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/sandboxes?state=bogus", key: admin, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/exec", key: tenant, body: m{"cmd": []string{"echo", "hi"}, "timeout_s": 30}, want: 200})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/exec", key: tenant, body: m{"cmd": []string{}}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "PUT", path: "/v1/sandboxes/" + sb.ID + "/files?path=/tmp/oa.txt", key: tenant, body: []byte("hello"), want: 204})
	if b := o.do(oaCall{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/files?path=/tmp/oa.txt", key: tenant, want: 200}); string(b) != "hello" {
		t.Errorf("read back %q; want hello", b)
	}
	o.do(oaCall{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/files?path=tmp/../x", key: tenant, want: 400, code: berth.EInvalidRequest})
	o.do(oaCall{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/pause", key: tenant, want: 409, code: berth.EConflict}) // process runtime: no checkpoint
	o.do(oaCall{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/resume", key: tenant, want: 200})                       // running: as it is
	o.do(oaCall{method: "POST", path: "/v1/sandboxes/sb-ghost/pause", key: tenant, want: 404, code: berth.ESandboxNotFound})

	// Events and reservations.
	o.do(oaCall{method: "GET", path: "/v1/events?entity=sandbox/" + sb.ID + "&limit=100", key: tenant, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/events?type=agent&since=2020-01-01T00:00:00Z", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/events?entity=agent/oa-agent", key: tenant, want: 403, code: berth.EForbidden})
	o.do(oaCall{method: "GET", path: "/v1/events?limit=0", key: admin, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "GET", path: "/v1/events?entity=sandbox/&to=running&type=sandbox", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/events?entity=bogus", key: admin, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "GET", path: "/v1/events?to=bogus", key: admin, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "GET", path: "/v1/reservations", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/refusals", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/refusals?window=600", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/refusals", key: tenant, want: 403, code: berth.EForbidden})

	// Apps.
	app := m{"name": "web", "template": "tiny", "command": []string{"python3", "-m", "http.server", "8080"}, "port": 8080,
		"files": m{"index.html": "hi"}, "env": m{"A": "b"}, "idle_seconds": 300}
	o.do(oaCall{method: "POST", path: "/v1/apps", key: admin, body: app, header: map[string]string{berth.HeaderIdempotencyKey: "oa-app"}, want: 201})
	o.do(oaCall{method: "POST", path: "/v1/apps", key: admin, body: app, want: 409, code: berth.EConflict})
	o.do(oaCall{method: "POST", path: "/v1/apps", key: admin, body: m{"name": "Web!", "template": "tiny", "command": []string{"x"}, "port": 1}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/apps", key: admin, body: m{"name": "tiny", "template": "tiny", "command": []string{"x"}, "port": 1, "memory_mb": 1}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "GET", path: "/v1/apps", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/apps", key: tenant, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/apps/web", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/v1/apps/web", key: tenant, want: 404, code: berth.EAppNotFound})
	o.do(oaCall{method: "POST", path: "/v1/apps/web/deploy", key: admin, body: m{"template": "tiny", "command": []string{"python3", "-m", "http.server", "8081"}, "port": 8081}, want: 202})
	o.do(oaCall{method: "POST", path: "/v1/apps/web/deploy", key: admin, body: m{"template": "tiny", "command": []string{"x"}, "port": 0}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/apps/web/idle", key: admin, body: m{"idle_seconds": 0}, want: 202})
	o.do(oaCall{method: "POST", path: "/v1/apps/web/idle", key: admin, body: m{}, want: 400, code: berth.EInvalidRequest, invalid: true})
	for _, verb := range []string{"hibernate", "wake", "start", "stop"} {
		o.do(oaCall{method: "POST", path: "/v1/apps/web/" + verb, key: admin, want: 202})
	}
	o.do(oaCall{method: "POST", path: "/v1/apps/ghost/stop", key: admin, want: 404, code: berth.EAppNotFound})
	o.do(oaCall{method: "GET", path: "/v1/events?entity=app/web", key: admin, want: 200})
	o.do(oaCall{method: "GET", path: "/apps/web/index.html", want: 409, code: berth.EAppStopped}) // stopped by its owner
	o.do(oaCall{method: "POST", path: "/apps/web/form", want: 409, code: berth.EAppStopped})
	o.do(oaCall{method: "GET", path: "/apps/web", want: 308})
	o.do(oaCall{method: "GET", path: "/apps/ghost/x", want: 404, code: berth.EAppNotFound})
	o.do(oaCall{method: "DELETE", path: "/v1/apps/web", key: admin, want: 204})
	o.do(oaCall{method: "DELETE", path: "/v1/apps/web", key: admin, want: 404, code: berth.EAppNotFound})

	// Drain (admin).
	o.do(oaCall{method: "POST", path: "/v1/agents/oa-agent/drain", key: admin, body: m{"reason": strings.Repeat("x", 513)}, want: 400, code: berth.EInvalidRequest, invalid: true})
	o.do(oaCall{method: "POST", path: "/v1/agents/oa-agent/drain", key: admin, body: m{"reason": "openapi test"}, want: 202})
	o.do(oaCall{method: "GET", path: "/v1/agents/oa-agent/drain", key: admin, want: 200})
	o.do(oaCall{method: "POST", path: "/v1/agents/oa-agent/undrain", key: admin, want: 200})
	o.do(oaCall{method: "POST", path: "/v1/agents/ghost/drain", key: admin, want: 404, code: berth.ENotFound})

	// The agent protocol: join, heartbeat, evacuate, revoke.
	join := decode[struct{ Credential string }](t, o.do(oaCall{method: "POST", path: "/v1/agents/join", key: "node-token", body: m{"agent_id": "oa-fake"}, want: 201}))
	o.do(oaCall{method: "POST", path: "/v1/agents/join", key: admin, body: m{"agent_id": "oa-fake"}, want: 401, code: berth.EUnauthorized})
	o.do(oaCall{method: "POST", path: "/v1/agents/join", key: "node-token", body: m{"agent_id": "bad id!"}, want: 400, code: berth.EInvalidRequest, invalid: true})
	hb := berth.Heartbeat{AgentID: "oa-fake", Address: "http://127.0.0.1:1", Pool: berth.PoolStateful, HeartbeatAt: time.Now().UTC(),
		Seq: 1, Status: berth.AgentDraining, CPUTotal: 1, MemoryMiBTotal: 64, MemoryAdmission: berth.AdmissionCommitted,
		Sandboxes: []berth.HeldSandbox{}, Version: "test", BootID: "boot-1", Runtime: "noop"}
	o.do(oaCall{method: "POST", path: "/v1/agents/heartbeat", key: join.Credential, body: hb, want: 200})
	delta := hb
	delta.Seq, delta.Delta, delta.BaseSeq = 2, true, 5
	o.do(oaCall{method: "POST", path: "/v1/agents/heartbeat", key: join.Credential, body: delta, want: 400, code: berth.EInvalidRequest})
	other := hb
	other.AgentID = "oa-agent"
	o.do(oaCall{method: "POST", path: "/v1/agents/heartbeat", key: join.Credential, body: other, want: 403, code: berth.EForbidden})
	o.do(oaCall{method: "POST", path: "/v1/agents/heartbeat", key: "node-token", body: hb, want: 401, code: berth.EUnauthorized})
	plan := berth.EvacuateRequest{DeadlineInMS: 1000, Steps: []berth.EvacuateStep{}}
	o.do(oaCall{method: "POST", path: "/v1/agents/oa-fake/evacuate", key: join.Credential, body: plan, want: 200})
	o.do(oaCall{method: "POST", path: "/v1/agents/oa-agent/evacuate", key: join.Credential, body: plan, want: 403, code: berth.EForbidden})
	o.do(oaCall{method: "POST", path: "/v1/agents/oa-fake/revoke", key: admin, want: 200})
	o.do(oaCall{method: "POST", path: "/v1/agents/ghost/revoke", key: admin, want: 404, code: berth.ENotFound})
	o.do(oaCall{method: "POST", path: "/v1/agents/heartbeat", key: join.Credential, body: hb, want: 401, code: berth.EUnauthorized})
	o.do(oaCall{method: "POST", path: "/v1/agents/join", key: "node-token", body: m{"agent_id": "oa-fake"}, want: 403, code: berth.EForbidden})

	// Delete (idempotent).
	o.do(oaCall{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, key: tenant, want: 204})
	o.do(oaCall{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, key: tenant, want: 204})
	o.do(oaCall{method: "DELETE", path: "/v1/sandboxes/sb-ghost", key: tenant, want: 404, code: berth.ESandboxNotFound})

	// 429: a second server whose tenants may send one request.
	rl := newHarnessWith(t, func(c *Config) { c.TenantRate, c.TenantBurst = 0.001, 1 })
	must(t, rl.st.PutAPIKey(context.Background(), berth.APIKey{ID: "k2", Tenant: "acme", Role: berth.RoleTenant, Hash: HashKey("bk_rl"), CreatedAt: time.Now()}))
	orl := newOAClient(t, rl.srv.URL)
	orl.do(oaCall{method: "GET", path: "/v1/sandboxes", key: "bk_rl", want: 200})
	orl.do(oaCall{method: "GET", path: "/v1/sandboxes", key: "bk_rl", want: 429, code: berth.ERateLimited})

	// Every operation of the document was called.
	for path, item := range o.doc.Paths.Map() {
		for _, op := range item.Operations() {
			if !o.calledAny(op.OperationID) && !orl.calledAny(op.OperationID) && !strings.HasPrefix(op.OperationID, "appRedirect") && !strings.HasPrefix(op.OperationID, "appRequest") {
				t.Errorf("operation %s (%s) was never called by this test", op.OperationID, path)
			}
		}
	}
}

func (o *oaClient) calledAny(opID string) bool {
	for k := range o.seen {
		if strings.HasPrefix(k, opID+" ") {
			return true
		}
	}
	return false
}

// checkCatchAll: a request for no route gets 404 not_found, and one whose path is a route for
// other methods 405 method_not_allowed with an Allow header listing them (HEAD with GET);
// either body is the document's ErrorBody (the catch-all "/" is not an operation of the
// document).
func (o *oaClient) checkCatchAll(key string) {
	t := o.t
	for _, c := range []struct {
		method, path string
		want         int
		code, allow  string
	}{
		{http.MethodGet, "/v1/no-such-route", 404, berth.ENotFound, ""},
		{http.MethodPatch, "/v1/sandboxes", 405, berth.EMethodNotAllowed, "GET, HEAD, POST"},
		{http.MethodPost, "/v1/sandboxes/sb-1", 405, berth.EMethodNotAllowed, "GET, HEAD, DELETE"},
		{http.MethodGet, "/v1/agents/heartbeat", 405, berth.EMethodNotAllowed, "POST"},
		{http.MethodDelete, "/v1/templates/python", 405, berth.EMethodNotAllowed, "PUT"},
		{http.MethodPut, "/v1/sandboxes/", 404, berth.ENotFound, ""},
	} {
		what := c.method + " " + c.path
		req, _ := http.NewRequest(c.method, o.base+c.path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s: %d, Allow %q; want %d, Allow %q", what, resp.StatusCode, resp.Header.Get("Allow"), c.want, c.allow)
		}
		o.checkError(what, resp, body, c.code)
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("%s: body %s: %v", what, body, err)
		}
		schema := o.doc.Components.Schemas["ErrorBody"].Value
		if err := schema.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
			t.Errorf("%s: body %s does not match ErrorBody: %v", what, body, err)
		}
	}
}
