package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/agent/runtime/cgroups"
)

// Stop stops the sandbox (AGT-7): it kills the whole process tree (with isolation, killing
// the init ends its PID namespace and everything in it; its /tmp, a tmpfs, goes with it),
// waits for it, removes its cgroups (memory, pids) and directory, and gives up its uid. Stop is idempotent: an unknown or already stopped id is not an
// error. Concurrent Stops of one id all wait for the same teardown.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	return r.sandboxes.Stop(ctx, id, r.teardown)
}

// teardown kills and removes whatever of sb exists. Its waits are bounded on their own so a
// stuck cgroup cannot hang the agent; what remains is cleaned by the next New.
func (r *Runtime) teardown(sb *sandbox) error {
	var errs []error
	if sb.proc != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		kill := func() error {
			if err := sb.proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				return fmt.Errorf("process: kill init of %s: %w", sb.id, err)
			}
			return nil
		}
		if r.isolated || sb.hasExited() { // once reaped, the pid may belong to a stranger
			errs = append(errs, kill())
		} else {
			errs = append(errs, killTree(ctx, sb.proc.Pid, kill, sb.hasExited))
		}
		select {
		case <-sb.exited:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("process: init of %s did not exit: %w", sb.id, ctx.Err()))
		}
		cancel()
	}
	for _, cg := range sb.cgroups {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, cgroups.Remove(ctx, cg))
		cancel()
	}
	sb.uid.release() // the init's copy of the lock went with it
	if err := os.RemoveAll(sb.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("process: remove %s: %w", sb.dir, err))
	}
	if !strings.HasPrefix(sb.sock, sb.dir+string(filepath.Separator)) {
		_ = os.Remove(sb.sock) // a socket kept in the short directory
	}
	return errors.Join(errs...)
}
