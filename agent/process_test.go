package agent_test

import (
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
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/process"
)

// These tests drive the agent over the real process runtime, which imports package agent
// (the drivers depend on the agent's Runtime, never the reverse), so they live outside it;
// export_test.go lends them the few helpers they share with the tests inside.

func TestMain(m *testing.M) {
	process.MaybeRunInit() // this test binary doubles as the sandboxes' init (AGT-3)
	os.Exit(m.Run())
}

// appAgent is an agent on the real process runtime (namespaces when root), serving its
// internal API on a real listener; everything is stopped when the test ends, even on failure.
func appAgent(t *testing.T) (*agent.Agent, string) {
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
	cfg := agent.DefaultConfig()
	cfg.ID = "a1"
	cfg.NodeToken = agent.TestToken
	cfg.MemoryMiB = 8192
	cfg.HeadroomMiB = 0
	cfg.Logger = discard
	a, err := agent.New(cfg, process.AgentRuntime(rt))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.CloseListener(a) })
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		agent.CloseAppConns(a)
		srv.Close()
	})
	return a, srv.URL
}

func postService(t *testing.T, base, id string, req berth.ServiceRequest) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(req)
	return agent.Call(t, http.MethodPost, base+"/internal/sandboxes/"+id+"/service", b, nil)
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
	if code, body := postService(t, base, "app1", svc); code != http.StatusConflict || agent.ErrorOf(t, body).Code != berth.EServiceRunning {
		t.Fatalf("second POST service = %d %s, want 409 %s", code, body, berth.EServiceRunning)
	}
	code, body := agent.Call(t, http.MethodGet, base+"/internal/sandboxes/app1/service", nil, nil)
	var st berth.ServiceStatus
	if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil || !st.Started || st.Exited {
		t.Fatalf("GET service = %d %s, want 200 started and running", code, body)
	}

	appURL := fmt.Sprintf("%s/internal/sandboxes/app1/port/%d", base, port)
	// Wait (bounded) until the app listens; until then the agent answers 502 app_unreachable.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := agent.Call(t, http.MethodGet, appURL+"/", nil, nil)
		if code == http.StatusCreated {
			break
		}
		if code != http.StatusBadGateway || agent.ErrorOf(t, body).Code != berth.EUpstream || time.Now().After(deadline) {
			t.Fatalf("GET app while it starts = %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond) // real: an app process starting behind the agent
	}

	h := http.Header{}
	h.Set("X-Forwarded-For", "203.0.113.7")
	h.Set("X-Forwarded-Host", "app.example")
	h.Set("X-Forwarded-Proto", "https")
	h.Set("X-Custom", "kept")
	code, body = agent.Call(t, http.MethodPost, appURL+"/echo/a%2Fb//c?x=1&y=%20", []byte("ping"), h)
	if code != http.StatusCreated {
		t.Fatalf("POST app = %d %s, want the app's 201", code, body)
	}
	var got echoed
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("app answer %q: %v", body, err)
	}
	for _, h := range []string{berth.HeaderNodeToken, berth.HeaderAgentCall} {
		if tok, ok := got.Headers[strings.ToLower(h)]; ok {
			t.Errorf("the app received the server's %s %q", h, tok)
		}
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
	code, body = agent.Call(t, http.MethodPut, appURL+"/big", []byte(big), nil)
	if err := json.Unmarshal(body, &got); code != http.StatusCreated || err != nil || got.Body != big {
		t.Fatalf("PUT 1 MiB = %d (%d bytes back), want the app's echo", code, len(got.Body))
	}

	// Without a port path, the app is asked for "/".
	code, body = agent.Call(t, http.MethodGet, appURL, nil, nil)
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
		code, body := agent.Call(t, http.MethodGet, base+"/internal/sandboxes/app2/service", nil, nil)
		st = berth.ServiceStatus{}
		if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil {
			t.Fatalf("GET service = %d %s", code, body)
		}
		if st.Exited || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // real: an app process exiting
	}
	if diff := cmp.Diff(berth.ServiceStatus{Started: true, Exited: true, ExitCode: 3, Output: "boom\n"}, st); diff != "" {
		t.Fatalf("status (-want +got):\n%s", diff)
	}
	code, body := agent.Call(t, http.MethodGet, fmt.Sprintf("%s/internal/sandboxes/app2/port/%d/", base, freePort(t)), nil, nil)
	if e := agent.ErrorOf(t, body); code != http.StatusBadGateway || e.Code != berth.EServiceExited || !strings.Contains(e.Message, "boom") {
		t.Fatalf("GET app = %d %s, want 502 %s with the output", code, body, berth.EServiceExited)
	}

	// A running service with nothing on the port: app_unreachable.
	if code, body := postService(t, base, "app2", berth.ServiceRequest{Cmd: []string{"sleep", "1000"}}); code != http.StatusNoContent {
		t.Fatalf("POST service again = %d %s, want 204", code, body)
	}
	code, body = agent.Call(t, http.MethodGet, fmt.Sprintf("%s/internal/sandboxes/app2/port/%d/x", base, freePort(t)), nil, nil)
	if code != http.StatusBadGateway || agent.ErrorOf(t, body).Code != berth.EUpstream {
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
		code, body := agent.Call(t, http.MethodGet, fmt.Sprintf("%s/internal/sandboxes/app3/port/%d/", base, port), nil, nil)
		e := agent.ErrorOf(t, body)
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
		time.Sleep(50 * time.Millisecond) // real: an app process exiting
	}
}

// create starts sandbox id with mib MiB on a, for an hour.
func create(a *agent.Agent, id string, mib int64) error {
	return a.Create(context.Background(), berth.AgentCreate{ID: id, MemoryMiB: mib, ExpiresAt: time.Now().Add(time.Hour)})
}
