package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// TestContract pins every call to the v1 HTTP contract (SPEC §13): method, escaped path,
// query, body and the decoding of the answer.
func TestContract(t *testing.T) {
	ctx := context.Background()
	hb := berth.Heartbeat{AgentID: "a1", Region: "eu", Pool: berth.PoolEphemeral, MemoryMiBTotal: 8192, IntakeOpen: true}
	hbJSON, _ := json.Marshal(hb)
	tests := []struct {
		name      string
		call      func(*Client) (any, error)
		answer    reply
		method    string
		path      string
		query     string
		body      string // JSON compared by value unless ctype is octet-stream
		ctype     string
		idemKey   string // "*" = any non-empty key
		want      any
		wantQuery map[string]string
	}{
		{
			name: "create",
			call: func(c *Client) (any, error) {
				return c.CreateSandbox(ctx, berth.CreateRequest{Template: "python", MemoryMiB: 1024, Stateful: true, Metadata: map[string]string{"job": "7"}})
			},
			answer: reply{status: 201, body: sandboxJSON},
			method: "POST", path: "/v1/sandboxes", ctype: "application/json", idemKey: "*",
			body: `{"template":"python","memory_mb":1024,"stateful":true,"metadata":{"job":"7"}}`,
			want: sandboxWant,
		},
		{
			name: "create with the caller's key",
			call: func(c *Client) (any, error) {
				return c.CreateSandboxWithKey(ctx, berth.CreateRequest{Template: "shell"}, "job-7-try")
			},
			answer: reply{status: 201, body: sandboxJSON},
			method: "POST", path: "/v1/sandboxes", ctype: "application/json", idemKey: "job-7-try",
			body: `{"template":"shell"}`, want: sandboxWant,
		},
		{
			name:   "get escapes the id",
			call:   func(c *Client) (any, error) { return c.Sandbox(ctx, "sb/1 x") },
			answer: reply{status: 200, body: sandboxJSON},
			method: "GET", path: "/v1/sandboxes/sb%2F1%20x", want: sandboxWant,
		},
		{
			name:   "list by state",
			call:   func(c *Client) (any, error) { return c.Sandboxes(ctx, berth.SandboxRunning) },
			answer: reply{status: 200, body: `{"sandboxes":[` + sandboxJSON + `]}`},
			method: "GET", path: "/v1/sandboxes", query: "state=running", want: []berth.Sandbox{sandboxWant},
		},
		{
			name:   "list all",
			call:   func(c *Client) (any, error) { return c.Sandboxes(ctx, "") },
			answer: reply{status: 200, body: `{"sandboxes":[]}`},
			method: "GET", path: "/v1/sandboxes", want: []berth.Sandbox{},
		},
		{
			name:   "delete",
			call:   func(c *Client) (any, error) { return nil, c.DeleteSandbox(ctx, "sb-1") },
			answer: reply{status: 204},
			method: "DELETE", path: "/v1/sandboxes/sb-1",
		},
		{
			name: "exec",
			call: func(c *Client) (any, error) {
				return c.Exec(ctx, "sb-1", berth.ExecRequest{Cmd: []string{"python3", "-c", "print(2+2)"}, TimeoutS: 5})
			},
			answer: reply{status: 200, body: `{"exit_code":3,"stdout":"4\n","stderr":"warn"}`},
			method: "POST", path: "/v1/sandboxes/sb-1/exec", ctype: "application/json",
			body: `{"cmd":["python3","-c","print(2+2)"],"timeout_s":5}`,
			want: berth.ExecResult{ExitCode: 3, Stdout: "4\n", Stderr: "warn"},
		},
		{
			name: "write file",
			call: func(c *Client) (any, error) {
				return nil, c.WriteFile(ctx, "sb-1", "/tmp/a b&c=.txt", []byte{0, 1, 2, 255})
			},
			answer: reply{status: 204},
			method: "PUT", path: "/v1/sandboxes/sb-1/files", ctype: "application/octet-stream",
			query: "path=%2Ftmp%2Fa+b%26c%3D.txt", wantQuery: map[string]string{"path": "/tmp/a b&c=.txt"},
			body: "\x00\x01\x02\xff",
		},
		{
			name:   "write empty file",
			call:   func(c *Client) (any, error) { return nil, c.WriteFile(ctx, "sb-1", "/e", nil) },
			answer: reply{status: 204},
			method: "PUT", path: "/v1/sandboxes/sb-1/files", ctype: "application/octet-stream", query: "path=%2Fe",
		},
		{
			name:   "read file",
			call:   func(c *Client) (any, error) { return c.ReadFile(ctx, "sb-1", "/etc/hostname") },
			answer: reply{status: 200, header: map[string]string{"Content-Type": "application/octet-stream"}, body: "\x00raw\xff"},
			method: "GET", path: "/v1/sandboxes/sb-1/files", query: "path=%2Fetc%2Fhostname", want: []byte("\x00raw\xff"),
		},
		{
			name:   "templates",
			call:   func(c *Client) (any, error) { return c.Templates(ctx) },
			answer: reply{status: 200, body: `{"templates":[{"name":"python","memory_mb":512,"vcpus":1}]}`},
			method: "GET", path: "/v1/templates",
			want: []berth.Template{{Name: "python", MemoryMiB: 512, VCPUs: 1}},
		},
		{
			name:   "agents",
			call:   func(c *Client) (any, error) { return c.Agents(ctx) },
			answer: reply{status: 200, body: `{"agents":[{"agent_id":"a1","status":"draining","memory_mb_total":8192,"drain_reason":"kernel","last_seen_s":2.5}]}`},
			method: "GET", path: "/v1/agents",
			want: []berth.Agent{{Heartbeat: berth.Heartbeat{AgentID: "a1", Status: berth.AgentDraining, MemoryMiBTotal: 8192}, DrainReason: "kernel", LastSeenS: 2.5}},
		},
		{
			name:   "drain",
			call:   func(c *Client) (any, error) { return nil, c.DrainAgent(ctx, "a1", "kernel update") },
			answer: reply{status: 202},
			method: "POST", path: "/v1/agents/a1/drain", ctype: "application/json", body: `{"reason":"kernel update"}`,
		},
		{
			name:   "undrain",
			call:   func(c *Client) (any, error) { return nil, c.UndrainAgent(ctx, "a1") },
			answer: reply{status: 200, body: `{"agent_id":"a1"}`},
			method: "POST", path: "/v1/agents/a1/undrain", ctype: "application/json", body: `{}`,
		},
		{
			name:   "events of one entity",
			call:   func(c *Client) (any, error) { return c.Events(ctx, "sandbox/sb-1") },
			answer: reply{status: 200, body: `{"events":[{"at":"2030-01-02T03:04:05Z","entity":"sandbox/sb-1","from":"pending","to":"running","reason":"started","actor":"agent/a1"}]}`},
			method: "GET", path: "/v1/events", query: "entity=sandbox%2Fsb-1",
			want: []berth.Event{{At: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), Entity: "sandbox/sb-1", From: "pending", To: "running", Reason: "started", Actor: "agent/a1"}},
		},
		{
			name:   "heartbeat",
			call:   func(c *Client) (any, error) { return nil, c.Heartbeat(ctx, hb) },
			answer: reply{status: 204},
			method: "POST", path: "/v1/agents/heartbeat", ctype: "application/json", body: string(hbJSON),
		},
		{
			name:   "create tenant",
			call:   func(c *Client) (any, error) { return c.CreateTenant(ctx, "acme") },
			answer: reply{status: 201, body: `{"name":"acme","created_at":"2030-01-02T03:04:05Z"}`},
			method: "POST", path: "/v1/tenants", ctype: "application/json", body: `{"name":"acme"}`,
			want: berth.Tenant{Name: "acme", CreatedAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)},
		},
		{
			name:   "create key",
			call:   func(c *Client) (any, error) { return c.CreateAPIKey(ctx, "acme", berth.RoleTenant) },
			answer: reply{status: 201, body: `{"id":"k1","tenant":"acme","role":"tenant","key":"s3cret"}`},
			method: "POST", path: "/v1/tenants/acme/keys", ctype: "application/json", body: `{"role":"tenant"}`,
			want: APIKeySecret{ID: "k1", Tenant: "acme", Role: berth.RoleTenant, Key: "s3cret"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, s := newScripted(t, tt.answer)
			got, err := tt.call(New(srv.URL+"/", "key-1"))
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if tt.want != nil {
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("result (-want +got):\n%s", diff)
				}
			}
			reqs := s.Seen()
			if len(reqs) != 1 {
				t.Fatalf("server saw %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.Method != tt.method || r.Path != tt.path || r.RawQuery != tt.query {
				t.Errorf("request %s %s?%s, want %s %s?%s", r.Method, r.Path, r.RawQuery, tt.method, tt.path, tt.query)
			}
			q, err := url.ParseQuery(r.RawQuery)
			if err != nil {
				t.Fatalf("query %q: %v", r.RawQuery, err)
			}
			for k, v := range tt.wantQuery {
				if q.Get(k) != v {
					t.Errorf("query %s = %q, want %q", k, q.Get(k), v)
				}
			}
			if got := r.Header.Get("Authorization"); got != "Bearer key-1" {
				t.Errorf("Authorization %q", got)
			}
			if got := r.Header.Get("User-Agent"); got != DefaultUserAgent {
				t.Errorf("User-Agent %q", got)
			}
			if got := r.Header.Get("Content-Type"); got != tt.ctype {
				t.Errorf("Content-Type %q, want %q", got, tt.ctype)
			}
			key := r.Header.Get(berth.HeaderIdempotencyKey)
			if (tt.idemKey == "*" && key == "") || (tt.idemKey != "*" && key != tt.idemKey) {
				t.Errorf("Idempotency-Key %q, want %q", key, tt.idemKey)
			}
			if (key != "") != (r.Header.Get(berth.HeaderFirstAttempt) != "") {
				t.Errorf("Idempotency-Key %q without first-attempt time, or the other way round", key)
			}
			checkBody(t, tt.ctype, tt.body, r.Body)
		})
	}
}

