package server

import "testing"

// TestOneLine: a reason folded from a command's output is one line, with ⏎ between its
// lines and none dangling at either end (an output ending in a newline read
// "… output tail: boom ⏎").
func TestOneLine(t *testing.T) {
	for in, want := range map[string]string{
		"the service exited with code 1; output tail:\nboom\n": "the service exited with code 1; output tail: ⏎ boom",
		"a\n\nb":        "a ⏎ ⏎ b",
		"\n  plain  \n": "plain",
		"":              "",
	} {
		if got := oneLine(in); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", in, got, want)
		}
	}
}
