// Package noop is a runtime that runs nothing. It exists only for `berth bench`, to measure
// the control plane (admission, placement, ledger, store) without the cost of starting real
// sandboxes: every start succeeds at once, every guest measures 0 MiB resident, and exec and
// file calls are refused. Never use it to serve real work.
package noop

import (
	"context"
	"sync"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
)

// Runtime is the no-op runtime. The zero value is ready to use.
type Runtime struct {
	mu   sync.Mutex
	held map[string]bool
}

// Start records id as running.
func (r *Runtime) Start(_ context.Context, id string, _ int64, _ int, _ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held == nil {
		r.held = map[string]bool{}
	}
	r.held[id] = true
	return nil
}

// Stop forgets id; it is idempotent.
func (r *Runtime) Stop(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held, id)
	return nil
}

var errNoop = berth.Errorf(berth.EConflict, "the no-op benchmark runtime runs no processes")

// Exec is refused: there is nothing to run a command in.
func (r *Runtime) Exec(context.Context, string, berth.ExecRequest) (berth.ExecResult, error) {
	return berth.ExecResult{}, errNoop
}

// WriteFile is refused.
func (r *Runtime) WriteFile(context.Context, string, string, []byte) error { return errNoop }

// ReadFile is refused.
func (r *Runtime) ReadFile(context.Context, string, string) ([]byte, error) { return nil, errNoop }

// Measure reports a held guest as seen with 0 MiB resident.
func (r *Runtime) Measure(id string) (agent.Measurement, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held[id] {
		return agent.Measurement{Exited: true}, nil
	}
	return agent.Measurement{Seen: true}, nil
}
