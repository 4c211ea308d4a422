package agent

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"

	"github.com/berth-dev/berth"
)

// orderRuntime is fakeRuntime that can checkpoint: it keeps the order of its stops,
// checkpoints and restores, and its Restore can be held (restoring, when set, is called
// inside it) or fail (restoreErr).
type orderRuntime struct {
	*fakeRuntime
	omu        sync.Mutex
	ops        []string
	restoring  func(id string)
	restoreErr error
	// checkpointed, when set, is called at the end of Checkpoint: the guest is saved and
	// stopped (gVisor has dropped it from its registry) and the agent uploads its image.
	checkpointed func(id string)
}

func (o *orderRuntime) note(op string) {
	o.omu.Lock()
	o.ops = append(o.ops, op)
	o.omu.Unlock()
}
func (o *orderRuntime) Stop(ctx context.Context, id string) error {
	err := o.fakeRuntime.Stop(ctx, id)
	o.note("stop " + id)
	return err
}
func (o *orderRuntime) Checkpoint(ctx context.Context, id, dir string) error {
	o.note("checkpoint " + id)
	if o.checkpointed != nil {
		o.checkpointed(id)
	}
	return nil
}
func (o *orderRuntime) Restore(ctx context.Context, s Spec, dir string) error {
	if o.restoring != nil {
		o.restoring(s.ID)
	}
	o.note("restore " + s.ID)
	return o.restoreErr
}
func (o *orderRuntime) Ping(ctx context.Context, id string) error { return nil }
func (o *orderRuntime) last() string {
	o.omu.Lock()
	defer o.omu.Unlock()
	return o.ops[len(o.ops)-1]
}

// newCkptAgent is an agent on rt (a runtime that can checkpoint) with a snapshot store in a
// temporary directory.
func newCkptAgent(t *testing.T, rt Runtime) *Agent {
	t.Helper()
	bucket, err := blob.OpenBucket(context.Background(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bucket.Close() })
	return newAgentOn(t, berth.AdmissionCommitted, 4096, rt, func(c *Config) {
		c.NodeToken, c.SnapshotStore, c.SnapshotDir = "node-token", bucket, t.TempDir()
	})
}

// failingStop is fakeRuntime whose Stop fails once ctx is done: a runtime's stop cut short.
type failingStop struct {
	*fakeRuntime
}

func (f *failingStop) Stop(ctx context.Context, id string) error {
	_ = f.fakeRuntime.Stop(ctx, id)
	if ctx.Err() != nil {
		return berth.Errorf(berth.EInternal, "stop %s: %v", id, ctx.Err())
	}
	return nil
}

// checkpointInUpload starts a checkpoint of s1 on a whose upload fails (its caller is gone,
// so the guest is restored here) and returns once the guest is saved and stopped, with
// release to let the checkpoint go on and done for its answer.
func checkpointInUpload(t *testing.T, a *Agent, rt *orderRuntime) (release chan struct{}, done chan error) {
	t.Helper()
	saved := make(chan struct{})
	release, done = make(chan struct{}), make(chan error, 1)
	rt.checkpointed = func(id string) {
		close(saved)
		<-release
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	go func() {
		_, err := a.Checkpoint(gone, "s1", "s1/1")
		done <- err
	}()
	<-saved
	return release, done
}

// TestAGT6_AStaleStopWaitsOutACheckpoint (an attack): a stale stop that reaches a copy while
// it is being checkpointed — the very case it is for: a pause whose answer was lost, recorded
// paused, while the agent's upload fails and it restores the guest — is refused (conflict),
// and the copy the checkpoint restores stays booked and listed, so the next stop finds it.
// Before, the stop took the copy off the books mid-upload and the checkpoint then restored a
// guest nothing held: unlisted, no TTL, never stopped.
func TestAGT6_AStaleStopWaitsOutACheckpoint(t *testing.T) {
	rt := &orderRuntime{fakeRuntime: &fakeRuntime{}}
	a := newCkptAgent(t, rt)
	if err := create(a, "s1", 256); err != nil {
		t.Fatal(err)
	}
	inc := incarnationOf(a, "s1")
	release, done := checkpointInUpload(t, a, rt)
	if err := a.DeleteIncarnation(context.Background(), "s1", a.bootID, inc); berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("stale stop during the checkpoint: %v; want conflict", err)
	}
	close(release)
	if err := <-done; berth.ErrorCode(err) != berth.EUnavailable {
		t.Fatalf("checkpoint whose upload failed: %v; want unavailable (restored, runs on)", err)
	}
	if incarnationOf(a, "s1") != inc || rt.last() != "restore s1" {
		t.Fatalf("after the checkpoint: listed incarnation %d (want %d), runtime ops %v", incarnationOf(a, "s1"), inc, rt.ops)
	}
	if err := a.DeleteIncarnation(context.Background(), "s1", a.bootID, inc); err != nil {
		t.Fatal(err)
	}
	if incarnationOf(a, "s1") != 0 || rt.last() != "stop s1" {
		t.Fatalf("the next stale stop: listed incarnation %d, runtime ops %v; want stopped", incarnationOf(a, "s1"), rt.ops)
	}
}

