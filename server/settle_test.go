package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/driver"
	_ "gocloud.dev/blob/fileblob"
	"gocloud.dev/gcerrors"

	"github.com/berth-dev/berth"
)

// TestPAUSE1_SweeperSettlesAbandonedCheckpoints: a replica that died in the middle of a
// pause, a snapshot move or a resume leaves its sandbox in pausing, snapshotting or
// resuming; once the grace passes, the sweeper settles each by what the agent and the
// snapshot store hold — still listed: running again; image stored: paused; neither: lost; a
// resume its agent never listed: paused again with its image.
func TestPAUSE1_SweeperSettlesAbandonedCheckpoints(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	bucket, err := blob.OpenBucket(context.Background(), "file://"+t.TempDir())
	must(t, err)
	t.Cleanup(func() { bucket.Close() })
	h := newHarnessWith(t, func(c *Config) {
		c.Clock, c.Snapshots, c.StartingGrace, c.PauseTimeout = clock, bucket, time.Minute, time.Minute
	})
	ctx := context.Background()
	a := newFakeAgent(t, "")
	put := func(id string, st berth.SandboxState, image string) {
		must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1",
			State: st, MemoryMiB: 512, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Image: image}, "test", now))
	}
	put("sb-held", berth.SandboxPausing, "sb-held/1")
	put("sb-stored", berth.SandboxSnapshotting, "sb-stored/1")
	put("sb-gone", berth.SandboxPausing, "sb-gone/1")
	put("sb-resume", berth.SandboxResuming, "sb-resume/1")
	must(t, bucket.WriteAll(ctx, "sb-stored/1/files.json", []byte(`{"files":[]}`), nil))
	_, err = h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive,
		IntakeOpen: true, HeartbeatAt: now, Sandboxes: []berth.HeldSandbox{{ID: "sb-held"}}}, now)
	must(t, err)

	now = now.Add(90 * time.Second) // past the resume's grace, not the checkpoints'
	h.s.settleCheckpoints(ctx)
	if sb, _ := h.st.Sandbox(ctx, "sb-held"); sb.State != berth.SandboxPausing {
		t.Fatalf("after 90 s sb-held is %s, want pausing", sb.State)
	}
	// The resume is paused again once its delete went out, in the delete's turn (sweepDelete).
	waitUntil(t, "the abandoned resume paused again", func() (bool, string) {
		sb, _ := h.st.Sandbox(ctx, "sb-resume")
		return sb.State == berth.SandboxPaused && a.deletes.Load() == 1, fmt.Sprintf("%s, %d deletes", sb.State, a.deletes.Load())
	})
	now = now.Add(2 * time.Minute)
	put("sb-young", berth.SandboxPausing, "") // entered just now: left alone
	h.s.settleCheckpoints(ctx)
	want := map[string]berth.SandboxState{"sb-held": berth.SandboxRunning, "sb-stored": berth.SandboxPaused,
		"sb-gone": berth.SandboxLost, "sb-resume": berth.SandboxPaused, "sb-young": berth.SandboxPausing}
	for id, st := range want {
		sb, err := h.st.Sandbox(ctx, id)
		if err != nil || sb.State != st {
			t.Fatalf("%s is %s (%s), %v; want %s", id, sb.State, sb.Reason, err, st)
		}
	}
	if sb, _ := h.st.Sandbox(ctx, "sb-resume"); sb.AgentID != "" || sb.Image != "sb-resume/1" || sb.PausedAt.IsZero() {
		t.Fatalf("resume settled as %+v; want paused on no host with its image", sb)
	}
	if a.deletes.Load() != 1 {
		t.Fatalf("agent told to stop %d sandboxes, want the abandoned resume's", a.deletes.Load())
	}
}