func checkBody(t *testing.T, ctype, want, got string) {
	t.Helper()
	if ctype != "application/json" {
		if got != want {
			t.Errorf("body %q, want %q", got, want)
		}
		return
	}
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want body: %v", err)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("body %q: %v", got, err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
}

func TestDecodeError(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	capacity := `{"error":{"code":"no_capacity","message":"12 hosts: 8 insufficient memory, 3 draining, 1 stale",` +
		`"retryable":true,"retry_after_s":12,"request_id":"r1","hosts":{"total":12,"insufficient_memory":8,"draining":3,"stale":1}}}`
	tests := []struct {
		name   string
		status int
		header map[string]string
		body   string
		want   *berth.Error
	}{
		{"C21 refusal with hosts", 503, nil, capacity, &berth.Error{
			Code: berth.ENoCapacity, Message: "12 hosts: 8 insufficient memory, 3 draining, 1 stale",
			RetryAfter: 12 * time.Second, Hosts: map[string]int{"total": 12, "insufficient_memory": 8, "draining": 3, "stale": 1},
		}},
		{"retry after from the header", 503, map[string]string{"Retry-After": "4"}, errBody(berth.ENoHealthyAgents, 0),
			&berth.Error{Code: berth.ENoHealthyAgents, Message: "no_healthy_agents (test)", RetryAfter: 4 * time.Second}},
		{"not found", 404, nil, errBody(berth.ESandboxNotFound, 0),
			&berth.Error{Code: berth.ESandboxNotFound, Message: "sandbox_not_found (test)"}},
		{"proxy 502 page", 502, map[string]string{"Retry-After": "3"}, "<html>\n<h1>502   Bad Gateway</h1></html>",
			&berth.Error{Code: berth.EUnavailable, Message: "HTTP 502 Bad Gateway: <html> <h1>502 Bad Gateway</h1></html>", RetryAfter: 3 * time.Second}},
		{"empty 504", 504, nil, "", &berth.Error{Code: berth.EUnavailable, Message: "HTTP 504 Gateway Timeout"}},
		{"text 500", 500, nil, "boom\n", &berth.Error{Code: berth.EInternal, Message: "HTTP 500 Internal Server Error: boom"}},
		{"JSON without a code", 404, nil, `{"message":"nope"}`,
			&berth.Error{Code: berth.EInternal, Message: `HTTP 404 Not Found: {"message":"nope"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			if diff := cmp.Diff(tt.want, decodeError(tt.status, h, []byte(tt.body), now)); diff != "" {
				t.Errorf("decodeError (-want +got):\n%s", diff)
			}
		})
	}
}

// A proxy's non-JSON page reaches the caller as a synthesised *berth.Error: unavailable for
// a call sent once that does nothing twice (drain), outcome_unknown, not retryable, for an
// exec, whose command may have run behind the proxy (found by an attack).
func TestProxyPageBecomesAnError(t *testing.T) {
	srv, _ := newScripted(t, reply{status: 502, body: "<html>bad gateway</html>"}, reply{status: 502, body: "<html>bad gateway</html>"})
	c := New(srv.URL, "k")
	err := c.DrainAgent(context.Background(), "a-1", "maintenance")
	var be *berth.Error
	if !errors.As(err, &be) || be.Code != berth.EUnavailable {
		t.Errorf("drain: err = %v, want code unavailable", err)
	}
	_, err = c.Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"true"}})
	if !errors.As(err, &be) || be.Code != berth.EOutcomeUnknown || be.Retryable() || IsUnreachable(err) ||
		!strings.Contains(err.Error(), "bad gateway") {
		t.Errorf("exec: err = %v, want code outcome_unknown, not retryable, naming the proxy's answer", err)
	}
}

func TestUndecodableSuccessIsAnError(t *testing.T) {
	srv, _ := newScripted(t, reply{status: 200, body: "<html>captive portal</html>"})
	if _, err := New(srv.URL, "k").Sandbox(context.Background(), "sb-1"); err == nil {
		t.Errorf("Sandbox decoded an HTML page without error")
	}
}

func TestOptions(t *testing.T) {
	srv, s := newScripted(t, reply{status: 200, body: `{"templates":[]}`})
	c := New(srv.URL, "k", WithUserAgent("ci/1"), WithHTTPClient(nil), WithClock(nil), WithRand(nil),
		WithDeadline(-1), WithBackoff(0, -1))
	if _, err := c.Templates(context.Background()); err != nil {
		t.Fatalf("Templates: %v", err)
	}
	if ua := s.Seen()[0].Header.Get("User-Agent"); ua != "ci/1" {
		t.Errorf("User-Agent %q, want ci/1", ua)
	}
	if c.deadline != DefaultDeadline || c.base != DefaultBackoffBase || c.cap != DefaultBackoffCap ||
		c.http != http.DefaultClient || c.clock == nil || c.rand == nil {
		t.Errorf("defaults not kept: %+v", c)
	}
}

// A success answer larger than maxAnswerBody fails the call (not retried) instead of being
// read into memory whole: a hostile server streaming gigabytes costs at most 128 MiB.
func TestAnswerLargerThanTheCapFails(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		chunk := bytes.Repeat([]byte(" "), 1<<20)
		for range (maxAnswerBody >> 20) + 8 { // bounded: a little past the cap
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	_, err := New(srv.URL, "k", WithDeadline(time.Second)).Sandboxes(context.Background(), "")
	var te *TransportError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "larger than 128 MiB") {
		t.Fatalf("Sandboxes from a server streaming past the cap: %v; want a TransportError naming the cap", err)
	}
}

// TestAgentCountsFromAnOlderServer (found by an attack): a server from before held_count
// ignores ?held=count and sends the held lists without the count, and `berth agents list`
// showed every host holding 0. The client counts the list when no count came. The server
// here answers in that older release's documented shape, on loopback.
func TestAgentCountsFromAnOlderServer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"agents":[{"agent_id":"old-1","status":"active","sandboxes":[{"id":"sb-1"},{"id":"sb-2"},{"id":"sb-3"}],"last_seen_s":1},
			{"agent_id":"old-2","status":"active","sandboxes":[],"last_seen_s":1}]}`)
	}))
	defer srv.Close()
	c := New(srv.URL, "k", WithDeadline(time.Second))
	for name, read := range map[string]func(context.Context) ([]berth.Agent, error){"AgentCounts": c.AgentCounts, "Agents": c.Agents} {
		as, err := read(context.Background())
		if err != nil || len(as) != 2 || as[0].HeldCount != 3 || as[1].HeldCount != 0 {
			t.Errorf("%s from an older server: %+v, %v; want held counts 3 and 0", name, as, err)
		}
	}
}
