package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// fakeBench is a stand-in Berth server on 127.0.0.1 for `bench create`: creates answers each
// POST /v1/sandboxes (its argument is the 1-based count), DELETEs answer 204 and
// GET /v1/reservations answers ledger (nil: an empty list). It counts what it was sent.
type fakeBench struct {
	URL               string
	creates, deletes  atomic.Int64
	ledgerGets, other atomic.Int64
}

func newFakeBench(t *testing.T, creates func(w http.ResponseWriter, n int64), ledger http.HandlerFunc) *fakeBench {
	t.Helper()
	fb := &fakeBench{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes":
			creates(w, fb.creates.Add(1))
		case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/sandboxes/"):
			fb.deletes.Add(1)
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/reservations":
			fb.ledgerGets.Add(1)
			if ledger != nil {
				ledger(w, r)
				return
			}
			writeJSON(w, http.StatusOK, map[string]any{"reservations": []berth.Reservation{}})
		default:
			fb.other.Add(1)
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	fb.URL = srv.URL
	return fb
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func answerError(status int, code string) func(http.ResponseWriter, int64) {
	return func(w http.ResponseWriter, _ int64) {
		writeJSON(w, status, berth.ErrorBody{Error: berth.ErrorDetail{Code: code, Message: "refused by the test server"}})
	}
}

func answerCreated(w http.ResponseWriter, n int64) {
	writeJSON(w, http.StatusCreated, berth.Sandbox{ID: fmt.Sprintf("sb-%d", n), Template: "shell"})
}

// TestBenchCreateRefusesBadURLs: a --urls entry (or --url) that is not http(s)://HOST:PORT is
// refused with exit 2 and the global --url's message before any create is sent — it used to
// run ~200,000 "refused transport" attempts a second and exit 0.
func TestBenchCreateRefusesBadURLs(t *testing.T) {
	fb := newFakeBench(t, answerCreated, nil)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no scheme", []string{"--urls", "notaurl"}, `--urls "notaurl" is not a server URL: want http://HOST:PORT or https://HOST:PORT (did you mean http://notaurl ?)`},
		{"host:port", []string{"--urls", "localhost:1"}, `--urls "localhost:1" is not a server URL: want http://HOST:PORT`},
		{"one bad of two", []string{"--urls", fb.URL + ",notaurl"}, `--urls "notaurl" is not a server URL`},
		{"empty entry", []string{"--urls", fb.URL + ","}, `--urls "" is not a server URL`},
		{"other scheme", []string{"--urls", "ftp://127.0.0.1:1"}, `--urls "ftp://127.0.0.1:1" is not a server URL`},
		{"--url", []string{"--url", "notaurl"}, `--url "notaurl" is not a server URL: want http://HOST:PORT`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--key", "x", "bench", "create", "--clients", "2", "--duration", "1s", "--max-creates", "50"}, tt.args...)
			r := runCLI(t, "", args...)
			if r.code != exitInvalid {
				t.Errorf("exit %d, want %d; stdout %q", r.code, exitInvalid, r.stdout)
			}
			checkStderr(t, r.stderr, tt.want)
		})
	}
	if n := fb.creates.Load() + fb.deletes.Load() + fb.ledgerGets.Load() + fb.other.Load(); n != 0 {
		t.Errorf("the server was sent %d requests, want none", n)
	}
}

