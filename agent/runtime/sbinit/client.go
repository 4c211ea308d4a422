package sbinit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/berth-dev/berth"
)

// Client is the host side of one sandbox's init. Dial opens a fresh byte stream to the init
// (one request per stream); Gone reports whether the sandbox has ended, so a broken stream
// to a dead sandbox becomes sandbox_not_found instead of a transport error. Label names the
// sandbox in messages ("process: sandbox X"). Safe for concurrent use.
type Client struct {
	Dial  func(ctx context.Context) (net.Conn, error)
	Gone  func() bool
	Label string
}

// call sends req on a new stream and reads the response line. A response carrying a code
// becomes a *berth.Error. The stream is returned open (with its reader) when keep is true
// and the call succeeded; otherwise it is closed.
func (c *Client) call(ctx context.Context, req wireRequest, keep bool) (wireResponse, net.Conn, *bufio.Reader, error) {
	op := req.Op // req is not used past roundTrip: an exec's stdin is not kept while it runs
	conn, err := c.Dial(ctx)
	if err != nil {
		return wireResponse{}, nil, nil, c.transportErr(ctx, op, err)
	}
	// Closing the stream is how a cancelled context reaches the init.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	br := bufio.NewReader(conn)
	resp, err := roundTrip(conn, br, req)
	if !stop() {
		conn.Close()
		return resp, nil, nil, c.transportErr(ctx, op, ctx.Err())
	}
	if err != nil {
		conn.Close()
		return resp, nil, nil, c.transportErr(ctx, op, err)
	}
	if resp.Code != "" {
		conn.Close()
		return resp, nil, nil, initError(resp)
	}
	if !keep {
		conn.Close()
		return resp, nil, nil, nil
	}
	return resp, conn, br, nil
}

// initCodes are the codes an init answers with (errResponse and the ops of this package).
// The init runs inside the sandbox, where the guest can stand in for it (its socket is the
// guest's to move), so no other code is taken from it: a guest answering rate_limited after
// its command ran made the SDKs, which resend any call refused with rate_limited, run the
// command again on every retry (found by an attack).
var initCodes = map[string]bool{
	berth.EInvalidRequest: true, berth.ENotFound: true, berth.EForbidden: true, berth.ETooLarge: true,
	berth.EConflict: true, berth.EServiceRunning: true, berth.EServiceExited: true, berth.EUpstream: true,
	berth.EInternal: true,
}

// initError is the error of an init's answer with a code. A code the init never sends is
// reported as an internal failure of the init, with what it said, so the agent answers it as
// a sandbox whose init misbehaves (conflict), never as a refusal of Berth's own.
func initError(resp wireResponse) error {
	msg := initMessage(resp.Message)
	if initCodes[resp.Code] {
		return &berth.Error{Code: resp.Code, Message: msg}
	}
	return berth.Errorf(berth.EInternal, "the sandbox's init answered code %.64q, which it never sends: %s", resp.Code, msg)
}

// maxInitMessage bounds an init's error message, bytes. A guest standing in for its init
// could answer with a message of megabytes: past the 64 KiB the replica reads of an agent's
// error, the answer no longer decoded and an exec that had run was reported as the agent
// unavailable, retryable (found by an attack). An init's own messages are far shorter; a
// service's output tail (service_exited) is at most ServiceOutputTail.
const maxInitMessage = 8 << 10

// initMessage is an init's error message as the agent passes it on: valid UTF-8, with
// every control character but a line break or a tab shown escaped (\x1b), so a guest's
// message cannot clear or rewrite the terminal of whoever reads it (found by an attack: ESC
// sequences and BEL reached the CLI as they were), then cut to maxInitMessage bytes.
func initMessage(m string) string {
	m = strings.ToValidUTF8(m, "\uFFFD")
	if strings.ContainsFunc(m, isEscapable) {
		var b strings.Builder
		for _, r := range m {
			if isEscapable(r) {
				fmt.Fprintf(&b, "\\x%02x", r)
			} else {
				b.WriteRune(r)
			}
		}
		m = b.String()
	}
	if len(m) > maxInitMessage {
		m = strings.ToValidUTF8(m[:maxInitMessage], "") + " … (cut)"
	}
	return m
}

