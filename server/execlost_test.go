package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berth-dev/berth"
)

// TestExecWhoseAnswerIsLostIsOutcomeUnknown (API-2; found by an attack): an exec that reached
// its host and got no whole answer back may have run, so it is 504 outcome_unknown, not
// retryable and with no Retry-After — never 503 unavailable, which says "nothing happened,
// try again"; so may an answer that is not the agent's (a proxy's page, an error cut short)
// and a 200 that is not an exec result (berth.ParseExecResult), which read as exit code 0.
// An exec that never reached its host (the dial was refused, or the TLS handshake failed)
// ran nothing and stays 503 unavailable, retryable. The replica itself sends each exec once.
func TestExecWhoseAnswerIsLostIsOutcomeUnknown(t *testing.T) {
	for _, c := range []struct {
		name string
		// answer plays the host's side of the exec; nil: the host is gone before it.
		answer     func(w http.ResponseWriter)
		wantStatus int
		wantCode   string
		wantExecs  int64
	}{
		{"the host hangs up mid-answer", func(w http.ResponseWriter) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close() // the command ran; its answer never leaves
			}
		}, http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"the host answers 200 with a body that is not an exec result", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, `{"exit_code":`)
		}, http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		// A 200 whose JSON is not an exec result (berth.ParseExecResult) read as exit code 0.
		{"the host answers 200 null", answer200(`null`), http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"the host answers 200 {}", answer200(`{}`), http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"the host answers 200 []", answer200(`[]`), http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"the host answers 200 with output and no exit_code", answer200(`{"stdout":"hi"}`),
			http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"the host answers 200 with exit_code a string", answer200(`{"exit_code":"0"}`),
			http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"the host answers 200 with exit_code a fraction", answer200(`{"exit_code":1.5}`),
			http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"a proxy before the host answers a 502 page", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>")
		}, http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"the host's error is longer than the replica reads", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":{"code":"conflict","message":"`+strings.Repeat("x", 70<<10)+`"}}`)
		}, http.StatusGatewayTimeout, berth.EOutcomeUnknown, 1},
		{"the host refuses the connection", nil, http.StatusServiceUnavailable, berth.EUnavailable, 0},
		{"the host's TLS certificate is not trusted", nil, http.StatusServiceUnavailable, berth.EUnavailable, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, 0)
			var execs atomic.Int64
			agent, sb := sandboxOnStandIn(t, h, "/exec", func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				execs.Add(1)
				c.answer(w)
			})
			switch {
			case strings.Contains(c.name, "TLS"):
				// The host now answers in TLS with a certificate the replica does not trust:
				// the handshake fails before any of the exec is sent.
				tlsAgent := httptest.NewTLSServer(agent.Config.Handler)
				t.Cleanup(tlsAgent.Close)
				h.heartbeat(t, "a1", tlsAgent.URL, 1<<20)
				must(t, h.s.sched.refresh(context.Background())) // the replica calls the new address
			case c.answer == nil:
				agent.Close() // its address now refuses connections: nothing can reach the host
			}
			resp, body := h.exec(t, sb.ID, `{"cmd":["sh","-c","echo ran >> /tmp/count"]}`)
			var eb berth.ErrorBody
			if err := json.Unmarshal(body, &eb); err != nil {
				t.Fatalf("exec: %d %s: not an error body: %v", resp.StatusCode, body, err)
			}
			if resp.StatusCode != c.wantStatus || eb.Error.Code != c.wantCode {
				t.Fatalf("exec: %d %s; want %d %s", resp.StatusCode, body, c.wantStatus, c.wantCode)
			}
			lost := c.wantCode == berth.EOutcomeUnknown
			if eb.Error.Retryable == lost || (resp.Header.Get("Retry-After") != "") == lost {
				t.Errorf("exec: retryable %v, Retry-After %q; want retryable and a Retry-After only when nothing ran: %s",
					eb.Error.Retryable, resp.Header.Get("Retry-After"), body)
			}
			if lost && !strings.Contains(eb.Error.Message, "may have run") {
				t.Errorf("message %q does not say the command may have run", eb.Error.Message)
			}
			if n := execs.Load(); n != c.wantExecs {
				t.Errorf("the host got %d exec(s), want %d: the replica must not send one again", n, c.wantExecs)
			}
		})
	}
}

// TestExecAnsweredWithAResultSucceeds: what berth.ParseExecResult takes as an exec result
// reaches the caller as the exit code and output it says — an integer exit_code written as a
// float included — so the cases of TestExecWhoseAnswerIsLostIsOutcomeUnknown that are 504
// are so for their bodies alone.
func TestExecAnsweredWithAResultSucceeds(t *testing.T) {
	for body, want := range map[string]berth.ExecResult{
		`{"exit_code":0,"stdout":"hi\n","stderr":""}`: {ExitCode: 0, Stdout: "hi\n"},
		`{"exit_code":3,"stderr":"no"}`:               {ExitCode: 3, Stderr: "no"},
		`{"exit_code":-1,"stdout":null}`:              {ExitCode: -1},
		`{"exit_code":2.0}`:                           {ExitCode: 2},
	} {
		t.Run(body, func(t *testing.T) {
			h := newHarness(t, 0)
			_, sb := sandboxOnStandIn(t, h, "/exec", func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				answer200(body)(w)
			})
			resp, b := h.exec(t, sb.ID, `{"cmd":["true"]}`)
			var got berth.ExecResult
			if err := json.Unmarshal(b, &got); err != nil || resp.StatusCode != http.StatusOK || got != want {
				t.Fatalf("exec: %d %s (%v); want 200 %+v", resp.StatusCode, b, err, want)
			}
		})
	}
}

// answer200 plays a host that answers an exec 200 with body.
func answer200(body string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, body)
	}
}

// exec posts body to sandbox id's exec with the harness's key and returns the answer, its
// body read.
func (h *harness) exec(t *testing.T, id, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/sandboxes/"+id+"/exec", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}
