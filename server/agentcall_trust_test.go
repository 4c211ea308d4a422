package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// recordingAgent is a plaintext listener that records the headers of every request and
// answers as an agent that accepted it.
type recordingAgent struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []http.Header
}

func newRecordingAgent(t *testing.T) *recordingAgent {
	a := &recordingAgent{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.got = append(a.got, r.Header.Clone())
		a.mu.Unlock()
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *recordingAgent) requests() []http.Header {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]http.Header(nil), a.got...)
}

// TestTRUST_TLSReplicaNeverCallsAnAgentInClear (issue 15, point 2): a replica that calls
// agents over TLS only does not send a create or a drain to an agent whose stored address is
// http:// — a row written before the replica served TLS, or by a replica without TLS — even
// though no heartbeat passed its check; the create is refused, not sent in clear.
func TestTRUST_TLSReplicaNeverCallsAnAgentInClear(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) { c.RequireAgentTLS = true })
	plain := newRecordingAgent(t)
	h.heartbeat(t, "old-agent", plain.srv.URL, 1<<20)
	if code, _, e := h.create(t); code != http.StatusServiceUnavailable {
		t.Errorf("create onto an http:// agent: %d %+v, want 503", code, e)
	}
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/agents/old-agent/drain", strings.NewReader(`{"reason":"test"}`))
	req.Header.Set("Authorization", "Bearer "+h.key)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	if got := plain.requests(); len(got) != 0 {
		t.Fatalf("the TLS-only replica sent %d request(s) in clear to the http:// agent, the first with %v", len(got), got[0])
	}
}

// TestTRUST_AnnouncedAddressLearnsNoNodeToken (issue 15): whoever makes a replica call an
// address of their choosing (an agent credential can announce any address) receives a call
// token good for that address only: never the node token.
func TestTRUST_AnnouncedAddressLearnsNoNodeToken(t *testing.T) {
	h := newHarness(t, 0)
	evil := newRecordingAgent(t)
	h.heartbeat(t, "a1", evil.srv.URL, 1<<20)
	if code, _, e := h.create(t); code != http.StatusCreated {
		t.Fatalf("create: %d %+v", code, e)
	}
	got := evil.requests()
	if len(got) == 0 {
		t.Fatal("the replica never called the announced address")
	}
	for _, hd := range got {
		for k, vs := range hd {
			for _, v := range vs {
				if strings.Contains(v, "node-token") {
					t.Errorf("header %s carries the node token: %q", k, v)
				}
			}
		}
		if tok := hd.Get(berth.HeaderAgentCall); tok != berth.AgentCallToken("node-token", "a1", evil.srv.URL) {
			t.Errorf("call token %q, want the one for %s only", tok, evil.srv.URL)
		}
	}
}

// TestTRUST_AgentRefusingTheReplicaIsNotTheCallers401 (issue 15): an agent that refuses the
// replica's call token (a node token that differs, an address it does not own) answers 401;
// the tenant gets 503 unavailable, never a 401 an SDK would read as its own key being wrong.
func TestTRUST_AgentRefusingTheReplicaIsNotTheCallers401(t *testing.T) {
	h := newHarness(t, 0)
	refusing := answeringAgent(t, http.StatusUnauthorized, `{"error":{"code":"unauthorized","message":"missing or wrong agent-call token"}}`)
	h.heartbeat(t, "a1", refusing.URL, 1<<20)
	code, sb, e := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %+v", code, e)
	}
	resp, body := h.exec(t, sb.ID, `{"cmd":["true"]}`)
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(string(body), "agent-call token") || strings.Contains(string(body), `"unauthorized"`) {
		t.Fatalf("exec on a host that refuses the replica: %d %s; want 503, not the agent's own answer", resp.StatusCode, body)
	}
}