// TestPAUSE1_SettleStoredAndListed: a pause whose image is stored while its agent's list still
// names the sandbox is judged by when that list arrived. A list from before the checkpoint
// surely ended (the grace) may predate the guest's stop: the sweeper waits for the next one,
// and a next list without it means paused. A list that arrived after the grace and still
// names it means the upload failed after its file list landed and the agent restored the
// guest (found by an attack): running, the stale image dropped. An agent silent for
// StaleAfter past the grace: running, as for any listed sandbox.
func TestPAUSE1_SettleStoredAndListed(t *testing.T) {
	t0 := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	now := t0
	bucket, err := blob.OpenBucket(context.Background(), "file://"+t.TempDir())
	must(t, err)
	t.Cleanup(func() { bucket.Close() })
	h := newHarnessWith(t, func(c *Config) {
		c.Clock, c.Snapshots, c.StartingGrace, c.PauseTimeout, c.StaleAfter = func() time.Time { return now }, bucket,
			time.Minute, time.Minute, 30*time.Second
	})
	ctx := context.Background()
	a := newFakeAgent(t, "")
	beat := func(agent string, ids ...string) {
		t.Helper()
		hb := berth.Heartbeat{AgentID: agent, Address: a.srv.URL, Status: berth.AgentActive, IntakeOpen: true, HeartbeatAt: now}
		for _, id := range ids {
			hb.Sandboxes = append(hb.Sandboxes, berth.HeldSandbox{ID: id})
		}
		_, err := h.st.ApplyHeartbeat(ctx, hb, now)
		must(t, err)
	}
	for _, sb := range []struct{ id, agent string }{{"sb-stopped", "a1"}, {"sb-restored", "a1"}, {"sb-silent", "a2"}} {
		must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: sb.id, Template: "python", Tenant: "acme", AgentID: sb.agent,
			State: berth.SandboxPausing, MemoryMiB: 512, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Image: sb.id + "/1"}, "test", now))
		must(t, bucket.WriteAll(ctx, sb.id+"/1/files.json", []byte(`{"files":[]}`), nil))
	}
	beat("a1", "sb-stopped", "sb-restored")
	beat("a2", "sb-silent")
	check := func(when string, want map[string]berth.SandboxState) {
		t.Helper()
		h.s.settleCheckpoints(ctx)
		wantStates(t, h.st, when, want)
	}

	now = t0.Add(2*time.Minute + 5*time.Second) // past the grace; the lists are from before it
	check("lists from before the grace", map[string]berth.SandboxState{
		"sb-stopped": berth.SandboxPausing, "sb-restored": berth.SandboxPausing, "sb-silent": berth.SandboxPausing})
	now = t0.Add(2*time.Minute + 10*time.Second)
	beat("a1", "sb-restored") // sb-stopped's guest stopped; sb-restored's runs on
	check("a1's list after the grace", map[string]berth.SandboxState{
		"sb-stopped": berth.SandboxPaused, "sb-restored": berth.SandboxRunning, "sb-silent": berth.SandboxPausing})
	if ok, err := bucket.Exists(ctx, "sb-restored/1/files.json"); err != nil || ok {
		t.Errorf("the restored guest's stale image is still stored (%v); want it dropped", err)
	}
	now = t0.Add(2*time.Minute + 31*time.Second) // a2 silent for StaleAfter past the grace
	check("a2 silent past StaleAfter", map[string]berth.SandboxState{"sb-silent": berth.SandboxRunning})
}

// TestPAUSE1_AbandonedResumeWaitsForItsDelete: a resume its agent never listed is paused again
// only once the delete of its guest has gone out: while a sweeper delete to that agent is in
// flight (sweepDelete: one per agent), it stays resuming for a later round — once paused, no
// round would send the delete again, and a guest left running would never be stopped (an
// attack).
func TestPAUSE1_AbandonedResumeWaitsForItsDelete(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	h := newHarnessWith(t, func(c *Config) { c.Clock, c.StartingGrace = func() time.Time { return now }, time.Minute })
	ctx := context.Background()
	a := newFakeAgent(t, "")
	putResuming(t, h.st, "sb-resume", now)
	beatA1(t, h.st, a.srv.URL, now)
	now = now.Add(90 * time.Second)
	other := make(chan struct{})
	h.s.sweepDeletes.run("a1", "other", func() { <-other }, nil) // another sweeper delete to a1 is in flight
	h.s.settleCheckpoints(ctx)
	if sb, _ := h.st.Sandbox(ctx, "sb-resume"); sb.State != berth.SandboxResuming || a.deletes.Load() != 0 {
		t.Fatalf("with a1's delete slot taken: %s, %d deletes; want resuming, none yet", sb.State, a.deletes.Load())
	}
	close(other)
	waitUntil(t, "the other delete", func() (bool, string) { return !h.s.sweepDeletes.busy("a1"), "" })
	h.s.settleCheckpoints(ctx)
	waitUntil(t, "once the slot is free: the guest told to stop, then the row paused", func() (bool, string) {
		sb, _ := h.st.Sandbox(ctx, "sb-resume")
		return sb.State == berth.SandboxPaused && a.deletes.Load() == 1, fmt.Sprintf("%s, %d deletes", sb.State, a.deletes.Load())
	})
}

