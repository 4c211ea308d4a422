package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/server"
	"github.com/berth-dev/berth/store/sqlite"
)

// heartbeatTap stands in front of a real server and keeps every heartbeat body the agent
// posts. answer, when set, replaces the server's answer to the next heartbeat after the
// server handled it (a lost answer, or a server of the previous release's 204).
type heartbeatTap struct {
	next http.Handler

	mu     sync.Mutex
	bodies []berth.Heartbeat
	answer int
}

func (h *heartbeatTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/agents/heartbeat" {
		h.next.ServeHTTP(w, r)
		return
	}
	b, _ := io.ReadAll(r.Body)
	var hb berth.Heartbeat
	_ = json.Unmarshal(b, &hb)
	r.Body = io.NopCloser(bytes.NewReader(b))
	h.mu.Lock()
	h.bodies = append(h.bodies, hb)
	answer := h.answer
	h.answer = 0
	h.mu.Unlock()
	if answer == 0 {
		h.next.ServeHTTP(w, r)
		return
	}
	h.next.ServeHTTP(httptest.NewRecorder(), r) // the server applies it; the agent never hears
	w.WriteHeader(answer)
}

// take returns the bodies posted since the last take.
func (h *heartbeatTap) take() []berth.Heartbeat {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.bodies
	h.bodies = nil
	return out
}

// newDeltaServer starts a real server on SQLite behind a heartbeatTap on 127.0.0.1.
func newDeltaServer(t *testing.T) (*heartbeatTap, *httptest.Server, berth.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := server.DefaultConfig()
	cfg.NodeToken = "node-token"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	tap := &heartbeatTap{next: server.New(cfg, st).Handler()}
	srv := httptest.NewServer(tap)
	t.Cleanup(srv.Close)
	return tap, srv, st
}

// heldIDs returns the ids the store lists as held by agent a1.
func heldIDs(t *testing.T, st berth.Store) []string {
	t.Helper()
	a, err := st.Agent(t.Context(), "a1")
	if err != nil {
		t.Fatalf("Agent(a1): %v", err)
	}
	var ids []string
	for _, h := range a.Sandboxes {
		ids = append(ids, h.ID)
	}
	return ids
}

