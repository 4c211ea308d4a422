package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// answering starts a 127.0.0.1 server that gives every request the same answer and counts
// the requests.
func answering(t *testing.T, status int, header map[string]string, body string) (string, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if status == 0 { // hang up once the request is read: no answer at all
			_, _ = io.Copy(io.Discard, r.Body)
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

// apiError is an API-2 error body.
func apiError(code, msg string, retryAfterS int) string {
	b, _ := json.Marshal(berth.ErrorBody{Error: berth.ErrorDetail{Code: code, Message: msg, Retryable: retryAfterS > 0, RetryAfterS: retryAfterS}})
	return string(b)
}

// TestCLI_ExitCodesServerAnswers: the server's answers map to exitCode's rule — 400/404/413
// exit 2, 401/403/409/500 and an answer that is not Berth's exit 1, a refusal exits 3 —
// and the message gives the code, the server's words, and for a refusal the attempts and
// the last Retry-After; a Retry-After past --wait gives up after one request (C30). A
// sandboxed command's own exit code and stderr pass through untouched.
func TestCLI_ExitCodesServerAnswers(t *testing.T) {
	t.Setenv("BERTH_KEY", "")
	keyFile := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(keyFile, []byte("wrong-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	create := []string{"sandbox", "create", "nosuch"}
	get := []string{"sandbox", "get", "sb-1"}
	exec := []string{"sandbox", "exec", "sb-1", "--", "nosuchcmd"}
	drain := []string{"agents", "drain", "a-1", "--reason", "kernel upgrade"}
	tests := []struct {
		name     string
		args     []string
		status   int
		header   map[string]string
		body     string
		code     int
		requests int    // 0: more than one
		want     string // in the last stderr line; "" for no stderr at all
		stdout   string
	}{
		{"template not found", create, 404, nil, apiError(berth.ETemplateNotFound, `no template "nosuch"`, 0), 2, 1, `template_not_found: no template "nosuch"`, ""},
		{"sandbox not found", get, 404, nil, apiError(berth.ESandboxNotFound, "no sandbox sb-1", 0), 2, 1, "sandbox_not_found: no sandbox sb-1", ""},
		{"invalid request", create, 400, nil, apiError(berth.EInvalidRequest, "memory_mb out of range", 0), 2, 1, "invalid_request: memory_mb out of range", ""},
		{"too large", []string{"sandbox", "write", "sb-1", "/tmp/x"}, 413, nil, apiError(berth.ETooLarge, "over 64 MiB", 0), 2, 1, "request_too_large: over 64 MiB", ""},
		{"conflict", exec, 409, nil, apiError(berth.EConflict, "sandbox sb-1 is stopped", 0), 1, 1, "conflict: sandbox sb-1 is stopped", ""},
		{"unauthorized names the key file", get, 401, nil, apiError(berth.EUnauthorized, "unknown key", 0), 1, 1, "unauthorized: unknown key (the key came from --key-file " + keyFile + ")", ""},
		{"over quota", create, 403, nil, apiError(berth.ETenantOverQuota, "2 of 2 sandboxes", 0), 1, 1, "tenant_over_quota: 2 of 2 sandboxes", ""},
		{"internal", get, 500, nil, apiError(berth.EInternal, "internal error", 0), 1, 1, "internal: internal error", ""},
		{"not Berth's JSON", get, 200, nil, "<html>captive portal</html>", 1, 1, "GET /v1/sandboxes/sb-1: the answer (HTTP 200) is not the JSON Berth sends", ""},
		// The command may have run behind the proxy: exit 1 and say so, never 3's "try again".
		{"proxy 502 on exec, sent once", exec, 502, nil, "<html>bad gateway</html>", 1, 1, "outcome_unknown: HTTP 502 Bad Gateway", ""},
		{"exec answered by a hang-up: its command may have run", exec, 0, nil, "", 1, 1,
			"took the exec, but no answer came back (the connection closed before an answer): the command may have run", ""},
		{"drain answered by a hang-up", drain, 0, nil, "", 3, 1, "cannot reach the Berth server", ""},
		{"proxy 502 on drain, sent once", drain, 502, nil, "<html>bad gateway</html>", 3, 1, "unavailable: HTTP 502 Bad Gateway", ""},
		{"C30 Retry-After past --wait: one request", create, 503, map[string]string{"Retry-After": "86401"}, apiError(berth.ENoCapacity, "1 hosts: 1 insufficient memory", 86401), 3, 1,
			"capacity unavailable: no_capacity: 1 hosts: 1 insufficient memory; gave up after 1 attempt in 0s (--wait 1m30s); the server's last Retry-After was 24h0m1s; try again later", ""},
		{"C30 twenty nines", get, 503, map[string]string{"Retry-After": "99999999999999999999"}, apiError(berth.ENoCapacity, "full", 0), 3, 1,
			"capacity unavailable: no_capacity: full; gave up after 1 attempt in 0s", ""},
		{"refusals until --wait", create, 503, map[string]string{"Retry-After": "30"}, apiError(berth.ENoCapacity, "full", 30), 3, 4,
			"capacity unavailable: no_capacity: full; gave up after 4 attempts in 1m30s (--wait 1m30s); the server's last Retry-After was 30s; try again later", ""},
		{"command not found: the sandbox's own stderr and code", exec, 200, nil, `{"exit_code":127,"stdout":"","stderr":"sandbox: nosuchcmd: command not found\n"}`, 127, 1, "", ""},
		{"timed-out command", exec, 200, nil, `{"exit_code":-1,"stdout":"partial\n","stderr":""}`, 1, 1, "", "partial\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, n := answering(t, tt.status, tt.header, tt.body)
			r := runCLI(t, "data", append([]string{"--url", base, "--key-file", keyFile}, tt.args...)...)
			got := struct {
				Code     int
				Requests int32
				Stdout   string
			}{r.code, n.Load(), r.stdout}
			want := got
			want.Code, want.Stdout = tt.code, tt.stdout
			if tt.requests > 0 {
				want.Requests = int32(tt.requests)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nstderr:\n%s", diff, r.stderr)
			}
			switch {
			case tt.code == 127:
				if r.stderr != "sandbox: nosuchcmd: command not found\n" {
					t.Errorf("stderr %q, want the sandbox's own line verbatim and nothing from the CLI", r.stderr)
				}
			case tt.want == "":
				if r.stderr != "" {
					t.Errorf("stderr %q, want none", r.stderr)
				}
			default:
				checkStderr(t, r.stderr, tt.want)
			}
			if tt.name == "refusals until --wait" && !strings.Contains(r.stderr, "retrying in 30.0s, as the server's Retry-After asks") {
				t.Errorf("the waits do not say they are the server's Retry-After:\n%s", r.stderr)
			}
		})
	}
}
