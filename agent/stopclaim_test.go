package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// opsRuntime is fakeRuntime that logs each start and stop in the order they took effect,
// with hooks around them.
type opsRuntime struct {
	*fakeRuntime
	omu  sync.Mutex
	ops  []string
	stop func(n int, id string) error // called for the n-th Stop (from 1); its answer is Stop's
	nst  int
}

func (o *opsRuntime) note(s string) { o.omu.Lock(); o.ops = append(o.ops, s); o.omu.Unlock() }
func (o *opsRuntime) lastOp() string {
	o.omu.Lock()
	defer o.omu.Unlock()
	if len(o.ops) == 0 {
		return ""
	}
	return o.ops[len(o.ops)-1]
}
func (o *opsRuntime) Start(ctx context.Context, s Spec) error {
	err := o.fakeRuntime.Start(ctx, s)
	if err == nil {
		o.note("start " + s.ID)
	}
	return err
}
func (o *opsRuntime) Stop(ctx context.Context, id string) error {
	o.omu.Lock()
	o.nst++
	n := o.nst
	o.omu.Unlock()
	_ = o.fakeRuntime.Stop(ctx, id)
	o.note("stop " + id)
	if o.stop != nil {
		return o.stop(n, id)
	}
	return nil
}

// TestDeleteDuringStartLeavesNoUnbookedGuest (an attack): a delete of a copy still starting finds nothing to stop (the runtime has not made
// the guest yet) and returns; the start then completes before the delete takes the copy off
// the books, so Create marks it started and answers success — and the delete removes the
// booking. The guest runs with nothing booked for it: unlisted, no TTL.
func TestDeleteDuringStartLeavesNoUnbookedGuest(t *testing.T) {
	starting, releaseStart := make(chan struct{}), make(chan struct{})
	fr := &fakeRuntime{start: func(id string) error { close(starting); <-releaseStart; return nil }}
	stopRan, createDone := make(chan struct{}), make(chan struct{})
	rt := &opsRuntime{fakeRuntime: fr}
	rt.stop = func(n int, id string) error {
		if n == 1 { // the delete's stop: done (nothing ran yet); its caller is slow to take the lock
			close(stopRan)
			<-createDone
		}
		return nil
	}
	a := newAgentOn(t, berth.AdmissionCommitted, 4096, rt, nil)
	created := make(chan error, 1)
	go func() { created <- create(a, "s1", 512); close(createDone) }()
	<-starting
	deleted := make(chan error, 1)
	go func() { deleted <- a.Delete(context.Background(), "s1") }()
	<-stopRan
	close(releaseStart)
	cerr := <-created
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	listed := incarnationOf(a, "s1") != 0
	t.Logf("create: %v; listed: %v; runtime ops: %v", cerr, listed, rt.ops)
	if !listed && rt.lastOp() == "start s1" {
		t.Fatalf("guest s1 runs (last runtime op %q) with no booking; the create answered %v", rt.lastOp(), cerr)
	}
}

// TestAFailedStartKeepsAClaimedCopyBooked (an attack): a create whose start fails takes its copy off the books even while a delete has
// claimed it and its runtime stop is still in flight; a new create of the id is then booked
// under that stop (the doc says it is refused), and the predecessor's stop lands on the new
// copy's guest, which stays booked with no guest running.
func TestAFailedStartKeepsAClaimedCopyBooked(t *testing.T) {
	var startN int
	starting, releaseStart := make(chan struct{}), make(chan struct{})
	fr := &fakeRuntime{start: func(id string) error {
		startN++
		if startN == 1 {
			close(starting)
			<-releaseStart
			return errors.New("boom")
		}
		return nil
	}}
	stopIn, releaseStop := make(chan struct{}), make(chan struct{})
	rt := &opsRuntime{fakeRuntime: fr}
	var stopN atomic.Int32
	fr.stopping = func(id string) {
		if stopN.Add(1) == 1 {
			close(stopIn)
			<-releaseStop
		}
	}
	a := newAgentOn(t, berth.AdmissionCommitted, 4096, rt, nil)
	first := make(chan error, 1)
	go func() { first <- create(a, "s1", 512) }()
	<-starting
	deleted := make(chan error, 1)
	go func() { deleted <- a.Delete(context.Background(), "s1") }()
	<-stopIn
	close(releaseStart)
	<-first
	second := create(a, "s1", 512) // the delete's stop is still in flight
	close(releaseStop)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	t.Logf("second create: %v; listed incarnation %d; runtime ops %v", second, incarnationOf(a, "s1"), rt.ops)
	if second == nil {
		t.Errorf("a create was booked while a delete's stop of the id was in flight")
	}
	if incarnationOf(a, "s1") != 0 && rt.lastOp() == "stop s1" {
		t.Fatalf("the new copy is booked (incarnation %d) but the predecessor's stop came after its start: ops %v",
			incarnationOf(a, "s1"), rt.ops)
	}
}

