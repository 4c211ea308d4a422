package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/berth-dev/berth/internal/logtest"
	"github.com/jackc/pgx/v5/pgconn"
)

// errorsHarness is a server on a real SQLite store, behind real HTTP on 127.0.0.1:0, whose
// logs (JSON lines) the test reads.
func errorsHarness(t *testing.T, wrap func(berth.Store) berth.Store) (*harness, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	h := newHarnessWith(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	if wrap != nil {
		h.s.store = wrap(h.s.store)
	}
	return h, logs
}

// answer is one HTTP answer as a client sees it.
type answer struct {
	status     int
	retryAfter string
	headerID   string
	raw        string
	body       berth.ErrorBody
}

func (h *harness) ask(t *testing.T, method, path string) answer {
	t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	a := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
		headerID: resp.Header.Get(berth.HeaderRequestID), raw: string(b)}
	_ = json.Unmarshal(b, &a.body)
	return a
}

// linesWith returns the log lines (decoded) that name request id.
func linesWith(t *testing.T, logs *logtest.Buffer, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["request_id"] == id {
			out = append(out, m)
		}
	}
	return out
}

// TestHonestErrors_ClosedStoreIsInternal (issue 15): with the store closed under a running
// server, a request answers 500 internal, not retryable, whose body says "internal error"
// with the request id and holds none of the driver's text; the server logs it once, at
// error level, with the request id, method, route and the cause. /readyz answers 503.
// (Before: 503 unavailable, retryable, "sqlite: …: sql: database is closed" in the body and
// nothing in the log.)
func TestHonestErrors_ClosedStoreIsInternal(t *testing.T) {
	h, logs := errorsHarness(t, nil)
	if a := h.ask(t, http.MethodGet, "/v1/sandboxes"); a.status != http.StatusOK {
		t.Fatalf("before the close: %d %s", a.status, a.raw)
	}
	if a := h.ask(t, http.MethodGet, "/readyz"); a.status != http.StatusOK {
		t.Fatalf("readyz before the close: %d %s", a.status, a.raw)
	}
	must(t, h.st.Close())

	a := h.ask(t, http.MethodGet, "/v1/sandboxes")
	d := a.body.Error
	if a.status != http.StatusInternalServerError || d.Code != berth.EInternal || d.Retryable || a.retryAfter != "" {
		t.Fatalf("closed store: status %d code %q retryable %v Retry-After %q; want 500 internal, not retryable\n%s",
			a.status, d.Code, d.Retryable, a.retryAfter, a.raw)
	}
	if d.Message != "internal error" || d.RequestID == "" || d.RequestID != a.headerID {
		t.Errorf("body %s: want message %q and the request id of header %q", a.raw, "internal error", a.headerID)
	}
	for _, leak := range []string{"sqlite", "sql:", "closed", "list sandboxes"} {
		if strings.Contains(a.raw, leak) {
			t.Errorf("body holds %q: %s", leak, a.raw)
		}
	}
	lines := linesWith(t, logs, d.RequestID)
	if len(lines) != 1 {
		t.Fatalf("log lines with request id %s: %d, want 1\n%s", d.RequestID, len(lines), logs.String())
	}
	l := lines[0]
	if l["level"] != "ERROR" || l["method"] != "GET" || l["route"] != "GET /v1/sandboxes" ||
		!strings.Contains(fmt.Sprint(l["err"]), "database is closed") {
		t.Errorf("log line %v: want level ERROR, method GET, route GET /v1/sandboxes, the cause", l)
	}

	r := h.ask(t, http.MethodGet, "/readyz")
	if r.status != http.StatusServiceUnavailable || r.body.Error.Code != berth.EUnavailable {
		t.Errorf("readyz after the close: %d %s, want 503 unavailable", r.status, r.raw)
	}
	if strings.Contains(r.raw, "closed") || len(linesWith(t, logs, r.body.Error.RequestID)) != 1 {
		t.Errorf("readyz: body %s; want no cause in it and one log line\n%s", r.raw, logs.String())
	}
}

// faultySandboxes fails every Sandboxes call with err.
type faultySandboxes struct {
	berth.Store
	err error
}

func (f faultySandboxes) Sandboxes(context.Context, berth.SandboxFilter) ([]berth.Sandbox, error) {
	return nil, f.err
}

