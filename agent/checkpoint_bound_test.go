package agent

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"

	"github.com/berth-dev/berth"
)

// ckptRuntime is fakeRuntime that checkpoints through a function field (STYLE habit 7).
type ckptRuntime struct {
	*fakeRuntime
	checkpoint func(ctx context.Context, id string) error
}

func (c *ckptRuntime) Checkpoint(ctx context.Context, id, dir string) error {
	return c.checkpoint(ctx, id)
}
func (c *ckptRuntime) Restore(ctx context.Context, s Spec, dir string) error { return nil }
func (c *ckptRuntime) Ping(ctx context.Context, id string) error             { return nil }

// TestPAUSE1_CheckpointEndsBeforeTheServerStopsWaiting: a checkpoint that would outlast the
// calling server's wait (berth.HeaderTimeout) is stopped before that wait ends, the server
// is answered, and the guest runs on here, still listed. Unbounded, it would go on after the
// server gave up, and could stop the guest after the server's sweeper had recorded the
// sandbox running again (it would end lost, its image orphaned).
func TestPAUSE1_CheckpointEndsBeforeTheServerStopsWaiting(t *testing.T) {
	bucket, err := blob.OpenBucket(context.Background(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bucket.Close() })
	deadlines := make(chan time.Time, 1)
	rt := &ckptRuntime{fakeRuntime: &fakeRuntime{}, checkpoint: func(ctx context.Context, id string) error {
		d, _ := ctx.Deadline()
		deadlines <- d
		select { // a runtime that would take longer than anyone waits
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second): // unbounded: the test fails below, not hangs
			return context.DeadlineExceeded
		}
	}}
	cfg := DefaultConfig()
	cfg.ID, cfg.Admission, cfg.MemoryMiB, cfg.HeadroomMiB = "a1", berth.AdmissionCommitted, 4096, 0
	cfg.NodeToken, cfg.SnapshotStore, cfg.SnapshotDir = "node-token", bucket, t.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ln.Close() })
	if err := create(a, "s1", 256); err != nil {
		t.Fatal(err)
	}

	const wait = 400 * time.Millisecond
	req := httptest.NewRequest(http.MethodPost, "/internal/sandboxes/s1/checkpoint", strings.NewReader(`{"image":"s1/1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(berth.HeaderAgentCall, berth.AgentCallToken(cfg.NodeToken, cfg.ID, a.addr))
	req.Header.Set(berth.HeaderTimeout, "400")
	sent := time.Now()
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, req) // returns: the checkpoint did not run on

	var deadline time.Time
	select {
	case deadline = <-deadlines:
	default:
		t.Fatalf("the runtime was never asked to checkpoint: %d %s", rec.Code, rec.Body)
	}
	if deadline.IsZero() {
		t.Errorf("the runtime's checkpoint had no deadline; want one before the server's %v wait ends", wait)
	} else if deadline.After(sent.Add(wait)) {
		t.Errorf("the runtime's checkpoint was bounded at %v after the call; want before the server's %v wait ends", deadline.Sub(sent), wait)
	}
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "runs on") {
		t.Errorf("answer %d %s; want 503 saying the guest runs on", rec.Code, rec.Body)
	}
	held := false
	for _, h := range a.Heartbeat(time.Now()).Sandboxes {
		held = held || h.ID == "s1"
	}
	if !held || a.checkpointing("s1") {
		t.Errorf("after the bounded checkpoint: listed %v, checkpointing %v; want it listed, running on", held, a.checkpointing("s1"))
	}
}