// TestSweepSettlesPastTheFirstPage: the sweeper's reads of abandoned creates, deletes and
// pauses read every row of their state, oldest first, a page at a time. A single read of the
// newest 1,000 (as before) never saw the oldest rows — the abandoned ones — once more than
// 1,000 younger ones shared their state.
func TestSweepSettlesPastTheFirstPage(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	h := newHarnessWith(t, func(c *Config) {
		c.Clock, c.StartingGrace, c.PauseTimeout = func() time.Time { return now }, time.Minute, time.Minute
	})
	ctx := context.Background()
	a := newFakeAgent(t, "")
	put := func(id string, st berth.SandboxState) {
		t.Helper()
		sb := berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1", State: st, MemoryMiB: 1,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if st == berth.SandboxStopping {
			sb.State = berth.SandboxRunning
		}
		must(t, h.st.CreateSandbox(ctx, sb, "test", now))
		if st == berth.SandboxStopping { // entered by a delete, as a replica does
			_, err := h.st.TransitionSandbox(ctx, id, nil, berth.SandboxStopping, "delete requested", "tenant/acme", now)
			must(t, err)
		}
	}
	beat := func() {
		t.Helper()
		_, err := h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive,
			BootID: "boot-1", IntakeOpen: true, HeartbeatAt: now}, now)
		must(t, err)
	}
	states := []berth.SandboxState{berth.SandboxStarting, berth.SandboxStopping, berth.SandboxPausing}
	for _, st := range states {
		put("old-"+string(st), st)
	}
	beat()
	now = now.Add(10 * time.Minute)
	for _, st := range states {
		for i := range sweepPage {
			put(fmt.Sprintf("young-%s-%04d", st, i), st)
		}
	}
	now = now.Add(time.Second)
	beat() // after the deletes began: the agent lists none of them
	h.s.sweep(ctx)
	want := map[string]berth.SandboxState{
		"old-starting": berth.SandboxFailed, "old-stopping": berth.SandboxStopped, "old-pausing": berth.SandboxLost,
		"young-starting-0000": berth.SandboxStarting, "young-stopping-0999": berth.SandboxStopping,
		"young-pausing-0500": berth.SandboxPausing,
	}
	wantStates(t, h.st, "after the sweep", want)
}

// TestPAUSE1_SnapshotStoreThatCannotTellLosesNothing: an abandoned pause is settled by whether
// its image is stored; a snapshot store that answers with a fault (not "not found") cannot
// tell, and the sandbox waits for a later round. It was read as "no image": the sandbox was
// recorded lost and its stored image orphaned.
func TestPAUSE1_SnapshotStoreThatCannotTellLosesNothing(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	bucket, err := blob.OpenBucket(context.Background(), "file://"+t.TempDir())
	must(t, err)
	t.Cleanup(func() { bucket.Close() })
	h := newHarnessWith(t, func(c *Config) {
		c.Clock, c.Snapshots, c.StartingGrace, c.PauseTimeout = func() time.Time { return now }, bucket, time.Minute, time.Minute
	})
	ctx := context.Background()
	a := newFakeAgent(t, "")
	must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-1", Template: "python", Tenant: "acme", AgentID: "a1",
		State: berth.SandboxPausing, MemoryMiB: 512, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Image: "sb-1/1"}, "test", now))
	_, err = h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive,
		IntakeOpen: true, HeartbeatAt: now}, now)
	must(t, err)
	// A file where the image's directory should be: asking for sb-1/1/files.json fails with
	// "not a directory", a fault of the store's, not "not found".
	must(t, bucket.WriteAll(ctx, "sb-1", []byte("x"), nil))
	now = now.Add(3 * time.Minute)
	h.s.settleCheckpoints(ctx)
	if sb, _ := h.st.Sandbox(ctx, "sb-1"); sb.State != berth.SandboxPausing || sb.Image != "sb-1/1" {
		t.Fatalf("with the snapshot store failing: %s, image %q; want pausing with its image", sb.State, sb.Image)
	}
	must(t, bucket.Delete(ctx, "sb-1"))
	must(t, bucket.WriteAll(ctx, "sb-1/1/files.json", []byte(`{"files":[]}`), nil))
	h.s.settleCheckpoints(ctx)
	if sb, _ := h.st.Sandbox(ctx, "sb-1"); sb.State != berth.SandboxPaused || sb.Image != "sb-1/1" {
		t.Fatalf("once the store answers: %s (%s), image %q; want paused with its image", sb.State, sb.Reason, sb.Image)
	}
}

