package postgres

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
)

// TestAgentsChangedSinceSeesLateCommits (issue 16, goal 2): a transaction that wrote an
// agent's row before a read took its cursor, and commits after that read, is in the next
// read since that cursor. A cursor of "the newest transaction so far" (or of the clock) would
// miss it: its number is older than the cursor though its change is newer than the read.
func TestAgentsChangedSinceSeesLateCommits(t *testing.T) {
	o := newOneTrip(t, 4096)
	ctx := t.Context()
	tx := o.hold(t, `UPDATE agents SET cpu_used = 7 WHERE id = 'a1'`)
	// A later transaction commits first, so the newest finished transaction at the first
	// read is younger than the one still open.
	if _, err := o.watch.Exec(ctx, `UPDATE agents SET cpu_used = 1 WHERE id = 'a2'`); err != nil {
		t.Fatal(err)
	}

	before, err := o.st.AgentsChangedSince(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if !before.Full || len(before.Agents) != 2 || before.Cursor == "" {
		t.Fatalf("first read: full %v, %d agents, cursor %q; want both agents and a cursor", before.Full, len(before.Agents), before.Cursor)
	}
	for _, a := range before.Agents {
		if a.CPUUsed == 7 {
			t.Fatalf("the first read saw an uncommitted write: %+v", a)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A transaction that starts and commits after the first read, for a2.
	if _, err := o.other.Exec(ctx, `UPDATE agents SET cpu_used = 9 WHERE id = 'a2'`); err != nil {
		t.Fatal(err)
	}

	after, err := o.st.AgentsChangedSince(ctx, before.Cursor)
	if err != nil {
		t.Fatal(err)
	}
	if after.Full {
		t.Fatalf("a read since the store's own cursor was whole; want only the changes")
	}
	got := map[string]berth.Agent{}
	for _, a := range after.Agents {
		got[a.AgentID] = a
	}
	if got["a1"].CPUUsed != 7 {
		t.Errorf("the read since the cursor misses a1's write, begun before the first read and committed after it: %+v", after.Agents)
	}
	if got["a2"].CPUUsed != 9 {
		t.Errorf("the read since the cursor misses a2's write, made after the first read: %+v", after.Agents)
	}

	// Nothing written since: the next read holds neither agent. (The tests of this package
	// run one at a time on a cluster of their own, so no other transaction holds the
	// cursor back.)
	quiet, err := o.st.AgentsChangedSince(ctx, after.Cursor)
	if err != nil {
		t.Fatal(err)
	}
	if quiet.Full || len(quiet.Agents) != 0 {
		t.Errorf("a read with nothing written since the last: full %v, %d agents; want none", quiet.Full, len(quiet.Agents))
	}
}

// TestAgentsChangedSinceForeignCursorsReadAll: a cursor that is not this database's own gets a
// whole read, not an empty "nothing changed" that would keep every agent as it was: one ahead
// of the database (restored from a dump under a running replica), one of another server or
// database (a switchover, whose transaction ids may well be lower), a position that is not
// positive (PostgreSQL would wrap a negative one onto a real id), and malformed ones.
func TestAgentsChangedSinceForeignCursorsReadAll(t *testing.T) {
	o := newOneTrip(t, 4096)
	ctx := t.Context()
	first, err := o.st.AgentsChangedSince(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(first.Cursor, '/')
	if i < 0 {
		t.Fatalf("cursor %q has no identity", first.Cursor)
	}
	id, pos := first.Cursor[:i], first.Cursor[i+1:]
	n, err := strconv.ParseInt(pos, 10, 64)
	if err != nil {
		t.Fatalf("cursor %q: %v", first.Cursor, err)
	}
	for _, c := range []struct{ what, cursor string }{
		{"ahead of the database", fmt.Sprintf("%s/%d", id, n+1_000_000)},
		{"another server's", "2001-01-01 00:00:00+00 12345/" + pos},
		{"another database's", id + "9/" + pos},
		{"negative", fmt.Sprintf("%s/%d", id, n-(1<<32))},
		{"zero", id + "/0"},
		{"no position", id + "/"},
		{"no identity", pos},
	} {
		got, err := o.st.AgentsChangedSince(ctx, c.cursor)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Full || len(got.Agents) != 2 {
			t.Errorf("a cursor %s (%q): full %v, %d agents; want a whole read of both", c.what, c.cursor, got.Full, len(got.Agents))
		}
	}
	own, err := o.st.AgentsChangedSince(ctx, first.Cursor)
	if err != nil {
		t.Fatal(err)
	}
	if own.Full {
		t.Errorf("the store's own cursor %q got a whole read", first.Cursor)
	}
}