// TestAWaitingDeleteGetsItsOwnStopsAnswer (an attack): a delete waiting on another's stop
// gets that stop's answer, not the copy's latest: when the stop failed and the agent's own end
// (its TTL) claimed the copy before the waiter read, the waiter read the new claim's empty
// answer and said 204 while the copy was still booked and running.
func TestAWaitingDeleteGetsItsOwnStopsAnswer(t *testing.T) {
	rt := &opsRuntime{fakeRuntime: &fakeRuntime{}}
	rt.stop = func(n int, id string) error { return berth.Errorf(berth.EInternal, "runtime stop failed") }
	a := newAgentOn(t, berth.AdmissionCommitted, 4096, rt, nil)
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a.mu.Lock()
	g := a.guests["s1"]
	claimLocked(g, "deleted") // the first delete's stop
	first := g.claim
	a.mu.Unlock()
	if err := a.stopClaimed(ctx, "s1", g); err == nil {
		t.Fatal("the first stop succeeded; want it failed")
	}
	a.mu.Lock()
	claimLocked(g, "stopped (ttl)") // the agent's end claims it before the waiter reads
	a.mu.Unlock()
	if err := a.awaitStop(ctx, "s1", first); err == nil {
		t.Fatal("a delete waiting on a stop that failed answered nil; want that stop's error")
	}
}

// ckptFailRuntime can checkpoint, but its checkpoint fails with the guest reading exited,
// and its stop fails while failStop is set.
type ckptFailRuntime struct {
	*orderRuntime
	mu       sync.Mutex
	failStop bool
}

func (c *ckptFailRuntime) Checkpoint(ctx context.Context, id, dir string) error {
	c.fakeRuntime.mu.Lock()
	c.fakeRuntime.exited = map[string]bool{id: true}
	c.fakeRuntime.mu.Unlock()
	return errors.New("runsc checkpoint failed")
}
func (c *ckptFailRuntime) Stop(ctx context.Context, id string) error {
	_ = c.orderRuntime.Stop(ctx, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failStop {
		return berth.Errorf(berth.EInternal, "runsc kill: timed out")
	}
	return nil
}

// TestAFailedCheckpointsFailedStopWedgesNothing (an attack): a checkpoint fails and the guest reads dead, so the agent ends it; that end's stop
// fails. The copy stays booked — but still marked checkpointing, for good: no TTL or exit is
// ever acted on again (measureOnce skips it), no eviction, a second checkpoint is a conflict,
// and every stale stop (DELETE ?incarnation) is 409 forever.
func TestAFailedCheckpointsFailedStopWedgesNothing(t *testing.T) {
	rt := &ckptFailRuntime{orderRuntime: &orderRuntime{fakeRuntime: &fakeRuntime{}}, failStop: true}
	a := newCkptAgent(t, rt)
	ctx := context.Background()
	if err := a.Create(ctx, berth.AgentCreate{ID: "s1", MemoryMiB: 256, TTLMS: 1000}); err != nil {
		t.Fatal(err)
	}
	inc := incarnationOf(a, "s1")
	if _, err := a.Checkpoint(ctx, "s1", "s1/1"); berth.ErrorCode(err) != berth.ESandboxNotFound {
		t.Fatalf("checkpoint: %v", err)
	}
	rt.mu.Lock()
	rt.failStop = false // the runtime recovers
	rt.mu.Unlock()
	a.measureOnce(ctx, time.Now().Add(time.Hour)) // past its TTL, and it reads exited
	a.measureOnce(ctx, time.Now().Add(2*time.Hour))
	derr := a.DeleteIncarnation(ctx, "s1", a.bootID, inc)
	ended := a.Heartbeat(time.Now()).Ended
	t.Logf("listed incarnation %d; ended %+v; stale stop: %v", incarnationOf(a, "s1"), ended, derr)
	if incarnationOf(a, "s1") != 0 {
		t.Fatalf("copy still booked an hour past its TTL, dead, never reported ended; its stale stop answers %v", derr)
	}
}
