package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// ckptRuntime is fakeRuntime that checkpoints through a function field (STYLE habit 7) and
// counts its restores.
type ckptRuntime struct {
	*fakeRuntime
	checkpoint func(ctx context.Context, id string) error
	restores   atomic.Int64
}

func (c *ckptRuntime) Checkpoint(ctx context.Context, id, dir string) error {
	return c.checkpoint(ctx, id)
}
func (c *ckptRuntime) Restore(ctx context.Context, s Spec, dir string) error {
	c.restores.Add(1)
	return nil
}
func (c *ckptRuntime) Ping(ctx context.Context, id string) error { return nil }

// TestPAUSE1_CheckpointEndsBeforeTheServerStopsWaiting: a checkpoint whose runtime step
// outlasts the calling server's wait (berth.HeaderTimeout) is not cut short — a runtime killed
// mid-save could stop the guest after the answer said it runs on — but its image is not
// uploaded: the guest is restored here, runs on, is still listed, and the server is answered.
// Uploaded after the server gave up, the image would stop the guest behind the server's back
// (the sweeper could have recorded it running; it would end lost, its image orphaned).
func TestPAUSE1_CheckpointEndsBeforeTheServerStopsWaiting(t *testing.T) {
	const wait = 300 * time.Millisecond
	cut := make(chan error, 1)
	rt := &ckptRuntime{fakeRuntime: &fakeRuntime{}, checkpoint: func(ctx context.Context, id string) error {
		time.Sleep(wait + 100*time.Millisecond) // real: a runtime step slower than the server waits
		cut <- ctx.Err()
		return nil
	}}
	a := newCkptAgent(t, rt)
	if err := create(a, "s1", 256); err != nil {
		t.Fatal(err)
	}

	req := httptest.NewRequest(http.MethodPost, "/internal/sandboxes/s1/checkpoint", strings.NewReader(`{"image":"s1/1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(berth.HeaderAgentCall, berth.AgentCallToken(a.cfg.NodeToken, a.cfg.ID, a.addr))
	req.Header.Set(berth.HeaderTimeout, strconv.FormatInt(wait.Milliseconds(), 10))
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, req)

	if err := <-cut; err != nil {
		t.Errorf("the runtime's checkpoint was cut short (%v); want it left to finish", err)
	}
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "runs on") {
		t.Errorf("answer %d %s; want 503 saying the guest runs on", rec.Code, rec.Body)
	}
	if ok, err := a.cfg.SnapshotStore.Exists(context.Background(), "s1/1/files.json"); err != nil || ok {
		t.Errorf("the image was stored after the server's wait (%v); want no upload", err)
	}
	if n := rt.restores.Load(); n != 1 {
		t.Errorf("%d restores; want the guest restored here once", n)
	}
	held := false
	for _, h := range a.Heartbeat(time.Now()).Sandboxes {
		held = held || h.ID == "s1"
	}
	if !held || a.checkpointing("s1") {
		t.Errorf("after the bounded checkpoint: listed %v, checkpointing %v; want it listed, running on", held, a.checkpointing("s1"))
	}
}
