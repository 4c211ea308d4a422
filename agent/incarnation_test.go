package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	if err := a.DeleteIncarnation(ctx, "s1", a.bootID, first); berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("stop of the old incarnation: %v; want conflict", err)
	}
	if incarnationOf(a, "s1") != again || rt.stops("s1") != 0 {
		t.Fatalf("the re-confirmed copy was stopped (runtime stops %d)", rt.stops("s1"))
	}
	if err := a.DeleteIncarnation(ctx, "s1", a.bootID, again); err != nil {
		t.Fatal(err)
	}
	if incarnationOf(a, "s1") != 0 || rt.stops("s1") != 1 {
		t.Fatalf("the stale incarnation is still held, or the runtime stopped it %d times; want gone, once", rt.stops("s1"))
	}
	if err := a.DeleteIncarnation(ctx, "s1", a.bootID, again); err != nil || rt.stops("s1") != 1 {
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
	go func() { done <- a.DeleteIncarnation(ctx, "s2", a.bootID, other) }()
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

// TestAGT6_AStaleStopOfAnotherBootStopsNothing (an attack): incarnations are numbered anew
// with each boot, so a stale stop checked against one boot's list and arriving after the agent
// restarted — where a resume may have booked the same id as incarnation 1 again — is refused
// (conflict) and stops nothing. Without the boot in the stop, the new boot's resumed copy was
// stopped and its row, running there, lost.
func TestAGT6_AStaleStopOfAnotherBootStopsNothing(t *testing.T) {
	rt := &fakeRuntime{}
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, rt)
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	inc := incarnationOf(a, "s1")
	if err := a.DeleteIncarnation(context.Background(), "s1", "an-earlier-boot", inc); berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("stop of incarnation %d of another boot: %v; want conflict", inc, err)
	}
	if rt.stops("s1") != 0 || incarnationOf(a, "s1") != inc {
		t.Fatal("a stop meant for another boot stopped this boot's copy")
	}
}