// TestCheckpointOfACopyDeletedDuringItsUpload (an attack): a delete during a checkpoint's
// upload takes the copy off the books; when the upload then fails, the checkpoint does not
// restore the deleted guest, and it reports nothing ended — not even when a new copy of the
// id was booked meanwhile, whose row a report of the id would end. Before, the guest was
// restored with nothing booked for it, or (its restore failing) the new copy's row was ended.
func TestCheckpointOfACopyDeletedDuringItsUpload(t *testing.T) {
	rt := &orderRuntime{fakeRuntime: &fakeRuntime{}}
	a := newCkptAgent(t, rt)
	if err := create(a, "s1", 256); err != nil {
		t.Fatal(err)
	}
	release, done := checkpointInUpload(t, a, rt)
	if err := a.Delete(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if err := create(a, "s1", 256); err != nil {
		t.Fatalf("the next copy: %v", err)
	}
	next := incarnationOf(a, "s1")
	close(release)
	if err := <-done; berth.ErrorCode(err) != berth.ESandboxNotFound {
		t.Fatalf("checkpoint of a deleted copy: %v; want sandbox_not_found", err)
	}
	if slices.Contains(rt.ops, "restore s1") {
		t.Fatalf("the deleted copy was restored: runtime ops %v", rt.ops)
	}
	if incarnationOf(a, "s1") != next || next == 0 {
		t.Fatalf("the next copy is no longer held (incarnation %d, was %d)", incarnationOf(a, "s1"), next)
	}
	for _, e := range a.Heartbeat(time.Now()).Ended {
		if e.ID == "s1" {
			t.Fatalf("the heartbeat reports s1 ended (%s: %s) while it holds its next copy", e.State, e.Reason)
		}
	}
}

// TestDeleteSentTwiceAnswersOnceTheCopyIsStopped (an attack): a delete that finds its copy
// being stopped by another waits for that stop's answer, and when it failed (its caller went
// away mid-stop) stops the copy itself: it never answers 204 for a copy still booked and
// running. Before, the second answered at once, the first failed, and the copy ran on while
// the tenant's retried DELETE had been told it was gone.
func TestDeleteSentTwiceAnswersOnceTheCopyIsStopped(t *testing.T) {
	rt := &fakeRuntime{}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	stopping, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rt.stopping = func(id string) {
		once.Do(func() {
			close(stopping)
			<-release
		})
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	a.rt = &failingStop{fakeRuntime: rt}
	first := make(chan error, 1)
	go func() { first <- a.Delete(ctx1, "s1") }()
	<-stopping
	second := make(chan error, 1)
	go func() { second <- a.Delete(context.Background(), "s1") }() // the tenant retries its DELETE
	cancel1()
	close(release)
	if err := <-first; err == nil {
		t.Fatal("the first delete, its caller gone mid-stop, answered nil")
	}
	if err := <-second; err != nil || incarnationOf(a, "s1") != 0 {
		t.Fatalf("the second delete: %v, still listed: %v; want nil and the copy stopped", err, incarnationOf(a, "s1") != 0)
	}
}

// TestAGT6_ARestoreNeverLandsOnACopy (an attack): a restore placed on an agent that still
// holds a copy of the sandbox (left from a checkpoint whose answer was lost) is refused
// (conflict: the placement goes on to another host, and AGT-6 stops the copy). Adopting the
// copy kept its first booking's TTL — the agent ended the resumed sandbox early — and its
// state past the image the tenant paused. A plain create that re-confirms a copy takes the
// create's TTL.
func TestAGT6_ARestoreNeverLandsOnACopy(t *testing.T) {
	rt := &fakeRuntime{}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
	ctx := context.Background()
	first := time.Now()
	if err := a.Create(ctx, berth.AgentCreate{ID: "s1", MemoryMiB: 512, TTLMS: 60_000}); err != nil {
		t.Fatal(err)
	}
	inc := incarnationOf(a, "s1")
	err := a.Create(ctx, berth.AgentCreate{ID: "s1", MemoryMiB: 512, TTLMS: 61 * 60_000, RestoreImage: "s1/1"})
	if berth.ErrorCode(err) != berth.EConflict || incarnationOf(a, "s1") != inc {
		t.Fatalf("a restore onto a copy: %v, incarnation %d (was %d); want conflict, the copy as it was", err, incarnationOf(a, "s1"), inc)
	}
	if err := a.Create(ctx, berth.AgentCreate{ID: "s1", MemoryMiB: 512, TTLMS: 61 * 60_000}); err != nil {
		t.Fatal(err)
	}
	a.measureOnce(ctx, first.Add(2*time.Minute)) // inside the re-confirming create's TTL
	for _, e := range a.Heartbeat(time.Now()).Ended {
		if e.ID == "s1" {
			t.Fatalf("the re-confirmed copy was ended (%s, %s) at minute 2 of the 61 its create asked for", e.State, e.Reason)
		}
	}
}
