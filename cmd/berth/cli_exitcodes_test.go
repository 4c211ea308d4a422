package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// fakeClock is a client.Clock whose Sleep returns at once, moving Now on: a CLI test sees
// every retry of a 90 s --wait without waiting for any of it. It refuses to run away.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.sleeps) >= 1000 {
		return errors.New("fake clock: over 1000 waits, the retry loop does not end")
	}
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return ctx.Err()
}

// cliRun is one run of the berth binary's front door (run) with a fake clock: what it
// printed and its exit code.
type cliRun struct {
	code           int
	stdout, stderr string
	sleeps         []time.Duration
}

func runCLI(t *testing.T, stdin string, args ...string) cliRun {
	t.Helper()
	clk := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	var out, errOut bytes.Buffer
	cf := &clientFlags{opts: []client.Option{client.WithClock(clk)}}
	code := run(context.Background(), cf, args, strings.NewReader(stdin), &out, &errOut)
	return cliRun{code: code, stdout: out.String(), stderr: errOut.String(), sleeps: clk.sleeps}
}

// goInternals are texts that must never reach a person's terminal: the SDK's package name,
// net/http's and net's framing, strconv's and encoding/json's prefixes, fmt's misuse marks.
var goInternals = []string{"client:", `Get "`, `Post "`, `Put "`, `Delete "`, "dial tcp", "strconv.", "json:",
	`parse "`, "%!", "<nil>", "&{", "context canceled"}

// checkStderr fails unless every line of stderr is the CLI's own ("berth: …") and free of
// Go internals, and the last one contains want.
func checkStderr(t *testing.T, stderr, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, "berth: ") {
			t.Errorf("stderr line %q does not start with \"berth: \"", l)
		}
		for _, bad := range goInternals {
			if strings.Contains(l, bad) {
				t.Errorf("stderr line %q shows %q", l, bad)
			}
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, want) {
		t.Errorf("last stderr line %q lacks %q", last, want)
	}
}

// closedURL is the URL of a 127.0.0.1 port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + l.Addr().String()
	l.Close()
	return u
}

// serverCommands are every CLI subcommand that talks to a server, with valid arguments.
var serverCommands = [][]string{
	{"sandbox", "create", "python"}, {"sandbox", "list"}, {"sandbox", "get", "sb-1"},
	{"sandbox", "exec", "sb-1", "--", "true"}, {"sandbox", "write", "sb-1", "/tmp/x"},
	{"sandbox", "read", "sb-1", "/tmp/x"}, {"sandbox", "pause", "sb-1"}, {"sandbox", "resume", "sb-1"},
	{"sandbox", "kill", "sb-1"}, {"templates"},
	{"agents", "list"}, {"agents", "drain", "a1"}, {"agents", "undrain", "a1"}, {"agents", "drain-status", "a1"},
	{"events"}, {"events", "sandbox/sb-1"},
	{"tenants", "create", "t1"}, {"tenants", "key", "t1"}, {"tenants", "quota", "t1"}, {"tenants", "quota", "t1", "--sandboxes", "3"},
	{"apps", "create", "web", "--template", "python", "--port", "8080", "--", "python3", "-m", "http.server"},
	{"apps", "list"}, {"apps", "get", "web"}, {"apps", "deploy", "web"}, {"apps", "idle", "web", "60"},
	{"apps", "hibernate", "web"}, {"apps", "wake", "web"}, {"apps", "stop", "web"}, {"apps", "start", "web"},
	{"apps", "delete", "web"},
}

