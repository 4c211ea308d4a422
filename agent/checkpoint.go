package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/berth-dev/berth/snapshot"
)

// Checkpoint saves sandbox id — processes, memory, its /tmp — into the snapshot store under
// image, then stops it here and drops it from the books, which frees its memory and its
// admission charge (PAUSE-1; the server records where it went, so no "ended" report
// follows). Before the snapshot the guest's init must answer (PAUSE-2). Nothing is lost on
// a failure: if the runtime cannot checkpoint, the guest runs on; if the image cannot be
// stored, the guest is restored here from the local copy and runs on; only when both fail
// does it end, failed, with the real reason. Errors: unsupported (no checkpoint capability or
// no snapshot store), invalid_request (bad image name), conflict (not started yet, being
// checkpointed, or its init does not answer: it runs on), unavailable (the runtime or the
// store failed and the guest runs on), sandbox_not_found (no such guest, or it died in the
// attempt: the message says why).
func (a *Agent) Checkpoint(ctx context.Context, id, image string) (berth.CheckpointResult, error) {
	res := berth.CheckpointResult{Image: image}
	if a.ckpt == nil {
		return res, berth.Errorf(berth.EUnsupported, "agent %s cannot checkpoint (runtime %q, snapshot store: %t)",
			a.cfg.ID, a.info.Name, a.cfg.SnapshotStore != nil)
	}
	if err := validImageName(image); err != nil {
		return res, err
	}
	a.mu.Lock()
	g, ok := a.guests[id]
	switch {
	case !ok:
		a.mu.Unlock()
		return res, berth.Errorf(berth.ESandboxNotFound, "sandbox %s is not running on agent %s", id, a.cfg.ID)
	case !g.started:
		a.mu.Unlock()
		return res, berth.Errorf(berth.EConflict, "sandbox %s is still starting", id)
	case g.checkpointing:
		a.mu.Unlock()
		return res, berth.Errorf(berth.EConflict, "sandbox %s is already being checkpointed", id)
	}
	g.checkpointing = true
	res.ResidentMiB = g.resident
	spec := g.spec
	a.mu.Unlock()
	keep := func() {
		a.mu.Lock()
		if cur := a.guests[id]; cur == g {
			g.checkpointing = false
		}
		a.mu.Unlock()
	}

	ping, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := a.ckpt.Ping(ping, id)
	cancel()
	if err != nil {
		keep()
		return res, berth.Errorf(berth.EConflict, "sandbox %s failed its health check before the snapshot (its init does not answer): %v", id, err)
	}
	if err := os.MkdirAll(a.cfg.SnapshotDir, 0o700); err != nil {
		keep()
		return res, fmt.Errorf("agent %s: snapshot dir: %w", a.cfg.ID, err)
	}
	dir, err := os.MkdirTemp(a.cfg.SnapshotDir, id+"-")
	if err != nil {
		keep()
		return res, fmt.Errorf("agent %s: snapshot dir: %w", a.cfg.ID, err)
	}
	defer os.RemoveAll(dir)

	start := time.Now()
	// The runtime's step is never cut short by the caller: a checkpoint killed half-way (a
	// runsc process ended mid-save) could leave the guest saved and stopped after this had
	// answered that it runs on. It has its own bound, checkpointRuntimeMax; a caller out of
	// time or gone meanwhile stops the upload instead, below.
	step, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointRuntimeMax)
	err = a.ckpt.Checkpoint(step, id, dir)
	cancel()
	if err != nil {
		if m, merr := a.rt.Measure(id); merr == nil && !m.Exited {
			keep()
			return res, berth.Errorf(berth.EUnavailable, "checkpoint of %s failed; it runs on here: %v", id, err)
		}
		if !a.ours(id, g) { // a delete stopped it mid-save: it is gone, and not as a failure
			return res, berth.Errorf(berth.ESandboxNotFound, "sandbox %s was deleted during the checkpoint", id)
		}
		reason := "checkpoint failed and the sandbox died: " + err.Error()
		a.end(context.WithoutCancel(ctx), id, g, berth.SandboxFailed, reason, time.Now())
		return res, berth.Errorf(berth.ESandboxNotFound, "%s", reason)
	}
	res.CheckpointMS = time.Since(start).Milliseconds()
	res.ImageBytes = dirBytes(dir)

	start = time.Now()
	st, err := snapshot.WriteDir(ctx, a.cfg.SnapshotStore, image, dir) // out of time or gone: fails, restored below
	if err != nil {
		return res, a.restoreAfterUpload(ctx, id, g, spec, dir, err, keep)
	}
	res.UploadMS = time.Since(start).Milliseconds()
	res.StoredBytes, res.ZeroChunks = st.BytesMoved, st.ZeroChunks
	a.forget(id, g)
	a.log.Info("sandbox checkpointed", "sandbox", id, "image", image, "image_bytes", res.ImageBytes,
		"stored_bytes", res.StoredBytes, "checkpoint_ms", res.CheckpointMS, "upload_ms", res.UploadMS)
	a.Kick()
	return res, nil
}