// isEscapable reports a control character other than a line break or a tab.
func isEscapable(r rune) bool {
	return unicode.IsControl(r) && r != '\n' && r != '\t'
}

// transportErr explains a transport failure: the caller's context ending wins, then the
// sandbox having ended (ESandboxNotFound), else the raw error wrapped.
func (c *Client) transportErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %s: %w", c.Label, op, ctx.Err())
	}
	if c.Gone != nil && c.Gone() {
		return berth.Errorf(berth.ESandboxNotFound, "%s has ended", c.Label)
	}
	return fmt.Errorf("%s: %s: %w", c.Label, op, err)
}

// Ping checks that the init answers (the health check before a snapshot, PAUSE-2).
func (c *Client) Ping(ctx context.Context) error {
	_, _, _, err := c.call(ctx, wireRequest{Op: opPing}, false)
	return err
}

// Exec runs req.Cmd inside the sandbox and returns when the command exits; background
// processes it started keep running. Stdout and stderr are capped at 1 MiB each (a note on
// stderr says what was dropped). TimeoutS defaults to 60 s; a timeout is not an error: the
// process group is killed, the exit code is -1 and stderr ends with a note. A signal death
// gives 128+signal, an unknown command 127. Errors: EInvalidRequest (empty cmd, negative
// timeout), ESandboxNotFound; a cancelled ctx kills the command and returns ctx's error
// wrapped.
func (c *Client) Exec(ctx context.Context, req berth.ExecRequest) (berth.ExecResult, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return berth.ExecResult{}, berth.Errorf(berth.EInvalidRequest, "cmd must not be empty")
	}
	if req.TimeoutS < 0 {
		return berth.ExecResult{}, berth.Errorf(berth.EInvalidRequest, "timeout_s must not be negative")
	}
	resp, _, _, err := c.call(ctx, wireRequest{Op: opExec, Cmd: req.Cmd, Stdin: req.Stdin, TimeoutS: req.TimeoutS}, false)
	if err != nil {
		return berth.ExecResult{}, err
	}
	return berth.ExecResult{ExitCode: resp.ExitCode, Stdout: resp.Stdout, Stderr: resp.Stderr}, nil
}

// WriteFile streams r into path as the sandbox sees it (ISO-3: resolved inside the
// sandbox's root), creating parent directories; the file appears whole or not at all, at
// most MaxFileBytes. An error reading r (the uploader went away) abandons the upload and
// leaves nothing written. Errors: EInvalidRequest (relative path, a directory, an upload
// cut short), ETooLarge, EForbidden, ENotFound, ESandboxNotFound, and r's own error.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader) error {
	if err := checkPath(path); err != nil {
		return err
	}
	_, conn, br, err := c.call(ctx, wireRequest{Op: opWrite, Path: path}, true)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if _, err := writeFrames(conn, r, MaxFileBytes); err != nil {
		if berth.ErrorCode(err) != berth.EInternal {
			return err
		}
		// The init may have refused part-way (a full disk): its answer says why.
		if resp, rerr := readResponse(br, opWrite); rerr == nil && resp.Code != "" {
			return initError(resp)
		}
		return c.transportErr(ctx, opWrite, err)
	}
	resp, err := readResponse(br, opWrite)
	if err != nil {
		return c.transportErr(ctx, opWrite, err)
	}
	if resp.Code != "" {
		return initError(resp)
	}
	return nil
}

