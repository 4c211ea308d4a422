package sbinit

import (
	"context"
	"io"
	"net"

	"github.com/berth-dev/berth"
)

// Ops gives a runtime driver its sandbox calls — exec, files, the app service, port dials,
// the health ping — over the Client that Client returns for a sandbox id (a driver embeds
// Ops and supplies how it reaches a sandbox's init). The contracts are Client's; Client's
// own errors (sandbox_not_found for an unknown id) come first.
type Ops struct {
	Client func(ctx context.Context, id string) (*Client, error)
}

// Exec runs a command in sandbox id; see Client.Exec.
func (o Ops) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	c, err := o.Client(ctx, id)
	if err != nil {
		return berth.ExecResult{}, err
	}
	return c.Exec(ctx, req)
}

// WriteFile streams content into path in sandbox id; see Client.WriteFile.
func (o Ops) WriteFile(ctx context.Context, id, path string, content io.Reader) error {
	c, err := o.Client(ctx, id)
	if err != nil {
		return err
	}
	return c.WriteFile(ctx, path, content)
}

// ReadFile streams path of sandbox id; see Client.ReadFile.
func (o Ops) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	c, err := o.Client(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	return c.ReadFile(ctx, path)
}

// Serve starts sandbox id's one service (APP-1); see Client.Serve.
func (o Ops) Serve(ctx context.Context, id string, req berth.ServiceRequest) error {
	c, err := o.Client(ctx, id)
	if err != nil {
		return err
	}
	return c.Serve(ctx, req)
}

// ServiceStatus reports sandbox id's service; see Client.ServiceStatus.
func (o Ops) ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error) {
	c, err := o.Client(ctx, id)
	if err != nil {
		return berth.ServiceStatus{}, err
	}
	return c.ServiceStatus(ctx)
}

// Dial connects to 127.0.0.1:port on sandbox id's own loopback; see Client.DialPort.
func (o Ops) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, berth.Errorf(berth.EInvalidRequest, "port %d is not in 1..65535", port)
	}
	c, err := o.Client(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.DialPort(ctx, port)
}

// Ping checks that sandbox id's init answers (PAUSE-2's health check).
func (o Ops) Ping(ctx context.Context, id string) error {
	c, err := o.Client(ctx, id)
	if err != nil {
		return err
	}
	return c.Ping(ctx)
}
