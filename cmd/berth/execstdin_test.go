package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// watchedStdin is a standard input that records whether anything read it.
type watchedStdin struct {
	io.Reader
	read bool
}

func (w *watchedStdin) Read(p []byte) (int, error) {
	w.read = true
	return w.Reader.Read(p)
}

// endless is a standard input that never ends: `yes | berth sandbox exec -i …`.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'y'
	}
	return len(p), nil
}

// runCLIWith is runCLI with any standard input.
func runCLIWith(stdin io.Reader, args ...string) cliRun {
	var out, errOut bytes.Buffer
	code := run(context.Background(), &clientFlags{}, args, stdin, &out, &errOut)
	return cliRun{code: code, stdout: out.String(), stderr: errOut.String()}
}

// TestSandboxExecStdin (a new user's report: `echo piped | berth sandbox exec $ID -- cat`
// printed nothing), on `berth dev` with real sandboxes: with -i the piped input reaches the
// command; without it berth reads nothing and the command's stdin is empty; input as large as
// an exec request can carry goes through the server and the agent whole, and one byte more
// is refused before anything is sent.
func TestSandboxExecStdin(t *testing.T) {
	st := bootDev(t, nil)
	cli := func(stdin io.Reader, args ...string) cliRun {
		t.Helper()
		return runCLIWith(stdin, append([]string{"--url", st.URL, "--key", st.AdminKey}, args...)...)
	}
	sb, err := client.New(st.URL, st.AdminKey).CreateSandbox(context.Background(), berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}

	for _, flag := range []string{"-i", "--stdin"} {
		if r := cli(strings.NewReader("piped\n"), "sandbox", "exec", sb.ID, flag, "--", "cat"); r.code != 0 || r.stdout != "piped\n" {
			t.Errorf("exec %s -- cat with \"piped\\n\" on stdin: exit %d, stdout %q, stderr %q; want the input back", flag, r.code, r.stdout, r.stderr)
		}
	}
	in := &watchedStdin{Reader: strings.NewReader("piped\n")}
	if r := cli(in, "sandbox", "exec", sb.ID, "--", "cat"); r.code != 0 || r.stdout != "" || in.read {
		t.Errorf("exec -- cat without -i: exit %d, stdout %q, stderr %q, stdin read: %v; want nothing read and an empty stdin", r.code, r.stdout, r.stderr, in.read)
	}

	// The largest stdin of `wc -c` that fits: the body as the CLI sends it, at the API's bound.
	body, err := json.Marshal(berth.ExecRequest{Cmd: []string{"wc", "-c"}, Stdin: "a"})
	if err != nil {
		t.Fatal(err)
	}
	n := berth.MaxJSONBodyBytes - (len(body) - 1)
	if r := cli(strings.NewReader(strings.Repeat("a", n)), "sandbox", "exec", sb.ID, "-i", "--", "wc", "-c"); r.code != 0 || strings.TrimSpace(r.stdout) != strconv.Itoa(n) {
		t.Errorf("exec -i -- wc -c with %d bytes: exit %d, stdout %q, stderr %q; want %d", n, r.code, r.stdout, r.stderr, n)
	}
	r := cli(strings.NewReader(strings.Repeat("a", n+1)), "sandbox", "exec", sb.ID, "-i", "--", "wc", "-c")
	if r.code != exitInvalid || r.stdout != "" {
		t.Errorf("exec -i with %d bytes, one past the limit: exit %d, stdout %q; want %d", n+1, r.code, r.stdout, exitInvalid)
	}
	checkStderr(t, r.stderr, "over the 1048576 it may have")
}

// TestSandboxExecStdinRefused: stdin that an exec request cannot carry as it is — too large
// (endless, or small but large once JSON-escaped) or not UTF-8 — is a usage error (exit 2)
// that says why and what to do instead, decided before anything is sent: against a closed
// port, a request sent would exit 3.
func TestSandboxExecStdinRefused(t *testing.T) {
	base := closedURL(t)
	for _, tc := range []struct {
		name  string
		stdin io.Reader
		want  string
	}{
		{"endless", endless{}, "standard input is over 1048576 bytes"},
		{"escaped past the limit", strings.NewReader(strings.Repeat("\x01", 200<<10)), "(stdin escaped), over the 1048576 it may have"},
		{"not UTF-8", strings.NewReader("ok\xff\xfe"), "standard input is not UTF-8 text"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLIWith(tc.stdin, "--url", base, "--key", "k", "sandbox", "exec", "sb-1", "-i", "--", "cat")
			if r.code != exitInvalid {
				t.Fatalf("exit %d, want %d; stderr %q", r.code, exitInvalid, r.stderr)
			}
			checkStderr(t, r.stderr, tc.want)
			checkStderr(t, r.stderr, "berth sandbox write ID PATH")
		})
	}
	// Without -i the same input is not read, so the request goes out (and finds no server).
	in := &watchedStdin{Reader: endless{}}
	if r := runCLIWith(in, "--url", base, "--key", "k", "sandbox", "exec", "sb-1", "--", "cat"); r.code != exitRetry || in.read {
		t.Errorf("exec without -i on endless stdin: exit %d (want %d), stdin read: %v; stderr %q", r.code, exitRetry, in.read, r.stderr)
	}
}

// TestExecBodyAtTheAPIBoundReachesTheAgent: an exec body the API accepts — exactly
// MaxJSONBodyBytes, without timeout_s — runs, for the stdin that grows most on its way to the
// agent: '<' (HTML-escaped to six bytes, before the replica stopped escaping) and raw invalid
// UTF-8 (each byte decoded to U+FFFD, three bytes). The agent refused such a forwarded body
// with 413 while the API had taken it.
func TestExecBodyAtTheAPIBoundReachesTheAgent(t *testing.T) {
	st := bootDev(t, nil)
	sb, err := client.New(st.URL, st.AdminKey).CreateSandbox(context.Background(), berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	const head, tail = `{"cmd":["wc","-c"],"stdin":"`, `"}`
	n := berth.MaxJSONBodyBytes - len(head) - len(tail)
	for _, tc := range []struct {
		fill string
		want int // bytes the command reads
	}{{"<", n}, {"\xff", 3 * n}} {
		fill := tc.fill
		body := head + strings.Repeat(fill, n) + tail
		code, _, b := rawPost(t, st, st.AdminKey, "/v1/sandboxes/"+sb.ID+"/exec", body)
		var res berth.ExecResult
		if code != 200 || json.Unmarshal(b, &res) != nil || strings.TrimSpace(res.Stdout) != strconv.Itoa(tc.want) {
			t.Fatalf("exec of a %d-byte body of %q: %d %.300s; want 200 and wc -c = %d", len(body), fill, code, b, tc.want)
		}
	}
	// One byte more is the API's own 413, as before.
	if code, _, b := rawPost(t, st, st.AdminKey, "/v1/sandboxes/"+sb.ID+"/exec", head+strings.Repeat("<", n+1)+tail); code != 413 {
		t.Fatalf("exec of a body one byte over: %d %.300s; want 413", code, b)
	}
}
