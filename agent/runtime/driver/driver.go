// Package driver is what every runtime driver keeps the same way (AGT-3): the check of a
// sandbox id, the registry of a runtime's sandboxes with their start and stop state machine
// — calls during a start wait for it, a failed start leaves nothing, a stop runs once
// however many ask, Close stops everything and refuses new starts — and the spawner, whose
// children die with the agent.
package driver

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"github.com/berth-dev/berth"
)

// ValidID accepts sandbox ids that are safe as a path element, a container id and a cgroup
// name: 1–128 of letters, digits, '-', '_' and '.', not "." or "..". Errors: invalid_request.
func ValidID(id string) error {
	if id == "" || id == "." || id == ".." || len(id) > 128 {
		return berth.Errorf(berth.EInvalidRequest, "bad sandbox id %q", id)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return berth.Errorf(berth.EInvalidRequest, "bad sandbox id %q: only letters, digits, '-', '_' and '.'", id)
		}
	}
	return nil
}

// Life is one sandbox's place in a Registry; a driver's sandbox record embeds it.
type Life struct {
	ready    chan struct{} // closed once its start finished (well or not)
	startErr error
	stopping chan struct{} // closed by the first Stop
	stopped  chan struct{} // closed when that Stop is done
	stopErr  error
}

// NewLife returns the Life of a sandbox about to start.
func NewLife() Life {
	return Life{ready: make(chan struct{}), stopping: make(chan struct{}), stopped: make(chan struct{})}
}

func (l *Life) life() *Life { return l }

// Ready reports without waiting whether the sandbox's start has finished well.
func (l *Life) Ready() bool {
	select {
	case <-l.ready:
		return l.startErr == nil
	default:
		return false
	}
}

// Stopping reports whether a Stop of the sandbox has begun.
func (l *Life) Stopping() bool {
	select {
	case <-l.stopping:
		return true
	default:
		return false
	}
}

// Sandbox is a driver's record of a sandbox: any struct that embeds Life.
type Sandbox interface{ life() *Life }

// Registry is a runtime's sandboxes by id. Label names the runtime in messages ("gvisor").
// Safe for concurrent use.
type Registry[S Sandbox] struct {
	label  string
	mu     sync.Mutex
	m      map[string]S
	closed bool
}

// NewRegistry returns an empty registry.
func NewRegistry[S Sandbox](label string) *Registry[S] {
	return &Registry[S]{label: label, m: map[string]S{}}
}

// Admit records sb, about to start, as id. Errors: conflict when id is held, unavailable
// after Close.
func (r *Registry[S]) Admit(id string, sb S) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return berth.Errorf(berth.EUnavailable, "%s runtime is closed", r.label)
	}
	if _, held := r.m[id]; held {
		return berth.Errorf(berth.EConflict, "sandbox %s already exists", id)
	}
	r.m[id] = sb
	return nil
}

// Started ends sb's start with err: a failed start runs undo (which removes whatever it
// made) and forgets sb, so its id may start again. It returns err.
func (r *Registry[S]) Started(id string, sb S, err error, undo func()) error {
	l := sb.life()
	if err != nil {
		undo()
		r.Forget(id, sb)
		l.startErr = err
	}
	close(l.ready)
	return err
}

// Get returns the started sandbox id, waiting while it starts. Errors: sandbox_not_found
// (unknown, or its start failed), ctx's end wrapped.
func (r *Registry[S]) Get(ctx context.Context, id string) (S, error) {
	sb, ok := r.Peek(id)
	if !ok {
		return sb, berth.Errorf(berth.ESandboxNotFound, "no sandbox %s on this host", id)
	}
	select {
	case <-sb.life().ready:
	case <-ctx.Done():
		return sb, fmt.Errorf("%s: sandbox %s is starting: %w", r.label, id, ctx.Err())
	}
	if sb.life().startErr != nil {
		return sb, berth.Errorf(berth.ESandboxNotFound, "sandbox %s failed to start", id)
	}
	return sb, nil
}

// Peek returns the record of id, started or not, without waiting.
func (r *Registry[S]) Peek(id string) (S, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.m[id]
	return sb, ok
}

// Holds reports whether sb is still the record of id.
func (r *Registry[S]) Holds(id string, sb S) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur, ok := r.m[id]
	return ok && cur.life() == sb.life()
}

// Forget drops sb if it is still the record of id.
func (r *Registry[S]) Forget(id string, sb S) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.m[id]; ok && cur.life() == sb.life() {
		delete(r.m, id)
	}
}

// Stop runs teardown once for sandbox id, however many Stops ask, and forgets it; every
// Stop waits for that one teardown and returns its error. An unknown id, or one whose start
// failed (and cleaned up), is not an error. A Stop during a start waits for the start.
func (r *Registry[S]) Stop(ctx context.Context, id string, teardown func(S) error) error {
	sb, ok := r.Peek(id)
	if !ok {
		return nil
	}
	l := sb.life()
	select {
	case <-l.ready:
	case <-ctx.Done():
		return fmt.Errorf("%s: stop %s while it starts: %w", r.label, id, ctx.Err())
	}
	if l.startErr != nil {
		return nil
	}
	first := false
	r.mu.Lock()
	select {
	case <-l.stopping:
	default:
		close(l.stopping)
		first = true
	}
	r.mu.Unlock()
	if first {
		l.stopErr = teardown(sb)
		r.Forget(id, sb)
		close(l.stopped)
	}
	select {
	case <-l.stopped:
		return l.stopErr
	case <-ctx.Done():
		return fmt.Errorf("%s: stop %s: %w", r.label, id, ctx.Err())
	}
}

// Close refuses new starts and stops every sandbox with stop (30 s each, in parallel). It
// reports whether this was the first Close; calling it again is harmless.
func (r *Registry[S]) Close(stop func(ctx context.Context, id string) error) (first bool, err error) {
	r.mu.Lock()
	first = !r.closed
	r.closed = true
	ids := make([]string, 0, len(r.m))
	for id := range r.m {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[i] = stop(ctx, id)
		})
	}
	wg.Wait()
	return first, errors.Join(errs...)
}

// Spawner starts processes from one goroutine locked to its OS thread for its whole life. A
// child that asks for a signal on its parent's death (PR_SET_PDEATHSIG) gets it when the
// *thread* that forked it exits; a thread that never exits makes it mean "when the agent
// dies", so no sandbox outlives its agent. The thread ends with Close.
type Spawner struct {
	reqs chan spawnReq
	quit chan struct{}
	once sync.Once
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// NewSpawner starts a spawner.
func NewSpawner() *Spawner {
	s := &Spawner{reqs: make(chan spawnReq), quit: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		for {
			select {
			case req := <-s.reqs:
				req.done <- req.cmd.Start()
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

// Start starts cmd from the spawner's thread. Errors: cmd.Start's, or unavailable after
// Close.
func (s *Spawner) Start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	select {
	case s.reqs <- spawnReq{cmd: cmd, done: done}:
		return <-done
	case <-s.quit:
		return berth.Errorf(berth.EUnavailable, "the runtime is closed")
	}
}

// Close ends the spawner's thread; call it once every child it started is gone.
func (s *Spawner) Close() { s.once.Do(func() { close(s.quit) }) }
