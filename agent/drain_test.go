package agent

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestAGT5_DrainReasonBounded: the agent's own POST /internal/drain?reason= took a reason of
// any length, NUL and invalid UTF-8 included, and sent it on in every heartbeat (and so into
// events), while the server refuses such a reason from an operator. The agent holds it to the
// same bound (berth.CheckReason: at most 512 bytes of UTF-8, no NUL): past it 400
// invalid_request and the agent stays in service; a reason at the bound drains, kept whole.
// Over real HTTP on 127.0.0.1.
func TestAGT5_DrainReasonBounded(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, &fakeRuntime{})
	a.cfg.NodeToken = testToken
	srv := httptest.NewServer(a.Handler()) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	drain := func(reason string) (int, []byte) {
		return call(t, http.MethodPost, srv.URL+"/internal/drain?reason="+url.QueryEscape(reason), nil, nil)
	}
	for _, tc := range []struct{ name, reason string }{
		{"513 bytes", strings.Repeat("x", berth.MaxReasonBytes+1)},
		{"514 bytes of é", strings.Repeat("é", berth.MaxReasonBytes/2+1)},
		{"100,000 bytes", strings.Repeat("x", 100_000)},
		{"NUL", "spot \x00 notice"},
		{"not UTF-8", "spot \xff notice"},
	} {
		code, body := drain(tc.reason)
		if code != http.StatusBadRequest || errorOf(t, body).Code != berth.EInvalidRequest {
			t.Errorf("drain with a reason of %s: %d %s; want 400 invalid_request", tc.name, code, body)
		}
	}
	// A query Go cannot parse (found by the attack on the server's queries) lost its reason
	// and drained without one.
	if code, body := call(t, http.MethodPost, srv.URL+"/internal/drain?reason=spot;notice", nil, nil); code != http.StatusBadRequest || errorOf(t, body).Code != berth.EInvalidRequest {
		t.Errorf("drain with a query that does not parse: %d %s; want 400 invalid_request", code, body)
	}
	// A second reason was dropped: the agent drained with the first (found by an attack).
	for _, q := range []string{"reason=ok&reason=%00", "reason=ok&reason=" + strings.Repeat("x", 600)} {
		if code, body := call(t, http.MethodPost, srv.URL+"/internal/drain?"+q, nil, nil); code != http.StatusBadRequest || errorOf(t, body).Code != berth.EInvalidRequest {
			t.Errorf("drain with two reasons (%.40s…): %d %s; want 400 invalid_request", q, code, body)
		}
	}
	if hb := a.Heartbeat(time.Now()); hb.Status != berth.AgentActive || !hb.IntakeOpen || hb.StatusReason != "" {
		t.Fatalf("after refused drains: %+v; want the agent still in service", hb)
	}
	whole := strings.Repeat("é", berth.MaxReasonBytes/2) // 512 bytes
	if code, body := drain(whole); code != http.StatusAccepted {
		t.Fatalf("drain with a reason at the bound: %d %s; want 202", code, body)
	}
	if hb := a.Heartbeat(time.Now()); hb.Status != berth.AgentDraining || hb.StatusReason != whole {
		t.Errorf("after a drain at the bound: status %s, reason of %d bytes; want draining with the %d bytes sent", hb.Status, len(hb.StatusReason), len(whole))
	}
}