// TestCLI_ExitCodesUnreachable: every subcommand against a closed 127.0.0.1 port exits 3 and
// says it cannot reach the server at that URL — the retried ones after --wait (90 s on the
// fake clock), exec and drain (sent once) at once — with no Go internals on stderr; plan and
// sim need no server and exit 0.
func TestCLI_ExitCodesUnreachable(t *testing.T) {
	base := closedURL(t)
	want := "cannot reach the Berth server at " + base + " (connection refused)"
	for _, args := range serverCommands {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			r := runCLI(t, "data", append([]string{"--url", base, "--key", "k"}, args...)...)
			if r.code != exitRetry {
				t.Errorf("exit %d, want %d; stderr:\n%s", r.code, exitRetry, r.stderr)
			}
			checkStderr(t, r.stderr, want)
			var total time.Duration
			for _, d := range r.sleeps {
				total += d
			}
			if total > 90*time.Second {
				t.Errorf("waited %v in all, past --wait", total)
			}
		})
	}
	for _, args := range [][]string{{"plan"}, {"sim", "--creates", "20", "--hosts", "1", "--policies", "committed"}} {
		if r := runCLI(t, "", append([]string{"--url", base}, args...)...); r.code != 0 {
			t.Errorf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

// TestCLI_ExitCodesBadInput: a wrong command line exits 2 for every subcommand, with one
// "berth: " line that names the problem and no Go internals, before any request is sent
// (the server URL is a closed port: reaching for it would exit 3).
func TestCLI_ExitCodesBadInput(t *testing.T) {
	t.Setenv("BERTH_KEY", "")
	t.Setenv("BERTH_URL", "")
	base := closedURL(t)
	dir := t.TempDir()
	empty, twoWords := filepath.Join(dir, "empty.key"), filepath.Join(dir, "two.key")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(twoWords, []byte("key one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string // in the message
	}{
		{"sandbox create without template", []string{"sandbox", "create"}, "sandbox create: accepts 1 arg(s), received 0"},
		{"sandbox create bad memory", []string{"sandbox", "create", "python", "--memory-mb", "lots"}, `--memory-mb "lots": want a whole number`},
		{"sandbox create unknown flag", []string{"sandbox", "create", "python", "--gpu"}, "unknown flag: --gpu"},
		{"sandbox list extra", []string{"sandbox", "list", "running"}, `unknown command "running"`},
		{"sandbox list bad state", []string{"sandbox", "list", "--state", "bogus"}, `--state "bogus": want one of pending, starting, running, stopping, ` +
			`stopped, failed, lost, evicted, evacuating, reconstructed, migrated, pausing, paused, resuming, snapshotting`},
		{"sandbox get", []string{"sandbox", "get"}, "accepts 1 arg(s)"},
		{"sandbox exec without command", []string{"sandbox", "exec", "sb-1"}, "requires at least 2 arg(s)"},
		{"sandbox exec bad timeout", []string{"sandbox", "exec", "sb-1", "--timeout", "1m", "--", "true"}, `--timeout "1m": want a whole number`},
		{"sandbox write", []string{"sandbox", "write", "sb-1"}, "accepts 2 arg(s)"},
		{"sandbox read", []string{"sandbox", "read", "sb-1"}, "accepts 2 arg(s)"},
		{"sandbox pause", []string{"sandbox", "pause"}, "accepts 1 arg(s)"},
		{"sandbox resume", []string{"sandbox", "resume", "a", "b"}, "accepts 1 arg(s)"},
		{"sandbox kill", []string{"sandbox", "kill"}, "accepts 1 arg(s)"},
		{"sandbox nosuch", []string{"sandbox", "nosuch"}, `unknown command "nosuch" for "berth sandbox"`},
		{"templates extra", []string{"templates", "python"}, `unknown command "python"`},
		{"agents list extra", []string{"agents", "list", "a1"}, `unknown command "a1"`},
		{"agents drain", []string{"agents", "drain"}, "accepts 1 arg(s)"},
		{"agents undrain", []string{"agents", "undrain"}, "accepts 1 arg(s)"},
		{"agents drain-status", []string{"agents", "drain-status"}, "accepts 1 arg(s)"},
		{"events two entities", []string{"events", "sandbox/sb-1", "agent/a1"}, "accepts at most 1 arg(s)"},
		{"tenants create", []string{"tenants", "create"}, "accepts 1 arg(s)"},
		{"tenants key", []string{"tenants", "key"}, "accepts 1 arg(s)"},
		{"tenants quota", []string{"tenants", "quota"}, "accepts 1 arg(s)"},
		{"tenants quota bad number", []string{"tenants", "quota", "t1", "--sandboxes", "many"}, `--sandboxes "many": want a whole number`},
		{"tenants quota negative", []string{"tenants", "quota", "t1", "--memory-mb", "-1"}, "want 0 (no limit) or more"},
		{"apps create without command", []string{"apps", "create", "web", "--template", "python", "--port", "8080"}, "requires at least 2 arg(s)"},
		{"apps create without template", []string{"apps", "create", "web", "--port", "8080", "--", "sh"}, `required flag(s) "template" not set`},
		{"apps create bad --file", []string{"apps", "create", "web", "--template", "python", "--port", "8080", "--file", "index.html", "--", "sh"}, `--file "index.html": want PATH=LOCALFILE`},
		{"apps create missing --file", []string{"apps", "create", "web", "--template", "python", "--port", "8080", "--file", "a=" + dir + "/nope", "--", "sh"}, "cannot read " + dir + "/nope: no such file or directory"},
		{"apps create bad --env", []string{"apps", "create", "web", "--template", "python", "--port", "8080", "--env", "DEBUG", "--", "sh"}, `--env "DEBUG": want NAME=VALUE`},
		{"apps create bad -o", []string{"apps", "create", "web", "--template", "python", "--port", "8080", "-o", "xml", "--", "sh"}, `-o "xml": want table, json or yaml`},
		{"apps list extra", []string{"apps", "list", "web"}, `unknown command "web"`},
		{"apps get", []string{"apps", "get"}, "accepts 1 arg(s)"},
		{"apps deploy", []string{"apps", "deploy"}, "requires at least 1 arg(s)"},
		{"apps deploy bad --file", []string{"apps", "deploy", "web", "--file", "x"}, `--file "x": want PATH=LOCALFILE`},
		{"apps idle not a number", []string{"apps", "idle", "web", "soon"}, `SECONDS "soon" is not a whole number`},
		{"apps hibernate", []string{"apps", "hibernate"}, "accepts 1 arg(s)"},
		{"apps wake", []string{"apps", "wake"}, "accepts 1 arg(s)"},
		{"apps stop", []string{"apps", "stop"}, "accepts 1 arg(s)"},
		{"apps start", []string{"apps", "start"}, "accepts 1 arg(s)"},
		{"apps delete", []string{"apps", "delete"}, "accepts 1 arg(s)"},
		{"apps nosuch", []string{"apps", "nosuch"}, `unknown command "nosuch" for "berth apps"`},
		{"plan bad input", []string{"plan", "--memory-mb", "0"}, "need --memory-mb > 0"},
		{"plan unknown flag", []string{"plan", "--gpus", "1"}, "unknown flag: --gpus"},
		{"sim bad input", []string{"sim", "--hosts", "0"}, "need 1–100000 hosts"},
		{"sim bad duration", []string{"sim", "--lifetime", "forever"}, `--lifetime "forever": want a duration such as 90s or 2m`},
		{"unknown command", []string{"sandboxes-list"}, `unknown command "sandboxes-list" for "berth"`},
		{"url without scheme", []string{"--url", "127.0.0.1:7070", "templates"}, `--url "127.0.0.1:7070" is not a server URL: want http://HOST:PORT or https://HOST:PORT (did you mean http://127.0.0.1:7070 ?)`},
		{"url of another scheme", []string{"--url", "ftp://127.0.0.1:7070", "sandbox", "list"}, `--url "ftp://127.0.0.1:7070" is not a server URL`},
		{"negative wait", []string{"--wait", "-1s", "templates"}, `--wait "-1s": want a duration of 0 or more`},
		{"key file missing", []string{"--key-file", dir + "/nope.key", "templates"}, "--key-file " + dir + "/nope.key: cannot read the API key: no such file or directory"},
		{"key file empty", []string{"--key-file", empty, "sandbox", "exec", "sb-1", "--", "true"}, "--key-file " + empty + " is empty"},
		{"key file of two words", []string{"--key-file", twoWords, "agents", "drain", "a1"}, "--key-file " + twoWords + " holds more than one word"},
		{"key file a directory", []string{"--key-file", dir, "events"}, "--key-file " + dir + ": cannot read the API key: is a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if args[0] != "--url" {
				args = append([]string{"--url", base}, args...)
			}
			if !strings.HasPrefix(tt.name, "key file") {
				args = append([]string{"--key", "k"}, args...)
			}
			r := runCLI(t, "", args...)
			got := struct {
				Code, Lines int
				Sleeps      int
			}{r.code, strings.Count(r.stderr, "\n"), len(r.sleeps)}
			if diff := cmp.Diff(struct{ Code, Lines, Sleeps int }{exitInvalid, 1, 0}, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nstderr: %s", diff, r.stderr)
			}
			checkStderr(t, r.stderr, tt.want)
		})
	}
}

// TestExitCodeRule pins exitCode's rule for every error kind and every API-2 code.
func TestExitCodeRule(t *testing.T) {
	refused := &client.TransportError{Method: "POST", Path: "/v1/sandboxes/sb-1/exec", Server: "http://127.0.0.1:1",
		Err: &url.Error{Op: "Post", URL: "u", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}}
	dns := &client.TransportError{Err: &url.Error{Op: "Get", URL: "u", Err: &net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "berth.invalid"}}}}
	timeout := &client.TransportError{Err: &url.Error{Op: "Get", URL: "u", Err: &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}}}
	tls := &client.TransportError{Err: &url.Error{Op: "Get", URL: "u", Err: errors.New("tls: failed to verify certificate")}}
	capacity := &client.CapacityUnavailable{Attempts: 1, LastCode: berth.ENoCapacity, Last: &berth.Error{Code: berth.ENoCapacity}, RetryAfter: 86401 * time.Second}
	gone := &client.CapacityUnavailable{Attempts: 4, LastCode: berth.EUnavailable, Last: &berth.Error{Code: berth.EUnavailable}, Err: refused}
	errs := map[string]error{
		"exec 7": &exitError{code: 7}, "exec 255": &exitError{code: 255}, "exec timed out (-1)": &exitError{code: -1},
		"usage": &usageError{cmd: "berth sandbox", err: errors.New("unknown command")}, "bad input": badInput("--url"),
		"capacity unavailable (C30)": capacity, "server unavailable": gone, "wrapped capacity": fmt.Errorf("x: %w", capacity),
		"refused, not retried": refused, "DNS": dns, "timeout": timeout, "TLS": tls,
		"interrupted": fmt.Errorf("berth: GET /v1/x: %w", context.Canceled), "local I/O": io.ErrUnexpectedEOF,
	}
	want := map[string]int{
		"exec 7": 7, "exec 255": 255, "exec timed out (-1)": 1, "usage": 2, "bad input": 2,
		"capacity unavailable (C30)": 3, "server unavailable": 3, "wrapped capacity": 3,
		"refused, not retried": 3, "DNS": 3, "timeout": 3, "TLS": 1, "interrupted": 1, "local I/O": 1,
	}
	codes := map[string]int{ // every API-2 code
		berth.EInvalidRequest: 2, berth.ETooLarge: 2, berth.ETemplateNotFound: 2, berth.ESandboxNotFound: 2,
		berth.EAppNotFound: 2, berth.ENotFound: 2,
		berth.ENoCapacity: 3, berth.ENoHealthyAgents: 3, berth.EHostStartsSaturated: 3, berth.EUnavailable: 3, berth.EWakeTimeout: 3,
		berth.EUnauthorized: 1, berth.EForbidden: 1, berth.ETenantOverQuota: 1, berth.EConflict: 1, berth.EAppStopped: 1,
		berth.EServiceRunning: 1, berth.EServiceExited: 1, berth.EUpstream: 1, berth.EAppError: 1, berth.EUnsupported: 1,
		berth.EInternal: 1, berth.EOutcomeUnknown: 1, "a_code_from_a_newer_server": 1,
	}
	for code, exit := range codes {
		errs["code "+code] = fmt.Errorf("wrapped: %w", &berth.Error{Code: code, Message: "m"})
		want["code "+code] = exit
	}
	got := map[string]int{}
	for name, err := range errs {
		got[name] = exitCode(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("exit codes (-want +got):\n%s", diff)
	}
	if exitCode(nil) != 0 {
		t.Errorf("exitCode(nil) = %d", exitCode(nil))
	}
}

// TestErrorMessage pins the line run prints after "berth: " for each kind of error — and for
// none: errorMessage(nil) panicked (nil.Error()), which a caller holding the error of a
// command that succeeded would hit.
func TestErrorMessage(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"success", nil, ""},
		{"sandbox exec", &exitError{code: 7}, ""},
		{"explained", &explained{msg: "cannot reach the Berth server", err: io.EOF}, "cannot reach the Berth server"},
		{"interrupted", fmt.Errorf("berth: GET /v1/x: %w", context.Canceled), "interrupted"},
		{"prefix dropped", errors.New("berth: no API key"), "no API key"},
		{"invalid request", &berth.Error{Code: berth.EInvalidRequest, Message: "m"}, "invalid_request: m"},
	} {
		var got string
		func() {
			defer func() {
				if p := recover(); p != nil {
					got = fmt.Sprintf("panic: %v", p)
				}
			}()
			got = errorMessage(tc.err)
		}()
		if got != tc.want {
			t.Errorf("%s: errorMessage(%#v) = %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
}
