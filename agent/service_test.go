package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/process"
)

func TestMain(m *testing.M) {
	process.MaybeRunInit() // this test binary doubles as the sandboxes' init (AGT-3)
	os.Exit(m.Run())
}

const testToken = "node-secret"

// appAgent is an agent on the real process runtime (namespaces when root), serving its
// internal API on a real listener; everything is stopped when the test ends, even on failure.
func appAgent(t *testing.T) (*Agent, string) {
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
	cfg := DefaultConfig()
	cfg.ID = "a1"
	cfg.NodeToken = testToken
	cfg.MemoryMiB = 8192
	cfg.HeadroomMiB = 0
	cfg.Logger = discard
	a, err := New(cfg, ProcessRuntime(rt))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ln.Close() })
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		a.appTransport.CloseIdleConnections()
		srv.Close()
	})
	return a, srv.URL
}

// call sends one internal API request with the node token and returns status and body.
func call(t *testing.T, method, url string, body []byte, header http.Header) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if req.Header.Get(berth.HeaderNodeToken) == "" {
		req.Header.Set(berth.HeaderNodeToken, testToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, b
}

func errorOf(t *testing.T, body []byte) berth.ErrorDetail {
	t.Helper()
	var e berth.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e.Error
}

func postService(t *testing.T, base, id string, req berth.ServiceRequest) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(req)
	return call(t, http.MethodPost, base+"/internal/sandboxes/"+id+"/service", b, nil)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// echoApp is an HTTP/1.1 (keep-alive) app that answers every request with what it saw.
const echoApp = `import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": self.rfile.read(n).decode(), "greeting": os.environ.get("GREETING", "")}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = answer
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

type echoed struct {
	Method   string            `json:"method"`
	Path     string            `json:"path"`
	Headers  map[string]string `json:"headers"`
	Body     string            `json:"body"`
	Greeting string            `json:"greeting"`
}

// TestAPP1_AgentProxiesToService: a real HTTP app started through the agent's service
// endpoint answers through the agent's port endpoint: method, raw path, query, body and
// headers arrive; the node token does not; X-Forwarded-* carry the caller's values.
func TestAPP1_AgentProxiesToService(t *testing.T) {
	a, base := appAgent(t)
	if err := create(a, "app1", 256); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	svc := berth.ServiceRequest{Cmd: []string{"python3", "-c", echoApp, strconv.Itoa(port)}, Env: map[string]string{"GREETING": "hi"}}
	if code, body := postService(t, base, "app1", svc); code != http.StatusNoContent {
		t.Fatalf("POST service = %d %s, want 204", code, body)
	}
	if code, body := postService(t, base, "app1", svc); code != http.StatusConflict || errorOf(t, body).Code != berth.EServiceRunning {
		t.Fatalf("second POST service = %d %s, want 409 %s", code, body, berth.EServiceRunning)
	}
	code, body := call(t, http.MethodGet, base+"/internal/sandboxes/app1/service", nil, nil)
	var st berth.ServiceStatus
	if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil || !st.Started || st.Exited {
		t.Fatalf("GET service = %d %s, want 200 started and running", code, body)
	}

	appURL := fmt.Sprintf("%s/internal/sandboxes/app1/port/%d", base, port)
	// Wait (bounded) until the app listens; until then the agent answers 502 app_unreachable.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := call(t, http.MethodGet, appURL+"/", nil, nil)
		if code == http.StatusCreated {
			break
		}
		if code != http.StatusBadGateway || errorOf(t, body).Code != berth.EUpstream || time.Now().After(deadline) {
			t.Fatalf("GET app while it starts = %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	h := http.Header{}
	h.Set("X-Forwarded-For", "203.0.113.7")
	h.Set("X-Forwarded-Host", "app.example")
	h.Set("X-Forwarded-Proto", "https")
	h.Set("X-Custom", "kept")
	code, body = call(t, http.MethodPost, appURL+"/echo/a%2Fb//c?x=1&y=%20", []byte("ping"), h)
	if code != http.StatusCreated {
		t.Fatalf("POST app = %d %s, want the app's 201", code, body)
	}
	var got echoed
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("app answer %q: %v", body, err)
	}
	if tok, ok := got.Headers[strings.ToLower(berth.HeaderNodeToken)]; ok {
		t.Errorf("the app received the node token %q", tok)
	}
	want := echoed{Method: "POST", Path: "/echo/a%2Fb//c?x=1&y=%20", Body: "ping", Greeting: "hi", Headers: map[string]string{
		"host":              net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		"x-forwarded-for":   "203.0.113.7, 127.0.0.1",
		"x-forwarded-host":  "app.example",
		"x-forwarded-proto": "https",
		"x-custom":          "kept",
	}}
	for k := range got.Headers {
		if _, ok := want.Headers[k]; !ok {
			delete(got.Headers, k) // transport headers (content-length, user-agent, …)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("what the app saw (-want +got):\n%s", diff)
	}

	// A body larger than any buffer on the way makes it there and back.
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	code, body = call(t, http.MethodPut, appURL+"/big", []byte(big), nil)
	if err := json.Unmarshal(body, &got); code != http.StatusCreated || err != nil || got.Body != big {
		t.Fatalf("PUT 1 MiB = %d (%d bytes back), want the app's echo", code, len(got.Body))
	}

	// Without a port path, the app is asked for "/".
	code, body = call(t, http.MethodGet, appURL, nil, nil)
	if err := json.Unmarshal(body, &got); code != http.StatusCreated || err != nil || got.Path != "/" {
		t.Fatalf("GET app root = %d %s, want the app's answer for /", code, body)
	}
}

// TestAPP1_AgentServiceExited: a service that exits at once is reported through the status
// endpoint with its exit code and output, and the port endpoint answers 502 service_exited.
func TestAPP1_AgentServiceExited(t *testing.T) {
	a, base := appAgent(t)
	if err := create(a, "app2", 256); err != nil {
		t.Fatal(err)
	}
	if code, body := postService(t, base, "app2", berth.ServiceRequest{Cmd: []string{"sh", "-c", "echo boom >&2; exit 3"}}); code != http.StatusNoContent {
		t.Fatalf("POST service = %d %s, want 204", code, body)
	}
	deadline := time.Now().Add(30 * time.Second)
	var st berth.ServiceStatus
	for {
		code, body := call(t, http.MethodGet, base+"/internal/sandboxes/app2/service", nil, nil)
		st = berth.ServiceStatus{}
		if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil {
			t.Fatalf("GET service = %d %s", code, body)
		}
		if st.Exited || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if diff := cmp.Diff(berth.ServiceStatus{Started: true, Exited: true, ExitCode: 3, Output: "boom\n"}, st); diff != "" {
		t.Fatalf("status (-want +got):\n%s", diff)
	}
	code, body := call(t, http.MethodGet, fmt.Sprintf("%s/internal/sandboxes/app2/port/%d/", base, freePort(t)), nil, nil)
	if e := errorOf(t, body); code != http.StatusBadGateway || e.Code != berth.EServiceExited || !strings.Contains(e.Message, "boom") {
		t.Fatalf("GET app = %d %s, want 502 %s with the output", code, body, berth.EServiceExited)
	}

	// A running service with nothing on the port: app_unreachable.
	if code, body := postService(t, base, "app2", berth.ServiceRequest{Cmd: []string{"sleep", "1000"}}); code != http.StatusNoContent {
		t.Fatalf("POST service again = %d %s, want 204", code, body)
	}
	code, body = call(t, http.MethodGet, fmt.Sprintf("%s/internal/sandboxes/app2/port/%d/x", base, freePort(t)), nil, nil)
	if code != http.StatusBadGateway || errorOf(t, body).Code != berth.EUpstream {
		t.Fatalf("GET app with nothing listening = %d %s, want 502 %s", code, body, berth.EUpstream)
	}
}

// TestAPP1_AgentAppDiesMidRequest: an app that dies after the connection was made (no
// answer at all) is a 502 with service_exited or, if its exit is not recorded yet,
// app_unreachable; never a 500.
func TestAPP1_AgentAppDiesMidRequest(t *testing.T) {
	a, base := appAgent(t)
	if err := create(a, "app3", 256); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	script := `import socket, sys, os
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
c, _ = s.accept(); c.recv(1); os._exit(7)`
	if code, body := postService(t, base, "app3", berth.ServiceRequest{Cmd: []string{"python3", "-c", script, strconv.Itoa(port)}}); code != http.StatusNoContent {
		t.Fatalf("POST service = %d %s, want 204", code, body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := call(t, http.MethodGet, fmt.Sprintf("%s/internal/sandboxes/app3/port/%d/", base, port), nil, nil)
		e := errorOf(t, body)
		if code != http.StatusBadGateway {
			t.Fatalf("GET app = %d %s, want 502", code, body)
		}
		if e.Code == berth.EServiceExited {
			if !strings.Contains(e.Message, "code 7") {
				t.Fatalf("service_exited message %q lacks the exit code", e.Message)
			}
			return
		}
		if e.Code != berth.EUpstream || time.Now().After(deadline) {
			t.Fatalf("GET app = %d %s, want 502 app_unreachable until the exit shows, then service_exited", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAPP1_AgentServiceRefusals: bad input and unknown sandboxes are refused with their
// codes before anything reaches a runtime; a runtime without Services answers 501.
func TestAPP1_AgentServiceRefusals(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionNone, 8192, &fakeRuntime{}) // no Services
	a.cfg.NodeToken = testToken
	if err := create(a, "s1", 256); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	svcURL := srv.URL + "/internal/sandboxes/s1/service"
	cmd := []byte(`{"cmd":["true"]}`)
	cases := []struct {
		name, method, url string
		body              []byte
		header            http.Header
		wantStatus        int
		wantCode          string
	}{
		{"port 0", "GET", srv.URL + "/internal/sandboxes/s1/port/0/", nil, nil, 400, berth.EInvalidRequest},
		{"port 65536", "GET", srv.URL + "/internal/sandboxes/s1/port/65536/", nil, nil, 400, berth.EInvalidRequest},
		{"port not a number", "POST", srv.URL + "/internal/sandboxes/s1/port/http/x", nil, nil, 400, berth.EInvalidRequest},
		{"empty cmd", "POST", svcURL, []byte(`{"cmd":[]}`), nil, 400, berth.EInvalidRequest},
		{"unknown field", "POST", svcURL, []byte(`{"command":["true"]}`), nil, 400, berth.EInvalidRequest},
		{"serve unknown sandbox", "POST", srv.URL + "/internal/sandboxes/nope/service", cmd, nil, 404, berth.ESandboxNotFound},
		{"status unknown sandbox", "GET", srv.URL + "/internal/sandboxes/nope/service", nil, nil, 404, berth.ESandboxNotFound},
		{"proxy unknown sandbox", "GET", srv.URL + "/internal/sandboxes/nope/port/80/", nil, nil, 404, berth.ESandboxNotFound},
		{"proxy without token", "GET", srv.URL + "/internal/sandboxes/s1/port/80/", nil, http.Header{berth.HeaderNodeToken: {"wrong"}}, 401, berth.EUnauthorized},
		{"serve unsupported", "POST", svcURL, cmd, nil, 501, berth.EUnsupported},
		{"status unsupported", "GET", svcURL, nil, nil, 501, berth.EUnsupported},
		{"proxy unsupported", "GET", srv.URL + "/internal/sandboxes/s1/port/80/", nil, nil, 501, berth.EUnsupported},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := call(t, tc.method, tc.url, tc.body, tc.header)
			if got := errorOf(t, body).Code; code != tc.wantStatus || got != tc.wantCode {
				t.Fatalf("%s %s = %d %s, want %d %s", tc.method, tc.url, code, body, tc.wantStatus, tc.wantCode)
			}
		})
	}
}

func TestAppRoute(t *testing.T) {
	cases := []struct {
		path           string
		id, port, rest string
		ok             bool
	}{
		{"/internal/sandboxes/s1/port/80", "s1", "80", "/", true},
		{"/internal/sandboxes/s1/port/80/", "s1", "80", "/", true},
		{"/internal/sandboxes/s%2F1/port/80/a/../b//c%2Fd", "s/1", "80", "/a/../b//c%2Fd", true},
		{"/internal/sandboxes/s1/exec", "", "", "", false},
		{"/internal/sandboxes/s1/port", "", "", "", false},
		{"/internal/sandboxes//port/80/", "", "", "", false},
		{"/v1/sandboxes/s1/port/80/", "", "", "", false},
	}
	for _, tc := range cases {
		id, port, rest, ok := appRoute(tc.path)
		if id != tc.id || port != tc.port || rest != tc.rest || ok != tc.ok {
			t.Errorf("appRoute(%q) = %q %q %q %t, want %q %q %q %t", tc.path, id, port, rest, ok, tc.id, tc.port, tc.rest, tc.ok)
		}
	}
}

// appHost must round-trip any id through the transport's dial address.
func TestAppHostRoundTrip(t *testing.T) {
	var gotID string
	var gotPort int
	rt := &servicesRuntime{dial: func(id string, port int) (net.Conn, error) {
		gotID, gotPort = id, port
		return nil, berth.Errorf(berth.EUpstream, "test")
	}}
	a := newTestAgent(t, berth.AdmissionNone, 1024, &rt.fakeRuntime)
	a.rt = rt
	_, err := a.appTransport.DialContext(context.Background(), "tcp", appHost("s:1/é", 8080))
	if berth.ErrorCode(err) != berth.EUpstream || gotID != "s:1/é" || gotPort != 8080 {
		t.Fatalf("dial = %v with id %q port %d", err, gotID, gotPort)
	}
}

// servicesRuntime is a fakeRuntime with Services whose Dial is a function field.
type servicesRuntime struct {
	fakeRuntime
	dial func(id string, port int) (net.Conn, error)
}

func (s *servicesRuntime) Serve(context.Context, string, berth.ServiceRequest) error { return nil }
func (s *servicesRuntime) ServiceStatus(context.Context, string) (berth.ServiceStatus, error) {
	return berth.ServiceStatus{}, nil
}
func (s *servicesRuntime) Dial(_ context.Context, id string, port int) (net.Conn, error) {
	return s.dial(id, port)
}