// TestAGT6_AStaleStopSentTwiceSparesTheNextCopy (an attack): a stale stop sent again while
// the first is still stopping the copy (the server gave up waiting on a slow runtime stop)
// waits for the first's answer, and a create of the id meanwhile is refused, so no new copy
// is booked under a stop in flight. Before, the second stop forgot the copy, a resume booked a
// new one, and the first stop, returning, took the new copy off the books: it ran on with no
// TTL, unlisted, its row later lost.
func TestAGT6_AStaleStopSentTwiceSparesTheNextCopy(t *testing.T) {
	rt := &fakeRuntime{}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
	ctx := context.Background()
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	stale := incarnationOf(a, "s1")
	stopping, release := make(chan struct{}), make(chan struct{})
	rt.stopping = func(id string) {
		if id == "s1" && rt.stops("s1") == 0 {
			close(stopping)
			<-release
		}
	}
	done := make(chan error, 1)
	go func() { done <- a.DeleteIncarnation(ctx, "s1", a.bootID, stale) }()
	<-stopping
	again := make(chan error, 1)
	go func() { again <- a.DeleteIncarnation(ctx, "s1", a.bootID, stale) }() // waits for the first's answer
	if err := create(a, "s1", 512); berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("a create while the first stop runs: %v; want conflict", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-again; err != nil {
		t.Fatalf("the same stop again, sent while the first ran: %v; want nil, the first's answer", err)
	}
	if incarnationOf(a, "s1") != 0 || rt.stops("s1") != 1 {
		t.Fatalf("after the first stop: listed incarnation %d, runtime stops %d; want gone, stopped once", incarnationOf(a, "s1"), rt.stops("s1"))
	}
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	if n := incarnationOf(a, "s1"); n == 0 || n == stale {
		t.Fatalf("the next copy is incarnation %d; want a new one, booked", n)
	}
}

// TestAGT6_DeleteIncarnationOverHTTP: DELETE …?boot=B&incarnation=N answers 409 for another
// incarnation or boot and 204 for its own. A query that does not parse (url.Values would drop
// it, leaving a delete of any copy: an attack), a parameter given twice, an incarnation that
// is not a positive integer, or one without its boot is 400 invalid_request, and nothing is
// stopped.
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
	inc := strconv.FormatInt(incarnationOf(a, "s1"), 10)
	boot := "boot=" + url.QueryEscape(a.bootID)
	for _, q := range []string{boot + "&incarnation=abc", boot + "&incarnation=0", boot + "&incarnation=-1",
		boot + "&incarnation=", boot + "&incarnation=1.5", boot + "&incarnation=99999999999999999999",
		"incarnation=" + inc, boot, "boot=&incarnation=" + inc, boot + "&incarnation=%zz", boot + "&incarnation=" + inc + ";",
		boot + "&incarnation=9%", boot + "&incarnation=" + inc + "&incarnation=abc", boot + "&" + boot + "&incarnation=" + inc} {
		if code, body := call(t, http.MethodDelete, srv.URL+"/internal/sandboxes/s1?"+q, nil, hdr); code != http.StatusBadRequest {
			t.Errorf("?%s: %d %s; want 400", q, code, body)
		}
	}
	for _, q := range []string{boot + "&incarnation=999", "boot=other&incarnation=" + inc} {
		if code, body := call(t, http.MethodDelete, srv.URL+"/internal/sandboxes/s1?"+q, nil, hdr); code != http.StatusConflict {
			t.Errorf("?%s: %d %s; want 409", q, code, body)
		}
	}
	if rt.stops("s1") != 0 || incarnationOf(a, "s1") == 0 {
		t.Fatalf("a refused delete stopped the copy")
	}
	if code, body := call(t, http.MethodDelete, srv.URL+"/internal/sandboxes/s1?"+boot+"&incarnation="+inc, nil, hdr); code != http.StatusNoContent {
		t.Fatalf("its own incarnation: %d %s; want 204", code, body)
	}
	if rt.stops("s1") != 1 || slices.ContainsFunc(a.Heartbeat(time.Now()).Sandboxes, func(h berth.HeldSandbox) bool { return h.ID == "s1" }) {
		t.Fatal("its own incarnation was not stopped")
	}
}

// TestEndActsOnItsCopyOnly (found reviewing the attacks' fixes): the agent's own end of a
// copy — its TTL, its exit, an eviction, a failed checkpoint, each decided on a snapshot of the
// books — stops and reports that copy only. One deleted meanwhile, and a new copy of the id
// booked since, is neither stopped nor reported ended (the store would end the new copy's
// row). Before, end stopped and reported by id.
func TestEndActsOnItsCopyOnly(t *testing.T) {
	rt := &fakeRuntime{}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
	ctx := context.Background()
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	old := a.guests["s1"] // what the measure loop saw: past its TTL
	a.mu.Unlock()
	if err := a.Delete(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	next := incarnationOf(a, "s1")
	a.end(ctx, "s1", old, berth.SandboxStopped, "ttl", time.Now())
	if incarnationOf(a, "s1") != next || rt.stops("s1") != 1 {
		t.Fatalf("the old copy's end: listed incarnation %d (want %d), runtime stops %d (want the delete's 1)",
			incarnationOf(a, "s1"), next, rt.stops("s1"))
	}
	if ended := a.Heartbeat(time.Now()).Ended; len(ended) != 0 {
		t.Fatalf("the old copy's end reported %+v; want nothing: the new copy runs", ended)
	}
	a.mu.Lock()
	cur := a.guests["s1"]
	a.mu.Unlock()
	a.end(ctx, "s1", cur, berth.SandboxStopped, "ttl", time.Now())
	if ended := a.Heartbeat(time.Now()).Ended; len(ended) != 1 || ended[0].ID != "s1" || incarnationOf(a, "s1") != 0 {
		t.Fatalf("the current copy's end: reported %+v, still listed %v; want it ended", ended, incarnationOf(a, "s1") != 0)
	}
}
