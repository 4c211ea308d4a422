package process

import (
	"context"
	"net"

	"github.com/berth-dev/berth"
)

// Serve starts req.Cmd as the sandbox's one service (APP-1); see sbinit.Client.Serve.
func (r *Runtime) Serve(ctx context.Context, id string, req berth.ServiceRequest) error {
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return err
	}
	return r.client(sb).Serve(ctx, req)
}

// ServiceStatus reports the sandbox's service; see sbinit.Client.ServiceStatus.
func (r *Runtime) ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error) {
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return berth.ServiceStatus{}, err
	}
	return r.client(sb).ServiceStatus(ctx)
}

// Dial opens a TCP connection to 127.0.0.1:port inside the sandbox (its own network
// namespace with isolation, the host's without), carried over the init's socket; see
// sbinit.Client.DialPort.
func (r *Runtime) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, berth.Errorf(berth.EInvalidRequest, "port %d is not in 1..65535", port)
	}
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	return r.client(sb).DialPort(ctx, port)
}
