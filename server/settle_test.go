package server

import (
	"context"
	"testing"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"

	"github.com/berth-dev/berth"
)

// TestPAUSE1_SweeperSettlesAbandonedCheckpoints: a replica that died in the middle of a
// pause, a snapshot move or a resume leaves its sandbox in pausing, snapshotting or
// resuming; once the grace passes, the sweeper settles each by what the agent and the
// snapshot store hold — image stored: paused, even while the agent's last heartbeat still
// lists it (it stops a guest once the image is stored); still listed: running again;
// neither: lost; a resume its agent never listed: paused again with its image.
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
	put("sb-held-stored", berth.SandboxPausing, "sb-held-stored/1")
	must(t, bucket.WriteAll(ctx, "sb-stored/1/files.json", []byte(`{"files":[]}`), nil))
	must(t, bucket.WriteAll(ctx, "sb-held-stored/1/files.json", []byte(`{"files":[]}`), nil))
	_, err = h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive,
		IntakeOpen: true, HeartbeatAt: now, Sandboxes: []berth.HeldSandbox{{ID: "sb-held"}, {ID: "sb-held-stored"}}}, now)
	must(t, err)

	now = now.Add(90 * time.Second) // past the resume's grace, not the checkpoints'
	h.s.settleCheckpoints(ctx)
	want := map[string]berth.SandboxState{"sb-held": berth.SandboxPausing, "sb-resume": berth.SandboxPaused}
	for id, st := range want {
		if sb, _ := h.st.Sandbox(ctx, id); sb.State != st {
			t.Fatalf("after 90 s %s is %s, want %s", id, sb.State, st)
		}
	}
	now = now.Add(2 * time.Minute)
	put("sb-young", berth.SandboxPausing, "") // entered just now: left alone
	h.s.settleCheckpoints(ctx)
	want = map[string]berth.SandboxState{"sb-held": berth.SandboxRunning, "sb-stored": berth.SandboxPaused,
		"sb-held-stored": berth.SandboxPaused, // listed by a heartbeat from before its agent stopped it
		"sb-gone":        berth.SandboxLost, "sb-resume": berth.SandboxPaused, "sb-young": berth.SandboxPausing}
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