// restoreAfterUpload brings guest g of sandbox id (booked as spec) back from its local image
// in dir when the upload failed (upErr) — the guest is stopped but its image is here — and
// answers for the checkpoint: unavailable when it runs on (keep clears its checkpointing mark), not found when
// it could not be restored (it ended, failed, reported on the next heartbeat) or was deleted
// while it was saved or uploaded. A deleted copy is not restored, and one deleted during the
// restore is stopped again: else it ran on with nothing booked for it, unlisted, with no TTL
// (an attack). Only the copy still booked is reported ended: a new copy of the id booked
// since must not be ended by its predecessor's report (an attack).
func (a *Agent) restoreAfterUpload(ctx context.Context, id string, g *guest, spec berth.AgentCreate, dir string, upErr error, keep func()) error {
	deleted := berth.Errorf(berth.ESandboxNotFound, "sandbox %s was deleted during the checkpoint", id)
	if !a.ours(id, g) {
		return deleted
	}
	vol, _ := a.volumeDir(spec.Volume)
	restore, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if rerr := a.ckpt.Restore(restore, Spec{ID: id, Template: spec.Template, MemoryMiB: spec.MemoryMiB,
		VCPUs: spec.VCPUs, VolumeDir: vol}, dir); rerr != nil {
		reason := fmt.Sprintf("its image could not be stored (%v) and the local restore failed: %v", upErr, rerr)
		if a.forget(id, g) {
			a.queueEnded(id, berth.SandboxFailed, reason, time.Now())
		}
		return berth.Errorf(berth.ESandboxNotFound, "%s", reason)
	}
	if !a.ours(id, g) {
		_ = a.rt.Stop(restore, id)
		return deleted
	}
	keep()
	return berth.Errorf(berth.EUnavailable, "the image of %s could not be stored; it was restored here and runs on: %v", id, upErr)
}

// ours reports whether guest g is still the booked copy of id and no delete is stopping it.
func (a *Agent) ours(id string, g *guest) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.guests[id] == g && !g.deleting
}

// forget drops guest g from the books if it is still the record of id, and the runtime id
// a warm guest served it as (its runtime stopped it already); it reports whether it did. A
// copy a delete claimed is the delete's to drop (stopClaimed), once its stop has landed.
func (a *Agent) forget(id string, g *guest) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.guests[id] != g || g.deleting {
		return false
	}
	delete(a.guests, id)
	a.warm.ids.drop(id)
	return true
}

// queueEnded reports a guest that is already gone on the next heartbeat.
func (a *Agent) queueEnded(id string, state berth.SandboxState, reason string, now time.Time) {
	a.mu.Lock()
	a.ended = append(a.ended, berth.EndedSandbox{ID: id, State: state, Reason: reason, At: now.UTC()})
	a.mu.Unlock()
	a.log.Info("sandbox ended", "sandbox", id, "state", state, "reason", reason)
	a.Kick()
}

