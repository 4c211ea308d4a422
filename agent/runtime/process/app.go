package process

import (
	"bufio"
	"context"
	"fmt"
	"net"

	"github.com/berth-dev/berth"
)

// Serve starts req.Cmd as the sandbox's one service (APP-1) and returns at once: detached in
// its own process group, cwd the sandbox's working directory (/tmp with isolation, as Exec),
// environment as Exec's plus req.Env (req.Env wins), stdin /dev/null, stdout and stderr kept
// together as a tail of berth.ServiceOutputTail bytes (ServiceStatus.Output). It runs until it
// exits or the sandbox stops; once it has exited a new Serve may start it again. A command
// that is not found is not an error: ServiceStatus reports it exited with 127 (126 when it
// cannot be executed) and says why in Output. Errors: EInvalidRequest (empty cmd, bad env
// name), EServiceRunning (a service runs already), ESandboxNotFound.
func (r *Runtime) Serve(ctx context.Context, id string, req berth.ServiceRequest) error {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return berth.Errorf(berth.EInvalidRequest, "cmd must not be empty")
	}
	for k, v := range req.Env {
		if err := validEnv(k, v); err != nil {
			return err
		}
	}
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return err
	}
	_, _, err = r.call(ctx, sb, wireRequest{Op: opServe, Cmd: req.Cmd, Env: req.Env}, nil)
	return err
}

// ServiceStatus reports the sandbox's service: whether one was started, whether the latest
// run exited and with which code (128+signal when a signal killed it), and the tail of its
// output. Errors: ESandboxNotFound.
func (r *Runtime) ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error) {
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return berth.ServiceStatus{}, err
	}
	resp, _, err := r.call(ctx, sb, wireRequest{Op: opStatus}, nil)
	if err != nil {
		return berth.ServiceStatus{}, err
	}
	return berth.ServiceStatus{Started: resp.Started, Exited: resp.Exited, ExitCode: resp.ExitCode, Output: resp.Output}, nil
}

// Dial opens a TCP connection to 127.0.0.1:port inside the sandbox (its own network
// namespace with isolation, the host's without), carried over the init's socket. The
// connection is a byte stream to the app; it supports CloseWrite (a half-close reaches the
// app) and outlives ctx, which only bounds the dial. Errors: EInvalidRequest (port not in
// 1..65535), EUpstream (nothing answers on the port), EServiceExited (nothing answers and the
// service has exited: the message carries its exit code and output tail), ESandboxNotFound.
func (r *Runtime) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, berth.Errorf(berth.EInvalidRequest, "port %d is not in 1..65535", port)
	}
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sb.sock)
	if err != nil {
		return nil, r.callErr(ctx, sb, opDial, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	br := bufio.NewReader(conn)
	resp, err := roundTrip(conn, br, wireRequest{Op: opDial, Port: port}, nil)
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("process: dial port %d in sandbox %s: %w", port, id, ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, r.callErr(ctx, sb, opDial, err)
	}
	if resp.Code != "" {
		conn.Close()
		return nil, &berth.Error{Code: resp.Code, Message: resp.Message}
	}
	return &appConn{Conn: conn, r: br}, nil
}

// appConn is the init's socket after a dial's OK line. Reads go through the reader that read
// that line, so bytes an app sent first (a greeting) that arrived with it are not lost. Only
// net.Conn's methods are promoted, so no io.WriterTo of the socket can bypass the reader.
type appConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *appConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection: the app reads EOF and may still answer.
func (c *appConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("process: %T cannot half-close", c.Conn)
}