// TestHeartbeat_DeltasAgainstWhatTheServerAcknowledged (issue 16, goal 2): the first heartbeat
// of a boot lists everything; once the server acknowledges it, heartbeats list only what
// changed (an unchanged host sends no sandbox at all); after a lost answer, or an answer
// without an acknowledgment (a server of the previous release), the next is the whole list.
func TestHeartbeat_DeltasAgainstWhatTheServerAcknowledged(t *testing.T) {
	tap, srv, st := newDeltaServer(t)
	rt := &fakeRuntime{resident: map[string]int64{}}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
	a.cfg.ServerURL, a.cfg.NodeToken = srv.URL, "node-token"
	ctx := t.Context()
	for _, id := range []string{"s1", "s2"} {
		if err := create(a, id, 256); err != nil {
			t.Fatal(err)
		}
	}
	kinds := func(hbs []berth.Heartbeat) []string {
		var out []string
		for _, hb := range hbs {
			k := "whole"
			if hb.Delta {
				k = "delta"
			}
			out = append(out, k)
		}
		return out
	}

	a.sendHeartbeat(ctx)
	if got := tap.take(); !slices.Equal(kinds(got), []string{"whole"}) || len(got[0].Sandboxes) != 2 {
		t.Fatalf("first heartbeat of the boot: %v; want the whole list of 2", got)
	}
	a.sendHeartbeat(ctx)
	got := tap.take()
	if !slices.Equal(kinds(got), []string{"delta"}) || len(got[0].Sandboxes) != 0 || len(got[0].Removed) != 0 || got[0].BaseSeq != 1 {
		t.Fatalf("heartbeat of an unchanged host: %+v; want a delta on seq 1 listing nothing", got)
	}
	if ids := heldIDs(t, st); !slices.Equal(ids, []string{"s1", "s2"}) {
		t.Fatalf("store holds %v after an empty delta; want [s1 s2]", ids)
	}

	if err := create(a, "s3", 256); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	a.sendHeartbeat(ctx)
	got = tap.take()
	if len(got) != 1 || !got[0].Delta || len(got[0].Sandboxes) != 1 || got[0].Sandboxes[0].ID != "s3" ||
		!slices.Equal(got[0].Removed, []string{"s1"}) {
		t.Fatalf("after s3 came and s1 went: %+v; want a delta listing s3, removing s1", got)
	}
	if ids := heldIDs(t, st); !slices.Equal(ids, []string{"s2", "s3"}) {
		t.Fatalf("store holds %v; want [s2 s3]", ids)
	}

	// The server applies a heartbeat but its answer is lost: the agent cannot know which
	// base the server holds, so its next heartbeat is the whole list.
	tap.answer = http.StatusBadGateway
	if err := create(a, "s4", 256); err != nil {
		t.Fatal(err)
	}
	a.sendHeartbeat(ctx)
	if got := tap.take(); !slices.Equal(kinds(got), []string{"delta"}) {
		t.Fatalf("the heartbeat whose answer is lost: %v", kinds(got))
	}
	if err := a.Delete(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	a.sendHeartbeat(ctx)
	if got := tap.take(); !slices.Equal(kinds(got), []string{"whole"}) {
		// after a failed answer the agent no longer trusts its base: whole list
		t.Fatalf("after a lost answer: %v; want a whole list", kinds(got))
	}
	if ids := heldIDs(t, st); !slices.Equal(ids, []string{"s3", "s4"}) {
		t.Fatalf("store holds %v; want [s3 s4]", ids)
	}

	// A server of the previous release answers 204 without a body: no base, whole lists.
	tap.answer = http.StatusNoContent
	a.sendHeartbeat(ctx)
	a.sendHeartbeat(ctx)
	if got := tap.take(); !slices.Equal(kinds(got), []string{"delta", "whole"}) {
		t.Fatalf("after a 204 without acknowledgment: %v; want the delta then a whole list", kinds(got))
	}
}

// TestHeartbeat_ResyncWhenTheServerLostTheBase: a delta whose base the server does not hold
// (here: its answer was lost after the agent had already moved on) is answered resync, and
// the agent sends its whole list at once, so the store never keeps a wrong held list.
func TestHeartbeat_ResyncWhenTheServerLostTheBase(t *testing.T) {
	tap, srv, st := newDeltaServer(t)
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, &fakeRuntime{resident: map[string]int64{}})
	a.cfg.ServerURL, a.cfg.NodeToken = srv.URL, "node-token"
	ctx := t.Context()
	if err := create(a, "s1", 256); err != nil {
		t.Fatal(err)
	}
	a.sendHeartbeat(ctx) // whole, acknowledged: base seq 1
	// A heartbeat reaches the server outside this agent's sight (say, a retried POST of a
	// stale copy of its state that a proxy replayed): the server now holds seq 2's list.
	hb := a.Heartbeat(time.Now())
	hb.Sandboxes = nil
	if _, err := st.RecordHeartbeat(ctx, hb, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	tap.take()
	a.sendHeartbeat(ctx)
	got := tap.take()
	if len(got) != 2 || !got[0].Delta || got[1].Delta {
		t.Fatalf("bodies: %+v; want a delta answered resync, then the whole list", got)
	}
	if ids := heldIDs(t, st); !slices.Equal(ids, []string{"s1"}) {
		t.Fatalf("store holds %v; want [s1]", ids)
	}
}

// TestHeartbeat_ResidentSlack: a working-set change below max(16 MiB, 1/16) is not sent on
// its own, one above is, and drift adds up against what the server holds, not against the
// previous reading. The host's totals are exact in every heartbeat.
func TestHeartbeat_ResidentSlack(t *testing.T) {
	var b heartbeatBase
	full := berth.Heartbeat{Seq: 1, MemoryMiBUsed: 100, Sandboxes: []berth.HeldSandbox{{ID: "s1", ResidentMiB: 100, Measured: true}}}
	b.acked(full, b.next(full), berth.HeartbeatAck{Seq: 1}, nil)
	for i, resident := range []int64{110, 115, 116} {
		full = berth.Heartbeat{Seq: int64(i + 2), MemoryMiBUsed: resident,
			Sandboxes: []berth.HeldSandbox{{ID: "s1", ResidentMiB: resident, Measured: true}}}
		hb := b.next(full)
		want := resident-100 >= 16
		if !hb.Delta || (len(hb.Sandboxes) == 1) != want || hb.MemoryMiBUsed != resident {
			t.Fatalf("resident 100 → %d: %+v; want a delta, sandbox listed %v, used exact", resident, hb, want)
		}
		b.acked(full, hb, berth.HeartbeatAck{Seq: hb.Seq}, nil)
	}
}
