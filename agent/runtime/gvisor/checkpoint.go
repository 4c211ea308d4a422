package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth"
)

// tagFile is written beside runsc's image files: the ImageTag of the runtime that made them.
const tagFile = "berth-image-tag"

// Checkpoint saves the running sandbox id into the empty directory dir — its processes,
// their memory and its /tmp (held in the sentry) — and stops it (PAUSE-1, SPOT-3). Calls in
// flight into the sandbox are cut first (their relays would hold host files the image cannot
// keep) and new ones are refused with conflict until it is done. If the checkpoint fails and
// the sandbox still runs, it goes on running and the error says why; if the sandbox died, it
// is reported ended by the next Measure. Errors: ESandboxNotFound, EConflict (a checkpoint
// is already under way), or runsc's failure with its log.
func (r *Runtime) Checkpoint(ctx context.Context, id, dir string) error {
	sb, err := r.sandboxes.Get(ctx, id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	if sb.frozen {
		sb.mu.Unlock()
		return berth.Errorf(berth.EConflict, "sandbox %s is already being checkpointed", id)
	}
	sb.frozen = true
	sb.mu.Unlock()
	r.killRelays(sb)
	out, err := r.runscCmd(ctx, "checkpoint", "--image-path", dir, id).CombinedOutput()
	if err != nil {
		if !sb.hasExited() && r.running(id) {
			sb.mu.Lock()
			sb.frozen = false
			sb.mu.Unlock()
		}
		return fmt.Errorf("gvisor: checkpoint %s: %v: %s", id, err, brief(out, 600))
	}
	if err := os.WriteFile(filepath.Join(dir, tagFile), []byte(r.tag), 0o644); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	// The checkpointed container has stopped: clean it up like a stop.
	select {
	case <-sb.exited:
	case <-time.After(10 * time.Second):
	}
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.Stop(stop, id); err != nil {
		r.log.Warn("gvisor: cleanup after a checkpoint", "sandbox", id, "err", err)
	}
	return nil
}

// running reports whether runsc says container id runs.
func (r *Runtime) running(id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := r.runscCmd(ctx, "state", id).Output()
	return err == nil && strings.Contains(string(out), `"running"`)
}

// Restore starts sandbox s from an image Checkpoint wrote into dir, with its processes and
// memory as they were, and returns once its init answers (PAUSE-1). The image must come from
// a runtime with the same ImageTag (runsc version, platform and init binary): another one
// could not rebuild it. Errors: EInvalidRequest (bad spec, no image in dir), EConflict (the
// id is held, or the image was made by another runtime build), or runsc's failure with its
// log.
func (r *Runtime) Restore(ctx context.Context, s Spec, dir string) error {
	tag, err := os.ReadFile(filepath.Join(dir, tagFile))
	if errors.Is(err, os.ErrNotExist) {
		return berth.Errorf(berth.EInvalidRequest, "no checkpoint image in %s", dir)
	} else if err != nil {
		return fmt.Errorf("gvisor: restore %s: %w", s.ID, err)
	}
	if string(tag) != r.tag {
		return berth.Errorf(berth.EConflict, "the image of %s was made by %q; this host runs %q", s.ID, tag, r.tag)
	}
	sb, err := r.admit(s)
	if err != nil {
		return err
	}
	return r.sandboxes.Started(sb.id, sb, r.boot(ctx, sb, &dir), func() { r.teardown(sb) })
}

// waitRestored waits until a restored sandbox's init answers a ping, the sandbox dies, or
// ctx ends.
func (r *Runtime) waitRestored(ctx context.Context, sb *sandbox) error {
	c := r.client(sb)
	wait := 20 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.Ping(pctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case sb.hasExited():
			return fmt.Errorf("gvisor: restored sandbox %s exited: %s", sb.id, sb.stderr.String())
		case ctx.Err() != nil:
			return fmt.Errorf("gvisor: restored sandbox %s does not answer: %w (last: %v)", sb.id, ctx.Err(), err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}
