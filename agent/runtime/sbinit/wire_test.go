package sbinit

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
)

// TestRoundTripHeaderNotHTMLEscaped: an exec's stdin of '<' crosses the wire to the init as
// itself, one byte each, not as \u003c (six): the init holds the header in the sandbox's own
// memory, and a burst of 1 MiB execs of HTML got the sandbox OOM-killed (found by an attack).
func TestRoundTripHeaderNotHTMLEscaped(t *testing.T) {
	ours, theirs := net.Pipe()
	defer ours.Close()
	got := make(chan string, 1)
	go func() {
		defer theirs.Close()
		line, _ := bufio.NewReader(theirs).ReadString('\n')
		got <- line
		theirs.Write([]byte("{}\n"))
	}()
	stdin := strings.Repeat("<&>", 1000)
	if _, err := roundTrip(ours, bufio.NewReader(ours), wireRequest{Op: opExec, Cmd: []string{"cat"}, Stdin: stdin}); err != nil {
		t.Fatal(err)
	}
	line := <-got
	if !strings.Contains(line, stdin) || strings.Contains(line, `\u003c`) || len(line) > len(stdin)+200 {
		t.Fatalf("header of %d bytes for %d bytes of stdin, escaped: %v; want the stdin as it is", len(line), len(stdin), strings.Contains(line, `\u003c`))
	}
}

// TestInitCannotAnswerBerthsRefusals: the init runs inside the sandbox, where the guest can
// stand in for it, so a code it never sends — rate_limited, which the SDKs retry for any call
// because the server sends it before doing anything — reaches the agent as an internal fault
// of the init, never as itself (found by an attack: a guest answering rate_limited after its
// command ran had the CLI run it eight times). Codes the init does send pass through.
func TestInitCannotAnswerBerthsRefusals(t *testing.T) {
	for _, tc := range []struct{ sent, want string }{
		{berth.ERateLimited, berth.EInternal},
		{berth.EUnavailable, berth.EInternal},
		{berth.ENoCapacity, berth.EInternal},
		{berth.EUnauthorized, berth.EInternal},
		{berth.EInvalidRequest, berth.EInvalidRequest},
		{berth.EForbidden, berth.EForbidden},
		{berth.EServiceExited, berth.EServiceExited},
	} {
		c := &Client{Label: "test", Dial: func(context.Context) (net.Conn, error) {
			ours, theirs := net.Pipe()
			go func() {
				defer theirs.Close()
				bufio.NewReader(theirs).ReadString('\n')
				fmt.Fprintf(theirs, `{"code":%q,"message":"from the guest"}`+"\n", tc.sent)
			}()
			return ours, nil
		}}
		_, err := c.Exec(context.Background(), berth.ExecRequest{Cmd: []string{"true"}})
		if got := berth.ErrorCode(err); got != tc.want {
			t.Errorf("init answered %q: the agent sees %v (code %q), want %q", tc.sent, err, got, tc.want)
		}
	}
}

// TestInitMessagesAreBoundedAndInert: what a guest standing in for its init says reaches the
// agent at most maxInitMessage bytes long (a message of megabytes made the replica misread
// the agent's answer as the agent failing, retryable, for an exec that had run) and with
// its control characters escaped, line breaks and tabs kept (a service's output tail).
func TestInitMessagesAreBoundedAndInert(t *testing.T) {
	for _, tc := range []struct{ sent, want string }{
		{"no such file", "no such file"},
		{"exited 3; output tail:\nline 1\n\tline 2", "exited 3; output tail:\nline 1\n\tline 2"},
		{"\x1b[2J\x1b[31mFAKE\r\x07", `\x1b[2J\x1b[31mFAKE\x0d\x07`},
		{"bad \xff byte", "bad \uFFFD byte"},
	} {
		if got := initMessage(tc.sent); got != tc.want {
			t.Errorf("initMessage(%q) = %q, want %q", tc.sent, got, tc.want)
		}
	}
	long := initMessage(strings.Repeat("\x1b", 1<<20))
	if len(long) > maxInitMessage+len(" … (cut)") || !strings.HasSuffix(long, " … (cut)") || strings.ContainsRune(long, 0x1b) {
		t.Errorf("a 1 MiB message of ESC: %d bytes, raw ESC kept: %v; want at most %d, escaped, marked cut", len(long), strings.ContainsRune(long, 0x1b), maxInitMessage)
	}
}
