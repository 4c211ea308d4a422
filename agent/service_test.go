package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/berth-dev/berth"
)

const testToken = "node-secret"

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

// TestAgentCallTokenIsPerAddress (issue 15, AGT-5): the servers' call token for this agent's
// own address is accepted; the token for another address (what a replica sends to an
// address someone else announced), a wrong one or none are 401; the node token itself is
// still accepted from servers of the previous release.
func TestAgentCallTokenIsPerAddress(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionNone, 8192, &fakeRuntime{})
	a.cfg.NodeToken = testToken
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name   string
		header http.Header
		ok     bool
	}{
		{"call token for this id and address", http.Header{berth.HeaderAgentCall: {berth.AgentCallToken(testToken, a.cfg.ID, a.addr)}, berth.HeaderNodeToken: {"-"}}, true},
		{"call token for another id at this address (an agent that announced this one's address)", http.Header{berth.HeaderAgentCall: {berth.AgentCallToken(testToken, "other-agent", a.addr)}, berth.HeaderNodeToken: {"-"}}, false},
		{"node token (older servers)", http.Header{berth.HeaderNodeToken: {testToken}}, true},
		{"call token for another address", http.Header{berth.HeaderAgentCall: {berth.AgentCallToken(testToken, a.cfg.ID, "https://evil.example:443")}, berth.HeaderNodeToken: {"-"}}, false},
		{"call token keyed by another node token", http.Header{berth.HeaderAgentCall: {berth.AgentCallToken("other", a.cfg.ID, a.addr)}, berth.HeaderNodeToken: {"-"}}, false},
		{"no token", http.Header{berth.HeaderNodeToken: {"-"}}, false},
	} {
		code, _ := call(t, http.MethodGet, srv.URL+"/internal/heartbeat", nil, tc.header)
		if (code != http.StatusUnauthorized) != tc.ok {
			t.Errorf("%s: %d, want accepted %v", tc.name, code, tc.ok)
		}
	}
}
