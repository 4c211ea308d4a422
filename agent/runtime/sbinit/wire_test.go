package sbinit

import (
	"bufio"
	"net"
	"strings"
	"testing"
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
