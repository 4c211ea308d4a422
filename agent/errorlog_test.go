package agent

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/logtest"
)

// TestAgent5xxIsLoggedWithItsRequestID (issue 15: every 5xx is logged): a runtime that
// cannot start a guest makes the agent answer 503 unavailable (the server places elsewhere),
// and the agent's log has the failure under the request id the calling server sent, so an
// operator holding the answer finds the host's side of it. A 4xx is the caller's and is not
// logged as a failure.
func TestAgent5xxIsLoggedWithItsRequestID(t *testing.T) {
	rt := &fakeRuntime{start: func(id string) error { return errors.New("runsc create: bundle is gone") }}
	a := newTestAgent(t, berth.AdmissionCommitted, 8192, rt)
	a.cfg.NodeToken = testToken
	var logs logtest.Buffer
	a.log = slog.New(slog.NewTextHandler(&logs, nil))
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()

	const rid = "req-5xx-7f3a"
	status, body := call(t, "POST", srv.URL+"/internal/sandboxes", []byte(`{"id":"s1","memory_mb":256}`),
		http.Header{berth.HeaderRequestID: {rid}})
	e := errorOf(t, body)
	if status != http.StatusServiceUnavailable || e.Code != berth.EUnavailable || e.RequestID != rid {
		t.Fatalf("create with a failing runtime: %d %+v; want 503 unavailable with request id %s", status, e, rid)
	}
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "request_id="+rid) {
			line = l
		}
	}
	if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "bundle is gone") || !strings.Contains(line, "status=503") {
		t.Errorf("no error log line with the request id and the cause; log:\n%s", logs.String())
	}

	const bad = "req-4xx-9c1d"
	status, _ = call(t, "POST", srv.URL+"/internal/sandboxes", []byte(`{"id":`), http.Header{berth.HeaderRequestID: {bad}})
	if status != http.StatusBadRequest {
		t.Fatalf("malformed create: %d, want 400", status)
	}
	if strings.Contains(logs.String(), "request_id="+bad) {
		t.Errorf("a 400 was logged as a failure:\n%s", logs.String())
	}
}