// TestStopRoundsAreBounded (AGT-6, issue 16 goal 2): a replica that meets many agents at once,
// each listing sandboxes the store never knew, runs at most maxStopRounds stop rounds at
// once; the rest wait their turn (agentCalls), not on the store's connections.
func TestStopRoundsAreBounded(t *testing.T) {
	h := newHarness(t, 0)
	var inFlight, most atomic.Int64
	release := make(chan struct{})
	agentSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			inFlight.Add(-1)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(agentSrv.Close)
	t.Cleanup(func() { close(release) })
	const agents = 3 * maxStopRounds
	for i := range agents {
		id := fmt.Sprintf("a%d", i)
		c := client.New(h.srv.URL, joinAs(t, h.srv.URL, id))
		err := c.Heartbeat(context.Background(), berth.Heartbeat{AgentID: id, Address: agentSrv.URL, Status: berth.AgentActive,
			BootID: "boot", Seq: 1, MemoryAdmission: berth.AdmissionWorkingSet, MemoryMiBTotal: 1024, MemoryMiBAdmittable: 512,
			Sandboxes: []berth.HeldSandbox{{ID: "sb-unknown-" + id, Measured: true}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for inFlight.Load() < maxStopRounds && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // real: the rounds run in the replica's goroutines
	}
	if got := most.Load(); got != maxStopRounds {
		t.Fatalf("%d stop rounds ran at once for %d agents, want exactly %d", got, agents, maxStopRounds)
	}
}

// TestFiles_SandboxPermissionIsTheCallers403 (found by a new user on gVisor): a file call the
// sandbox's own permissions refuse — the agent answers 403 forbidden "/etc/passwd: permission
// denied" — was turned into a retryable 503 blaming the node token, and the CLI retried it
// for 90 s. It is the caller's 403 with the sandbox's message, not retryable; an agent that
// refuses the replica (401) is still a 503.
func TestFiles_SandboxPermissionIsTheCallers403(t *testing.T) {
	h := newHarness(t, 0)
	agent := answeringAgent(t, http.StatusForbidden, `{"error":{"code":"forbidden","message":"/etc/passwd: permission denied"}}`)
	h.heartbeat(t, "a1", agent.URL, 1<<20)
	code, sb, e := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %+v", code, e)
	}
	for _, method := range []string{http.MethodPut, http.MethodGet} {
		code, body := call(t, h.srv.URL, method, "/v1/sandboxes/"+sb.ID+"/files?path=/etc/passwd", h.key, strings.NewReader("x"))
		if code != http.StatusForbidden || !strings.Contains(body, "permission denied") || strings.Contains(body, `"retryable":true`) {
			t.Errorf("%s files on a path the sandbox refuses: %d %s; want 403 forbidden with the sandbox's message, not retryable", method, code, body)
		}
	}
}

// answeringAgent is a fake agent that takes every create and answers every other call with
// status and the API-2 error body given.
func answeringAgent(t *testing.T, status int, body string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/internal/sandboxes" {
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// sandboxOnStandIn starts a stand-in agent, a1, that accepts creates and answers the requests
// whose path ends with suffix with handle (others 404), and creates a sandbox on it through
// h: the replica's calls for that sandbox reach handle.
func sandboxOnStandIn(t *testing.T, h *harness, suffix string, handle http.HandlerFunc) (*httptest.Server, berth.Sandbox) {
	t.Helper()
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/internal/sandboxes":
			w.WriteHeader(http.StatusCreated)
		case strings.HasSuffix(r.URL.Path, suffix):
			handle(w, r)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(agent.Close)
	h.heartbeat(t, "a1", agent.URL, 1<<20)
	code, sb, e := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %+v", code, e)
	}
	return agent, sb
}

// TestFiles_CutUploadIsTheCallers400 (found by an attack): an upload the client cuts short
// (Content-Length 1000, 10 bytes sent, then its side closed) was 503 "agent unreachable",
// logged as the agent's failure and retried by SDKs. It is 400 invalid_request; the agent,
// which reads the body as the real one does, is never told to write the file.
func TestFiles_CutUploadIsTheCallers400(t *testing.T) {
	h := newHarness(t, 0)
	var written atomic.Int64
	_, sb := sandboxOnStandIn(t, h, "/files", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return // a body cut short: nothing is written
		}
		written.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	u, _ := url.Parse(h.srv.URL)
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	must(t, err)
	defer conn.Close()
	must(t, conn.SetDeadline(time.Now().Add(15*time.Second)))
	_, err = fmt.Fprintf(conn, "PUT /v1/sandboxes/%s/files?path=/tmp/cut.txt HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
		"Content-Length: 1000\r\n\r\n0123456789", sb.ID, h.key)
	must(t, err)
	must(t, conn.(*net.TCPConn).CloseWrite())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	must(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), berth.EInvalidRequest) || written.Load() != 0 {
		t.Fatalf("an upload cut short: %d %s (files written %d); want 400 invalid_request, nothing written", resp.StatusCode, body, written.Load())
	}
}
