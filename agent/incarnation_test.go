package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// incarnationOf is the incarnation a's heartbeat lists for id (0 when not listed).
func incarnationOf(a *Agent, id string) int64 {
	for _, h := range a.Heartbeat(time.Now()).Sandboxes {
		if h.ID == id {
			return h.Incarnation
		}
	}
	return 0
}

// stops is how many times rt was told to stop id.
func (f *fakeRuntime) stops(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.stopped {
		if s == id {
			n++
		}
	}
	return n
}

// TestAGT6_AStaleCopyIsStoppedByItsIncarnationOnly: a server that finds a copy stale (its
// sandbox placed on another host, or paused) stops it with the incarnation the heartbeat
// listed. A create that re-confirms the copy meanwhile — a resume that landed on it — gives it
// a new incarnation, so that stop, still on its way, spares it; the stop of the current
// incarnation stops it; a copy not held is no error and stops nothing; and a copy being
// stopped cannot be re-confirmed (conflict: the resume goes to another host instead of
// answering for a guest about to go).
func TestAGT6_AStaleCopyIsStoppedByItsIncarnationOnly(t *testing.T) {
	rt := &fakeRuntime{}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
	ctx := context.Background()
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	if err := create(a, "s2", 512); err != nil {
		t.Fatal(err)
	}
	first, other := incarnationOf(a, "s1"), incarnationOf(a, "s2")
	if first <= 0 || other <= 0 || first == other {
		t.Fatalf("incarnations listed: s1 %d, s2 %d; want two different positive numbers", first, other)
	}
	// The resume lands on the copy before the stale stop arrives.
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	again := incarnationOf(a, "s1")
	if again == first || again <= 0 {
		t.Fatalf("a re-confirmed copy kept incarnation %d (was %d); want a new one", again, first)
	}
	if err := a.DeleteIncarnation(ctx, "s1", first); berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("stop of the old incarnation: %v; want conflict", err)
	}
	if incarnationOf(a, "s1") != again || rt.stops("s1") != 0 {
		t.Fatalf("the re-confirmed copy was stopped (runtime stops %d)", rt.stops("s1"))
	}
	if err := a.DeleteIncarnation(ctx, "s1", again); err != nil {
		t.Fatal(err)
	}
	if incarnationOf(a, "s1") != 0 || rt.stops("s1") != 1 {
		t.Fatalf("the stale incarnation is still held, or the runtime stopped it %d times; want gone, once", rt.stops("s1"))
	}
	if err := a.DeleteIncarnation(ctx, "s1", again); err != nil || rt.stops("s1") != 1 {
		t.Fatalf("stop of a copy not held: %v, runtime stops %d; want nil and none", err, rt.stops("s1"))
	}
	// A new copy of the same id is a new incarnation, never one a server saw before.
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	if n := incarnationOf(a, "s1"); n == first || n == again || n == other {
		t.Fatalf("a new copy reuses incarnation %d", n)
	}

	// A create for s2 while it is being stopped: conflict, and it stays stopped.
	stopping, release := make(chan struct{}), make(chan struct{})
	rt.stopping = func(id string) {
		if id == "s2" {
			close(stopping)
			<-release
		}
	}
	done := make(chan error, 1)
	go func() { done <- a.DeleteIncarnation(ctx, "s2", other) }()
	<-stopping
	if err := create(a, "s2", 512); berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("create of a copy being stopped: %v; want conflict", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if incarnationOf(a, "s2") != 0 {
		t.Fatal("s2 is still held after its stop")
	}
}

// TestAGT6_DeleteIncarnationOverHTTP: DELETE …?incarnation=N answers 409 for another
// incarnation and 204 for its own; an incarnation that is not a positive integer is 400
// invalid_request, and nothing is stopped.
func TestAGT6_DeleteIncarnationOverHTTP(t *testing.T) {
	rt := &fakeRuntime{}
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, rt)
	a.cfg.NodeToken = testToken
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	hdr := http.Header{berth.HeaderNodeToken: {testToken}}
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	inc := incarnationOf(a, "s1")
	for _, q := range []string{"abc", "0", "-1", "", "1.5", "99999999999999999999"} {
		if code, body := call(t, http.MethodDelete, srv.URL+"/internal/sandboxes/s1?incarnation="+q, nil, hdr); code != http.StatusBadRequest {
			t.Errorf("incarnation=%q: %d %s; want 400", q, code, body)
		}
	}
	if code, body := call(t, http.MethodDelete, srv.URL+"/internal/sandboxes/s1?incarnation=999", nil, hdr); code != http.StatusConflict {
		t.Errorf("another incarnation: %d %s; want 409", code, body)
	}
	if rt.stops("s1") != 0 || incarnationOf(a, "s1") != inc {
		t.Fatalf("a refused delete stopped the copy")
	}
	url := srv.URL + "/internal/sandboxes/s1?incarnation=" + strconv.FormatInt(inc, 10)
	if code, body := call(t, http.MethodDelete, url, nil, hdr); code != http.StatusNoContent {
		t.Fatalf("its own incarnation: %d %s; want 204", code, body)
	}
	if rt.stops("s1") != 1 || slices.ContainsFunc(a.Heartbeat(time.Now()).Sandboxes, func(h berth.HeldSandbox) bool { return h.ID == "s1" }) {
		t.Fatal("its own incarnation was not stopped")
	}
}