// faultyBucket is a snapshot store that answers every question about keys under bad ("" for
// all) with a fault of its own, at once — or, with hang, answers nothing until the question's
// context ends (a store that accepts and never answers) — and holds every other image as
// stored. It counts the questions.
type faultyBucket struct {
	driver.Bucket
	bad   string
	more  []string // further prefixes, faulty as bad is
	hang  bool
	asked atomic.Int64
}

func (b *faultyBucket) Attributes(ctx context.Context, key string) (*driver.Attributes, error) {
	b.asked.Add(1)
	switch {
	case !strings.HasPrefix(key, b.bad) && !slices.ContainsFunc(b.more, func(p string) bool { return strings.HasPrefix(key, p) }):
	case b.hang:
		<-ctx.Done()
		return nil, ctx.Err()
	default:
		return nil, errors.New("permission denied")
	}
	return &driver.Attributes{}, nil
}
func (*faultyBucket) ErrorCode(error) gcerrors.ErrorCode { return gcerrors.Internal }
func (*faultyBucket) Close() error                       { return nil }

// putResuming records sandbox id resuming on agent a1 at now, with image id/1.
func putResuming(t *testing.T, st berth.Store, id string, now time.Time) {
	t.Helper()
	must(t, st.CreateSandbox(context.Background(), berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1",
		State: berth.SandboxResuming, MemoryMiB: 512, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Image: id + "/1"}, "test", now))
}

// beatA1 records a heartbeat of agent a1 at addr, received at now, listing held.
func beatA1(t *testing.T, st berth.Store, addr string, now time.Time, held ...berth.HeldSandbox) {
	t.Helper()
	_, err := st.ApplyHeartbeat(context.Background(), berth.Heartbeat{AgentID: "a1", Address: addr, Status: berth.AgentActive,
		IntakeOpen: true, HeartbeatAt: now, Sandboxes: held}, now)
	must(t, err)
}

// fillDeleteSlots takes every slot of s's sweeper deletes with other agents' calls, which
// hold them until the returned release is called.
func fillDeleteSlots(s *Server) (release func()) {
	full := make(chan struct{})
	for i := range maxStopRounds {
		s.sweepDeletes.run(fmt.Sprintf("other-%d", i), "other", func() { <-full }, nil)
	}
	return func() { close(full) }
}

// withSnapshotBudget sets snapshotRoundBudget to d for the test.
func withSnapshotBudget(t *testing.T, d time.Duration) {
	old := snapshotRoundBudget
	snapshotRoundBudget = d
	t.Cleanup(func() { snapshotRoundBudget = old })
}

// wantStates checks that each sandbox of want is in its state in st; what names the moment.
func wantStates(t *testing.T, st berth.Store, what string, want map[string]berth.SandboxState) {
	t.Helper()
	for id, state := range want {
		if sb, err := st.Sandbox(context.Background(), id); err != nil || sb.State != state {
			t.Errorf("%s: %s is %s (%s), %v; want %s", what, id, sb.State, sb.Reason, err, state)
		}
	}
}