// TestBenchCreateStopsAtRefusal: a create refused with a 4xx other than 429 will be refused
// the same way every time, so the run stops at it, prints the server's error and exits 2 for
// a flag to fix (404 template_not_found, 400) or 1 (401, 403, an answer that is not Berth's)
// — it used to send thousands and exit 0. A 429 is counted, not a stop.
func TestBenchCreateStopsAtRefusal(t *testing.T) {
	notBerth := func(w http.ResponseWriter, _ int64) { http.NotFound(w, nil) }
	for _, tt := range []struct {
		name    string
		answer  func(http.ResponseWriter, int64)
		clients int
		code    int
		want    string
	}{
		{"template not found", answerError(http.StatusNotFound, berth.ETemplateNotFound), 1, exitInvalid, "template_not_found: refused by the test server"},
		{"unauthorized", answerError(http.StatusUnauthorized, berth.EUnauthorized), 1, exitFailure, "unauthorized: refused by the test server (the key came from --key)"},
		{"invalid request", answerError(http.StatusBadRequest, berth.EInvalidRequest), 1, exitInvalid, "invalid_request"},
		{"tenant over quota", answerError(http.StatusForbidden, berth.ETenantOverQuota), 1, exitFailure, "tenant_over_quota"},
		{"not a Berth answer", notBerth, 1, exitFailure, "answered HTTP 404 without a Berth error: is it a Berth server?"},
		{"many clients", answerError(http.StatusNotFound, berth.ETemplateNotFound), 8, exitInvalid, "template_not_found"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFakeBench(t, tt.answer, nil)
			r := runCLI(t, "", "--key", "x", "bench", "create", "--url", fb.URL, "--clients", fmt.Sprint(tt.clients),
				"--duration", "30s", "--max-creates", "500")
			if r.code != tt.code {
				t.Errorf("exit %d, want %d; stdout %q stderr %q", r.code, tt.code, r.stdout, r.stderr)
			}
			checkStderr(t, r.stderr, tt.want)
			// Each client has at most one create in flight when the first refusal stops the run.
			if n := fb.creates.Load(); n < 1 || n > int64(tt.clients) {
				t.Errorf("the server was sent %d creates, want 1–%d", n, tt.clients)
			}
			if r.stdout != "" {
				t.Errorf("a stopped run printed a report:\n%s", r.stdout)
			}
		})
	}

	t.Run("429 is counted", func(t *testing.T) {
		fb := newFakeBench(t, answerError(http.StatusTooManyRequests, berth.ERateLimited), nil)
		r := runCLI(t, "", "--key", "x", "bench", "create", "--url", fb.URL, "--clients", "1", "--duration", "30s", "--max-creates", "5")
		if r.code != 0 || fb.creates.Load() != 5 || !regexp.MustCompile(`refused rate_limited\s+5\n`).MatchString(r.stdout) {
			t.Errorf("exit %d after %d creates, want 0 after 5; stdout:\n%s\nstderr %q", r.code, fb.creates.Load(), r.stdout, r.stderr)
		}
	})
}

// TestBenchCreateUnreachable: a URL that answers no attempt stops the run with exit 3 and
// "cannot reach" — also beside a replica that answers, and what was created is deleted. Once
// a URL has answered, its transport failures are counted and the run goes on.
func TestBenchCreateUnreachable(t *testing.T) {
	t.Run("only URL", func(t *testing.T) {
		closed := closedURL(t)
		r := runCLI(t, "", "--key", "x", "bench", "create", "--url", closed, "--clients", "2", "--duration", "2s", "--max-creates", "200")
		if r.code != exitRetry {
			t.Errorf("exit %d, want %d; stdout %q", r.code, exitRetry, r.stdout)
		}
		checkStderr(t, r.stderr, "cannot reach the Berth server at "+closed+" (connection refused)")
	})
	t.Run("beside one that answers", func(t *testing.T) {
		fb := newFakeBench(t, answerCreated, nil)
		closed := closedURL(t)
		// One client, attempt n goes to URL n mod 2: the first to fb (created), the second to
		// the closed port (the stop).
		r := runCLI(t, "", "--key", "x", "bench", "create", "--urls", closed+","+fb.URL, "--clients", "1", "--duration", "30s", "--max-creates", "200")
		if r.code != exitRetry {
			t.Errorf("exit %d, want %d; stdout %q stderr %q", r.code, exitRetry, r.stdout, r.stderr)
		}
		checkStderr(t, r.stderr, "cannot reach the Berth server at "+closed)
		if c, d := fb.creates.Load(), fb.deletes.Load(); c != 1 || d != 1 {
			t.Errorf("%d created, %d deleted: want 1 and its cleanup", c, d)
		}
	})
	t.Run("after an answer", func(t *testing.T) {
		// The first create is answered; every later one has its connection closed unanswered.
		fb := newFakeBench(t, func(w http.ResponseWriter, n int64) {
			if n == 1 {
				answerCreated(w, n)
				return
			}
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}, nil)
		r := runCLI(t, "", "--key", "x", "bench", "create", "--url", fb.URL, "--clients", "1", "--duration", "30s", "--max-creates", "4")
		if r.code != 0 || !regexp.MustCompile(`refused transport\s+3\n`).MatchString(r.stdout) {
			t.Errorf("exit %d, want 0 with 3 transport refusals; stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
		}
	})
}

// TestBenchCreateLedgerUnknown: when GET /v1/reservations cannot be read (a tenant key), the
// report says the reservations are unknown and why, instead of the placeholder -1.
func TestBenchCreateLedgerUnknown(t *testing.T) {
	fb := newFakeBench(t, answerCreated, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusForbidden, berth.ErrorBody{Error: berth.ErrorDetail{Code: berth.EForbidden, Message: "admin key required"}})
	})
	r := runCLI(t, "", "--key", "x", "bench", "create", "--url", fb.URL, "--clients", "1", "--duration", "30s", "--max-creates", "2")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	for _, re := range []string{
		`outstanding reservations at stop\s+unknown \(GET /v1/reservations answered forbidden: it needs an admin key\)\n`,
		`outstanding reservations after cleanup\s+unknown \(GET /v1/reservations answered forbidden: it needs an admin key\)\n`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("the report lacks %q:\n%s", re, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "-1") {
		t.Errorf("the report shows a placeholder -1:\n%s", r.stdout)
	}
	if fb.deletes.Load() != 2 {
		t.Errorf("%d deleted, want the 2 created", fb.deletes.Load())
	}
}

