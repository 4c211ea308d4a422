package sqlstore

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// TestTerminalStatesMatchDomain keeps the SQL list of terminal states in step with
// berth.SandboxState.Terminal.
func TestTerminalStatesMatchDomain(t *testing.T) {
	var want []any
	for _, st := range berth.SandboxStates {
		if st.Terminal() {
			want = append(want, string(st))
		}
	}
	if diff := cmp.Diff(want, terminalStates); diff != "" {
		t.Errorf("terminalStates (-want +got):\n%s", diff)
	}
}

// TestDollarRebind pins PostgreSQL's placeholders: every '?' outside quotes and comments
// becomes $1, $2, … in order; question marks in literals, identifiers and comments stay.
func TestDollarRebind(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`UPDATE t SET a = ?, b = ? WHERE id = ?`, `UPDATE t SET a = $1, b = $2 WHERE id = $3`},
		{`SELECT '?' || ?, "we?rd" FROM t WHERE x IN (?, ?)`, `SELECT '?' || $1, "we?rd" FROM t WHERE x IN ($2, $3)`},
		{"SELECT ? -- why?\n, ?", "SELECT $1 -- why?\n, $2"},
		{`SELECT 'it''s ?', ?`, `SELECT 'it''s ?', $1`},
	} {
		for range 2 { // the second call comes from the cache
			if got := DollarRebind(c.in); got != c.want {
				t.Errorf("DollarRebind(%q) = %q, want %q", c.in, got, c.want)
			}
		}
	}
}