// settleWithSnapshots puts n abandoned pauses and snapshot moves (sb-0, sb-1, …: images sb-N/1, their
// agent not listing them) past their grace on a harness whose snapshot store is b.
func settleWithSnapshots(t *testing.T, b driver.Bucket, n int) *harness {
	t.Helper()
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	bucket := blob.NewBucket(b)
	t.Cleanup(func() { bucket.Close() })
	h := newHarnessWith(t, func(c *Config) {
		c.Clock, c.Snapshots, c.StartingGrace, c.PauseTimeout = func() time.Time { return now }, bucket, time.Minute, time.Minute
	})
	ctx := context.Background()
	a := newFakeAgent(t, "")
	for i := range n {
		id, st := fmt.Sprintf("sb-%d", i), berth.SandboxPausing
		if i%3 == 2 {
			st = berth.SandboxSnapshotting
		}
		must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1",
			State: st, MemoryMiB: 512, CreatedAt: now.Add(time.Duration(i) * time.Millisecond), ExpiresAt: now.Add(time.Hour),
			Image: id + "/1"}, "test", now))
	}
	_, err := h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive,
		IntakeOpen: true, HeartbeatAt: now}, now)
	must(t, err)
	now = now.Add(3 * time.Minute)
	return h
}

// TestPAUSE1_AHangingSnapshotStoreHoldsOneRoundOnce (an attack): the questions of one sweep
// round to the snapshot store share one budget, each taking at most a quarter of it. Each
// question may take snapshotCheckTimeout (30 s), and a store that hung held the sweep — lease
// expiry with it — 30 s per abandoned pause, every round; now at most the budget a round: four
// questions of a quarter each, whatever the number of rows. The pauses wait, pausing, with
// their images.
func TestPAUSE1_AHangingSnapshotStoreHoldsOneRoundOnce(t *testing.T) {
	withSnapshotBudget(t, 80*time.Millisecond)
	b := &faultyBucket{hang: true}
	const rows = 8
	h := settleWithSnapshots(t, b, rows)
	ctx := context.Background()
	for round := int64(1); round <= 2; round++ {
		h.s.settleCheckpoints(ctx)
		if got := b.asked.Load(); got > 4*round {
			t.Fatalf("after round %d the hanging snapshot store was asked %d times about %d rows; want at most 4 a round",
				round, got, rows)
		}
	}
	for i := range rows {
		if sb, _ := h.st.Sandbox(ctx, fmt.Sprintf("sb-%d", i)); sb.State == berth.SandboxLost || sb.Image == "" {
			t.Fatalf("sb-%d is %s, image %q: settled while the snapshot store could not tell", i, sb.State, sb.Image)
		}
	}
}

// TestPAUSE1_OneHangingImageHoldsNoOtherPause (an attack): an image whose question the store
// hangs on — the oldest row, asked first every round — took the whole round's budget, and no
// younger abandoned pause was ever asked about. A question takes at most a quarter of it.
func TestPAUSE1_OneHangingImageHoldsNoOtherPause(t *testing.T) {
	withSnapshotBudget(t, 2*time.Second)
	h := settleWithSnapshots(t, &faultyBucket{bad: "sb-0/", hang: true}, 3)
	ctx := context.Background()
	h.s.settleCheckpoints(ctx)
	wantStates(t, h.st, "after a round", map[string]berth.SandboxState{"sb-0": berth.SandboxPausing,
		"sb-1": berth.SandboxPaused, "sb-2": berth.SandboxPaused})
}

// TestPAUSE1_HangingImagesHoldNoYoungerPause: images the snapshot store could not answer for
// in one round are asked about last in the next. Five images it hangs on, the oldest rows,
// spent the whole budget every round — four questions of a quarter each — and the younger
// abandoned pause behind them was never asked about, round after round.
func TestPAUSE1_HangingImagesHoldNoYoungerPause(t *testing.T) {
	withSnapshotBudget(t, 400*time.Millisecond)
	h := settleWithSnapshots(t, &faultyBucket{bad: "sb-0/", more: []string{"sb-1/", "sb-2/", "sb-3/", "sb-4/"}, hang: true}, 6)
	ctx := context.Background()
	for round := range 3 {
		h.s.settleCheckpoints(ctx)
		if sb, _ := h.st.Sandbox(ctx, "sb-5"); sb.State == berth.SandboxPaused {
			for i := range 5 {
				if sb, _ := h.st.Sandbox(ctx, fmt.Sprintf("sb-%d", i)); sb.State.Terminal() || sb.State == berth.SandboxPaused {
					t.Errorf("sb-%d, whose image the store hangs on, is %s; want left for a later round", i, sb.State)
				}
			}
			t.Logf("settled in round %d", round+1)
			return
		}
	}
	t.Fatal("sb-5, younger than five images the store hangs on, is not settled after three rounds")
}