// TestBenchFleetFlagsNamed: a bench fleet flag out of range is refused (exit 2) before anything
// starts, naming that flag — not bench create's --max-creates or a URL, which fleet has not.
func TestBenchFleetFlagsNamed(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "20m"}, "--duration 20m0s: want more than 0 and at most 10m"},
		{[]string{"--duration", "0s"}, "--duration 0s: want more than 0 and at most 10m"},
		{[]string{"--clients", "0"}, "--clients 0: want 1–4096"},
		{[]string{"--clients", "5000"}, "--clients 5000: want 1–4096"},
	} {
		r := runCLI(t, "", append([]string{"bench", "fleet"}, tt.args...)...)
		if r.code != exitInvalid {
			t.Errorf("bench fleet %v: exit %d, want %d", tt.args, r.code, exitInvalid)
		}
		checkStderr(t, r.stderr, tt.want)
		if strings.Contains(r.stderr, "max-creates") || strings.Contains(r.stderr, "URL") {
			t.Errorf("bench fleet %v names flags it does not have: %q", tt.args, r.stderr)
		}
	}
}

// TestBenchAgentsNeedsAServer: bench agents without --server or BERTH_NODE_TOKEN is a usage
// error (exit 2, saying what to set), not a failure (exit 1) a script would retry.
func TestBenchAgentsNeedsAServer(t *testing.T) {
	t.Setenv("BERTH_NODE_TOKEN", "")
	for _, args := range [][]string{{}, {"--server", "http://127.0.0.1:1"}} {
		r := runCLI(t, "", append([]string{"bench", "agents"}, args...)...)
		if r.code != exitInvalid {
			t.Errorf("bench agents %v: exit %d, want %d", args, r.code, exitInvalid)
		}
		checkStderr(t, r.stderr, "set --server and BERTH_NODE_TOKEN")
	}
}

// TestFleetReportRefusals: bench fleet prints refusals as "code N, code M", sorted, or
// "none" — not a Go map.
func TestFleetReportRefusals(t *testing.T) {
	for _, tt := range []struct {
		byCode map[string]int
		want   string
	}{
		{map[string]int{}, "(refused: none)"},
		{nil, "(refused: none)"},
		{map[string]int{"transport": 1, "no_capacity": 12, "rate_limited": 3}, "(refused: no_capacity 12, rate_limited 3, transport 1)"},
	} {
		var out bytes.Buffer
		fleetReport{Create: benchResult{Elapsed: time.Second, Attempts: 20, Created: 4, ByCode: tt.byCode}}.print(&out)
		if !strings.Contains(out.String(), tt.want) || strings.Contains(out.String(), "map[") {
			t.Errorf("the report lacks %q:\n%s", tt.want, out.String())
		}
	}
}

// TestBenchCreateInterruptCleansUp: an interrupt (Ctrl-C: the command's context cancelled)
// while creates are in flight lets them finish, deletes every sandbox the server created —
// the ones answered after the interrupt included — and returns an error, not a report with
// exit 0 (found by an attack: 18 bench sandboxes were left running and the exit was 0).
func TestBenchCreateInterruptCleansUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fb := newFakeBench(t, func(w http.ResponseWriter, n int64) {
		if n == 6 {
			cancel() // the interrupt lands while this create, and others, are in flight
		}
		answerCreated(w, n)
	}, nil)
	_, err := runBenchCreate(ctx, benchConfig{URLs: []string{fb.URL}, Key: "k", Clients: 4,
		Duration: 30 * time.Second, MaxCreates: 1000, Template: "shell", Cleanup: true})
	if err == nil || !strings.Contains(err.Error(), "interrupted") || !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v; want an error saying it was interrupted", err)
	}
	if c, d := fb.creates.Load(), fb.deletes.Load(); c < 6 || d != c {
		t.Fatalf("the server created %d and was asked to delete %d; want every one deleted", c, d)
	}
}