// restore fetches image from the snapshot store and has the runtime restore sandbox s from
// it (PAUSE-1). Errors: unsupported, not_found (no such image), or the runtime's (conflict for
// an image this runtime cannot rebuild).
func (a *Agent) restore(ctx context.Context, s Spec, image string) error {
	if a.ckpt == nil {
		return berth.Errorf(berth.EUnsupported, "agent %s cannot restore (runtime %q, snapshot store: %t)",
			a.cfg.ID, a.info.Name, a.cfg.SnapshotStore != nil)
	}
	if err := validImageName(image); err != nil {
		return err
	}
	if err := os.MkdirAll(a.cfg.SnapshotDir, 0o700); err != nil {
		return fmt.Errorf("agent %s: snapshot dir: %w", a.cfg.ID, err)
	}
	dir, err := os.MkdirTemp(a.cfg.SnapshotDir, s.ID+"-")
	if err != nil {
		return fmt.Errorf("agent %s: snapshot dir: %w", a.cfg.ID, err)
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	if _, err := snapshot.ReadDir(ctx, a.cfg.SnapshotStore, image, dir); err != nil {
		if errors.Is(err, snapshot.ErrNoImage) {
			return berth.Errorf(berth.ENotFound, "no image %s in the snapshot store", image)
		}
		return berth.Errorf(berth.EUnavailable, "fetch image %s: %v", image, err)
	}
	fetched := time.Since(start)
	if err := a.ckpt.Restore(ctx, s, dir); err != nil {
		return err
	}
	a.log.Info("sandbox restored", "sandbox", s.ID, "image", image, "fetch_ms", fetched.Milliseconds(),
		"restore_ms", (time.Since(start) - fetched).Milliseconds())
	return nil
}

// validImageName accepts a clean relative path of letters, digits, '-', '_', '.' and '/'.
func validImageName(image string) error {
	ok := image != "" && len(image) <= 256 && path.Clean(image) == image && !strings.HasPrefix(image, "/") &&
		!strings.HasPrefix(image, "..")
	for _, c := range image {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./", c)) {
			ok = false
		}
	}
	if !ok {
		return berth.Errorf(berth.EInvalidRequest, "bad image name %q", image)
	}
	return nil
}

func dirBytes(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
	}
	return n
}

// handleCheckpoint is POST /internal/sandboxes/{id}/checkpoint. A checkpoint is bounded by
// the calling server's wait (berth.HeaderTimeout) less a margin for the answer's way back:
// one that would outlast it is not uploaded (or its upload stops), and the guest is restored
// and runs on here (Checkpoint's failure paths).
// Unbounded, a checkpoint cut off from its server (a partition; the connection never seen to
// close) could store its image and stop the guest after the server's sweeper had recorded the
// sandbox running again, and the sandbox would end lost with its image orphaned.
func (a *Agent) handleCheckpoint(w http.ResponseWriter, r *http.Request) {
	var req berth.CheckpointRequest
	if err := httpjson.Decode(w, r, maxJSONBytes, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	ctx := r.Context()
	if wait, ok := callerWait(r); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait-min(time.Second, wait/10))
		defer cancel()
	}
	res, err := a.Checkpoint(ctx, r.PathValue("id"), req.Image)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, res)
}

// checkpointRuntimeMax bounds the runtime's own checkpoint of one guest (Agent.Checkpoint),
// which no caller's deadline cuts short.
const checkpointRuntimeMax = 10 * time.Minute

// maxCallerWait caps what callerWait believes: a day, far beyond any server's PauseTimeout.
const maxCallerWait = 24 * time.Hour

// callerWait is how long the server that sent r waits for the answer (berth.HeaderTimeout),
// if it said so with a positive whole number of milliseconds; at most maxCallerWait.
func callerWait(r *http.Request) (time.Duration, bool) {
	ms, err := strconv.ParseInt(r.Header.Get(berth.HeaderTimeout), 10, 64)
	if err != nil || ms <= 0 {
		return 0, false
	}
	return time.Duration(min(ms, maxCallerWait.Milliseconds())) * time.Millisecond, true
}