// TestPAUSE1_OneBadImageHoldsNoOtherPause (an attack): an image the snapshot store fails on
// at once (a wrong permission on one object) leaves its own pause waiting and no other: the
// oldest row, asked first each round, stopped the round's questions and held every later
// abandoned pause for good.
func TestPAUSE1_OneBadImageHoldsNoOtherPause(t *testing.T) {
	h := settleWithSnapshots(t, &faultyBucket{bad: "sb-0/"}, 3)
	ctx := context.Background()
	h.s.settleCheckpoints(ctx)
	wantStates(t, h.st, "after a round", map[string]berth.SandboxState{"sb-0": berth.SandboxPausing,
		"sb-1": berth.SandboxPaused, "sb-2": berth.SandboxPaused})
}

// TestPAUSE1_AQueuedDeleteChecksTheRowFirst (attacks on the queue of agent calls): the
// sweeper's delete of an abandoned resume that waits for a slot is sent only if the row is
// still resuming and unlisted when its turn comes, and the row is paused again then. A
// resume that finished late meanwhile — its row promoted to running by the agent's heartbeat
// — would otherwise be stopped, its row left running over no guest.
func TestPAUSE1_AQueuedDeleteChecksTheRowFirst(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	h := newHarnessWith(t, func(c *Config) { c.Clock, c.StartingGrace = func() time.Time { return now }, time.Minute })
	ctx := context.Background()
	a := newFakeAgent(t, "")
	beatA1(t, h.st, a.srv.URL, now)
	for _, promoted := range []bool{true, false} {
		id := fmt.Sprintf("sb-promoted-%v", promoted)
		putResuming(t, h.st, id, now)
		now = now.Add(90 * time.Second)
		release := fillDeleteSlots(h.s)
		h.s.settleCheckpoints(ctx)
		if sb, _ := h.st.Sandbox(ctx, id); sb.State != berth.SandboxResuming || !h.s.sweepDeletes.busy("a1") {
			t.Fatalf("%s with every slot taken: %s, delete queued %v; want resuming, queued", id, sb.State, h.s.sweepDeletes.busy("a1"))
		}
		if promoted { // the resume finished late: the agent's heartbeat promotes the row
			ok, err := h.st.TransitionSandbox(ctx, id, []berth.SandboxState{berth.SandboxResuming}, berth.SandboxRunning,
				"restored", "agent/a1", now)
			must(t, err)
			if !ok {
				t.Fatal("not promoted")
			}
		}
		before := a.deletes.Load()
		release()
		waitUntil(t, "the queued delete's turn", func() (bool, string) { return !h.s.sweepDeletes.busy("a1"), "" })
		if got, want := a.deletes.Load()-before, map[bool]int64{true: 0, false: 1}[promoted]; got != want {
			t.Fatalf("promoted %v: %d deletes sent at its turn, want %d", promoted, got, want)
		}
		// Not promoted, the waiting delete also settles the row (found by an attack: with
		// every slot busy in every round, the resume was never paused).
		if sb, _ := h.st.Sandbox(ctx, id); sb.State != map[bool]berth.SandboxState{true: berth.SandboxRunning, false: berth.SandboxPaused}[promoted] {
			t.Fatalf("promoted %v: %s after the queued delete's turn", promoted, sb.State)
		}
	}
}