// ReadFile opens path as the sandbox sees it and returns a stream of its content and its
// size in bytes (at most MaxFileBytes); the caller closes the stream. A stream that ends
// before size bytes reports io.ErrUnexpectedEOF. Errors: EInvalidRequest (relative path,
// directory, FIFO), ENotFound, EForbidden, ETooLarge, ESandboxNotFound.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	if err := checkPath(path); err != nil {
		return nil, 0, err
	}
	resp, conn, br, err := c.call(ctx, wireRequest{Op: opRead, Path: path}, true)
	if err != nil {
		return nil, 0, err
	}
	if resp.Size < 0 || resp.Size > MaxFileBytes {
		conn.Close()
		return nil, 0, fmt.Errorf("%s: read response of %d bytes is out of range", c.Label, resp.Size)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	return &sizedReader{r: io.LimitReader(br, resp.Size), left: resp.Size, close: func() error { stop(); return conn.Close() }}, resp.Size, nil
}

// sizedReader reads exactly left bytes, or fails with io.ErrUnexpectedEOF.
type sizedReader struct {
	r     io.Reader
	left  int64
	close func() error
}

func (s *sizedReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.left -= int64(n)
	if errors.Is(err, io.EOF) && s.left > 0 {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (s *sizedReader) Close() error { return s.close() }

func checkPath(path string) error {
	if !filepath.IsAbs(path) {
		return berth.Errorf(berth.EInvalidRequest, "path %q must be absolute", path)
	}
	return nil
}

// Serve starts req.Cmd as the sandbox's one service (APP-1) and returns at once: detached in
// its own process group, cwd the sandbox's working directory, environment as Exec's plus
// req.Env (req.Env wins), stdin /dev/null, stdout and stderr kept together as a tail of
// berth.ServiceOutputTail bytes. A command that is not found is not an error: ServiceStatus
// reports it exited with 127 (126 when it cannot be executed). Errors: EInvalidRequest
// (empty cmd, bad env name), EServiceRunning, ESandboxNotFound.
func (c *Client) Serve(ctx context.Context, req berth.ServiceRequest) error {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return berth.Errorf(berth.EInvalidRequest, "cmd must not be empty")
	}
	for k, v := range req.Env {
		if err := validEnv(k, v); err != nil {
			return err
		}
	}
	_, _, _, err := c.call(ctx, wireRequest{Op: opServe, Cmd: req.Cmd, Env: req.Env}, false)
	return err
}

// ServiceStatus reports the sandbox's service: whether one was started, whether the latest
// run exited and with which code (128+signal when a signal killed it), and the tail of its
// output. Errors: ESandboxNotFound.
func (c *Client) ServiceStatus(ctx context.Context) (berth.ServiceStatus, error) {
	resp, _, _, err := c.call(ctx, wireRequest{Op: opStatus}, false)
	if err != nil {
		return berth.ServiceStatus{}, err
	}
	return berth.ServiceStatus{Started: resp.Started, Exited: resp.Exited, ExitCode: resp.ExitCode, Output: resp.Output}, nil
}

// DialPort opens a TCP connection to 127.0.0.1:port inside the sandbox, carried through the
// init. The connection is a byte stream to the app; it supports CloseWrite (a half-close
// reaches the app) when the underlying stream does, and outlives ctx, which only bounds the
// dial. Errors: EInvalidRequest (port not in 1..65535), EUpstream (nothing answers on the
// port), EServiceExited (nothing answers and the service has exited: the message carries
// its exit code and output tail), ESandboxNotFound.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, berth.Errorf(berth.EInvalidRequest, "port %d is not in 1..65535", port)
	}
	_, conn, br, err := c.call(ctx, wireRequest{Op: opDial, Port: port}, true)
	if err != nil {
		return nil, err
	}
	return &appConn{Conn: conn, r: br}, nil
}

// appConn is the init's stream after a dial's OK line. Reads go through the reader that read
// that line, so bytes an app sent first (a greeting) that arrived with it are not lost. Only
// net.Conn's methods are promoted, so no io.WriterTo of the stream can bypass the reader.
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
	return fmt.Errorf("sbinit: %T cannot half-close", c.Conn)
}
