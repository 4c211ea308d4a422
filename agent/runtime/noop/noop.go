// Package noop is a runtime that runs nothing. It exists only for `berth bench`, to measure
// the control plane (admission, placement, ledger, store) without the cost of starting real
// sandboxes: every start succeeds at once, every guest measures 0 MiB resident, and exec and
// file calls are refused. Never use it to serve real work.
//
// App services (APP-1) are bookkeeping only, so the app reconciler can be driven against
// noop agents (benchmarks, replica tests): Serve records a service that then reports
// started and never exits, a second Serve is service_running, Stop forgets it. There is no
// app to talk to, so Dial is unsupported (the agent answers 501).
package noop

import (
	"context"
	"io"
	"net"
	"sync"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
)

// Runtime is the no-op runtime. The zero value is ready to use.
type Runtime struct {
	mu       sync.Mutex
	held     map[string]bool
	services map[string]bool // sandboxes whose service was started
}

// Start records id as running.
func (r *Runtime) Start(_ context.Context, s agent.Spec) error {
	id := s.ID
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
	delete(r.services, id)
	return nil
}

var errNoop = berth.Errorf(berth.EConflict, "the no-op benchmark runtime runs no processes")

// Exec is refused: there is nothing to run a command in.
func (r *Runtime) Exec(context.Context, string, berth.ExecRequest) (berth.ExecResult, error) {
	return berth.ExecResult{}, errNoop
}

// WriteFile is refused.
func (r *Runtime) WriteFile(context.Context, string, string, io.Reader) error { return errNoop }

// ReadFile is refused.
func (r *Runtime) ReadFile(context.Context, string, string) (io.ReadCloser, int64, error) {
	return nil, 0, errNoop
}

// Measure reports a held guest as seen with 0 MiB resident.
func (r *Runtime) Measure(id string) (agent.Measurement, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held[id] {
		return agent.Measurement{Exited: true}, nil
	}
	return agent.Measurement{Seen: true}, nil
}

var _ agent.Services = (*Runtime)(nil)

// Serve records a service for a held sandbox. Errors: invalid_request (empty cmd),
// service_running, sandbox_not_found.
func (r *Runtime) Serve(_ context.Context, id string, req berth.ServiceRequest) error {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return berth.Errorf(berth.EInvalidRequest, "cmd must not be empty")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.held[id]:
		return berth.Errorf(berth.ESandboxNotFound, "no sandbox %s on this host", id)
	case r.services[id]:
		return berth.Errorf(berth.EServiceRunning, "sandbox %s already runs its service", id)
	}
	if r.services == nil {
		r.services = map[string]bool{}
	}
	r.services[id] = true
	return nil
}

// ServiceStatus reports a recorded service as started and running. Errors: sandbox_not_found.
func (r *Runtime) ServiceStatus(_ context.Context, id string) (berth.ServiceStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held[id] {
		return berth.ServiceStatus{}, berth.Errorf(berth.ESandboxNotFound, "no sandbox %s on this host", id)
	}
	return berth.ServiceStatus{Started: r.services[id]}, nil
}

// Dial is unsupported: there is no app behind the bookkeeping.
func (r *Runtime) Dial(context.Context, string, int) (net.Conn, error) {
	return nil, berth.Errorf(berth.EUnsupported, "the no-op benchmark runtime runs no apps to connect to")
}