// TestPAUSE1_AQueuedDeleteSparesANewerResume (an attack): a sweeper delete asked for one
// abandoned resume waited while the row went on — promoted to running, paused again with a
// new image, resumed to the same agent. At its turn the row was again resuming, on that
// agent, unlisted, and the delete stopped the new resume's guest and paused the row with the
// older image. It is sent only while the row is as found: same image too.
func TestPAUSE1_AQueuedDeleteSparesANewerResume(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	h := newHarnessWith(t, func(c *Config) { c.Clock, c.StartingGrace = func() time.Time { return now }, time.Minute })
	ctx := context.Background()
	a := newFakeAgent(t, "")
	beatA1(t, h.st, a.srv.URL, now)
	id := "sb-x"
	putResuming(t, h.st, id, now)
	now = now.Add(90 * time.Second)
	release := fillDeleteSlots(h.s)
	h.s.settleCheckpoints(ctx) // the abandoned resume's delete waits
	for _, mv := range []struct {
		from berth.SandboxState
		move berth.SandboxMove
	}{
		{berth.SandboxResuming, berth.SandboxMove{To: berth.SandboxRunning, AgentID: "a1", Image: id + "/1"}},
		{berth.SandboxRunning, berth.SandboxMove{To: berth.SandboxPausing, AgentID: "a1", Image: id + "/2"}},
		{berth.SandboxPausing, berth.SandboxMove{To: berth.SandboxPaused, PausedAt: now, Image: id + "/2"}},
		{berth.SandboxPaused, berth.SandboxMove{To: berth.SandboxResuming, AgentID: "a1", Image: id + "/2"}},
	} {
		mv.move.ExpiresAt = now.Add(time.Hour)
		ok, err := h.st.MoveSandbox(ctx, id, []berth.SandboxState{mv.from}, mv.move, "test", "test", now)
		must(t, err)
		if !ok {
			t.Fatalf("%s → %s refused", mv.from, mv.move.To)
		}
	}
	release()
	waitUntil(t, "the waiting delete's turn", func() (bool, string) { return !h.s.sweepDeletes.busy("a1"), "" })
	if sb, _ := h.st.Sandbox(ctx, id); a.deletes.Load() != 0 || sb.State != berth.SandboxResuming || sb.Image != id+"/2" {
		t.Fatalf("%d deletes sent, row %s with image %s; want none, the new resume (%s/2) untouched", a.deletes.Load(), sb.State, sb.Image, id)
	}
}

// TestPAUSE1_AFailedDeletePausesNothing (an attack): an abandoned resume is paused again only
// once its agent took the delete. One the agent failed (503) had the row paused, on no host,
// while the guest it may have restored runs on (AGT-6 stops no paused row's guest); now it
// stays resuming for the next round to try again.
func TestPAUSE1_AFailedDeletePausesNothing(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	h := newHarnessWith(t, func(c *Config) { c.Clock, c.StartingGrace = func() time.Time { return now }, time.Minute })
	ctx := context.Background()
	var deletes atomic.Int64
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(agent.Close)
	beatA1(t, h.st, agent.URL, now)
	putResuming(t, h.st, "sb-y", now)
	now = now.Add(90 * time.Second)
	h.s.settleCheckpoints(ctx)
	waitUntil(t, "the delete sent", func() (bool, string) {
		return deletes.Load() == 1 && !h.s.sweepDeletes.busy("a1"), fmt.Sprintf("%d deletes", deletes.Load())
	})
	if sb, _ := h.st.Sandbox(ctx, "sb-y"); sb.State != berth.SandboxResuming {
		t.Fatalf("after its agent failed the delete, sb-y is %s; want resuming, for the next round", sb.State)
	}
}

// TestPAUSE1_ADeleteWaitingBesideAnotherIsKept (an attack): an agent's place in the queue of
// sweeper deletes held one delete, and a later ask replaced it — a stopping row its agent
// kept listing, asked for every round after the abandoned resume, had the resume's delete
// replaced every round, and the resume never settled. A place keeps one delete per sandbox.
func TestPAUSE1_ADeleteWaitingBesideAnotherIsKept(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	h := newHarnessWith(t, func(c *Config) { c.Clock, c.StartingGrace = func() time.Time { return now }, time.Minute })
	ctx := context.Background()
	a := newFakeAgent(t, "")
	putResuming(t, h.st, "sb-res", now)
	must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-stop", Template: "python", Tenant: "acme", AgentID: "a1",
		State: berth.SandboxStopping, MemoryMiB: 512, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now))
	now = now.Add(90 * time.Second)
	beatA1(t, h.st, a.srv.URL, now, berth.HeldSandbox{ID: "sb-stop"}) // its delete does not take
	release := fillDeleteSlots(h.s)
	h.s.settleCheckpoints(ctx) // the resume's delete waits…
	h.s.settleStopping(ctx)    // …and the stopping row's joins it
	release()
	waitUntil(t, "both deletes sent, the resume paused again", func() (bool, string) {
		sb, _ := h.st.Sandbox(ctx, "sb-res")
		return sb.State == berth.SandboxPaused && a.deletes.Load() == 2, fmt.Sprintf("%s, %d deletes", sb.State, a.deletes.Load())
	})
}