// TestHonestErrors_TransientStoreFaultIsUnavailable (issue 15): a store failing with a
// transient fault (connection refused, a PostgreSQL serialization failure, a pgx error safe to
// retry, a deadline) answers 503 unavailable, retryable with Retry-After, without the
// driver's text, and is logged once at warn level with the request id. Anything else
// unexpected (a scan error) is 500 internal.
func TestHonestErrors_TransientStoreFaultIsUnavailable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5432},
		Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		name  string
		err   error
		code  string
		level string
	}{
		{"connection refused", fmt.Errorf("postgres: sandboxes: %w", refused), berth.EUnavailable, "WARN"},
		{"serialization failure", fmt.Errorf("postgres: sandboxes: %w", &pgconn.PgError{Code: "40001", Message: "could not serialize access"}), berth.EUnavailable, "WARN"},
		{"deadline", fmt.Errorf("postgres: sandboxes: %w", context.DeadlineExceeded), berth.EUnavailable, "WARN"},
		{"scan error", fmt.Errorf("sqlite: sandboxes: %w", fmt.Errorf("sql: Scan error on column index 3: converting NULL to int64 is unsupported")), berth.EInternal, "ERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := errorsHarness(t, func(st berth.Store) berth.Store { return faultySandboxes{st, tc.err} })
			a := h.ask(t, http.MethodGet, "/v1/sandboxes")
			d := a.body.Error
			wantStatus, wantRetry := http.StatusServiceUnavailable, true
			if tc.code == berth.EInternal {
				wantStatus, wantRetry = http.StatusInternalServerError, false
			}
			if a.status != wantStatus || d.Code != tc.code || d.Retryable != wantRetry || (a.retryAfter != "") != wantRetry {
				t.Fatalf("status %d code %q retryable %v Retry-After %q; want %d %s retryable %v\n%s",
					a.status, d.Code, d.Retryable, a.retryAfter, wantStatus, tc.code, wantRetry, a.raw)
			}
			for _, leak := range []string{"refused", "serialize", "deadline", "Scan", "postgres", "sqlite"} {
				if strings.Contains(a.raw, leak) {
					t.Errorf("body holds %q: %s", leak, a.raw)
				}
			}
			lines := linesWith(t, logs, d.RequestID)
			if len(lines) != 1 || lines[0]["level"] != tc.level {
				t.Fatalf("log lines with request id %q: %v, want one at %s\n%s", d.RequestID, lines, tc.level, logs.String())
			}
		})
	}
}

// TestHonestErrors_ProxiedAgentErrorKeepsRequestID (issue 15): an error an agent answers to
// a request the server proxies (an app whose port stops answering) carries the request id
// of the client's request, in the body and the header. The agent here is the real
// composition of the agent's error path (httpjson.EchoRequestID around httpjson.WriteError
// with no id of its own), in front of the fake agent. (Before: an empty request_id.)
func TestHonestErrors_ProxiedAgentErrorKeepsRequestID(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.AppReconcileInterval, c.AppBackoffBase, c.AppBackoffCap = 5*time.Millisecond, time.Millisecond, 10*time.Millisecond
	})
	fake := newFakeAgent(t, "")
	target, err := url.Parse(fake.srv.URL)
	must(t, err)
	var down atomic.Bool
	pass := httputil.NewSingleHostReverseProxy(target)
	agentSrv := httptest.NewServer(httpjson.EchoRequestID(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() && strings.Contains(r.URL.Path, "/port/") {
			httpjson.WriteError(w, "", berth.Errorf(berth.EUpstream, "nothing answers on port 8080"))
			return
		}
		pass.ServeHTTP(w, r)
	})))
	t.Cleanup(agentSrv.Close)
	h.heartbeat(t, "a1", agentSrv.URL, 4096)
	h.running(t)
	h.createApp(t, "web", `["sleep","1000"]`)
	waitUntil(t, "the app serving", func() (bool, string) {
		a := h.app(t, "web")
		return a.SandboxID != "" && a.State == berth.AppRunning, string(a.State)
	})
	down.Store(true)
	a := h.ask(t, http.MethodGet, "/apps/web/")
	if a.status != http.StatusBadGateway || a.body.Error.Code != berth.EUpstream {
		t.Fatalf("app down: %d %s, want 502 %s", a.status, a.raw, berth.EUpstream)
	}
	if a.body.Error.RequestID == "" || a.body.Error.RequestID != a.headerID {
		t.Errorf("proxied error: body request_id %q, header %q; want the same, non-empty", a.body.Error.RequestID, a.headerID)
	}
}
