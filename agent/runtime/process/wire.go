package process

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/berth-dev/berth"
)

// Wire protocol between the runtime (host side) and the init inside a sandbox.
//
// One request per connection over the unix socket <Dir>/<id>/init.sock:
//
//	runtime → init: one line of JSON (wireRequest) ending in '\n', then, for op "write",
//	                exactly Size raw bytes of file content.
//	init → runtime: one line of JSON (wireResponse) ending in '\n', then, for op "read",
//	                exactly Size raw bytes of file content.
//
// JSON escapes every newline inside strings, so a header is always exactly one line. A
// response with a non-empty Code is an error (a berth error code and its message). For "exec"
// the init watches the connection: if the runtime closes it early (its context ended), the
// command's process group is killed.
//
// App services (APP-1): "serve" starts req.Cmd (with req.Env) as the sandbox's one
// long-running service and answers at once; "status" answers its Started, Exited, ExitCode
// and Output. "dial" carries a Port: the init dials 127.0.0.1:Port inside the sandbox's network
// namespace and answers an OK line (or app_unreachable / service_exited); after an OK line the
// connection carries raw bytes both ways between the runtime and the app until either side
// closes, and a half-close (CloseWrite) on one side reaches the other.
const (
	opPing   = "ping"
	opExec   = "exec"
	opWrite  = "write"
	opRead   = "read"
	opServe  = "serve"
	opStatus = "status"
	opDial   = "dial"
)

// Limits of the protocol.
const (
	maxFileBytes   = 64 << 20 // WriteFile/ReadFile payload cap, bytes
	maxOutputBytes = 1 << 20  // exec stdout and stderr cap, bytes each
	maxHeaderBytes = 16 << 20 // a JSON header line: up to 2 MiB of output, escaped
)

type wireRequest struct {
	Op       string   `json:"op"`
	Cmd      []string `json:"cmd,omitempty"`
	Stdin    string   `json:"stdin,omitempty"`
	TimeoutS int      `json:"timeout_s,omitempty"`
	Path     string   `json:"path,omitempty"`
	Size     int64    `json:"size,omitempty"`
	// Env is added to a service's environment (op serve).
	Env map[string]string `json:"env,omitempty"`
	// Port is the TCP port on the sandbox's 127.0.0.1 to dial (op dial).
	Port int `json:"port,omitempty"`
}

type wireResponse struct {
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout,omitempty"`
	Stderr   string `json:"stderr,omitempty"`
	Size     int64  `json:"size,omitempty"`
	// Service state (op status).
	Started bool   `json:"started,omitempty"`
	Exited  bool   `json:"exited,omitempty"`
	Output  string `json:"output,omitempty"`
}

// call sends one request (and body, for writes) to the init of sb and returns its response
// and, for reads, the payload. A response carrying a code becomes a *berth.Error; a broken
// connection to an init that has exited becomes ESandboxNotFound.
func (r *Runtime) call(ctx context.Context, sb *sandbox, req wireRequest, body []byte) (wireResponse, []byte, error) {
	var resp wireResponse
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sb.sock)
	if err != nil {
		return resp, nil, r.callErr(ctx, sb, req.Op, err)
	}
	defer conn.Close()
	// Closing the connection is how a cancelled context reaches the init.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	br := bufio.NewReader(io.LimitReader(conn, maxHeaderBytes+maxFileBytes))
	resp, err = roundTrip(conn, br, req, body)
	if err != nil {
		return resp, nil, r.callErr(ctx, sb, req.Op, err)
	}
	if resp.Code != "" {
		return resp, nil, &berth.Error{Code: resp.Code, Message: resp.Message}
	}
	if req.Op != opRead {
		return resp, nil, nil
	}
	if resp.Size < 0 || resp.Size > maxFileBytes {
		return resp, nil, fmt.Errorf("process: read response of %d bytes is out of range", resp.Size)
	}
	data := make([]byte, resp.Size)
	if _, err := io.ReadFull(br, data); err != nil {
		return resp, nil, r.callErr(ctx, sb, req.Op, err)
	}
	return resp, data, nil
}

// roundTrip writes the header of req and body to conn and reads the response header through
// br (a reader of conn). Errors are transport or decoding failures; a response carrying a
// code is returned as is.
func roundTrip(conn net.Conn, br *bufio.Reader, req wireRequest, body []byte) (wireResponse, error) {
	var resp wireResponse
	head, err := json.Marshal(req)
	if err != nil {
		return resp, fmt.Errorf("encode %s request: %w", req.Op, err)
	}
	w := bufio.NewWriter(conn)
	w.Write(head)
	w.WriteByte('\n')
	w.Write(body)
	if err := w.Flush(); err != nil {
		return resp, err
	}
	line, err := readLine(br, maxHeaderBytes)
	if err != nil {
		return resp, err
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return resp, fmt.Errorf("decode %s response: %w", req.Op, err)
	}
	return resp, nil
}

// callErr explains a transport failure: the caller's context ending wins, then the sandbox
// having ended (ESandboxNotFound), else the raw error wrapped.
func (r *Runtime) callErr(ctx context.Context, sb *sandbox, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("process: %s in sandbox %s: %w", op, sb.id, ctx.Err())
	}
	if sb.hasExited() || !r.holds(sb) {
		return berth.Errorf(berth.ESandboxNotFound, "sandbox %s has ended", sb.id)
	}
	return fmt.Errorf("process: %s in sandbox %s: %w", op, sb.id, err)
}

// readLine reads one '\n'-terminated line of at most limit bytes and returns it without the
// newline.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var buf bytes.Buffer
	for {
		chunk, err := br.ReadSlice('\n')
		if buf.Len()+len(chunk) > limit {
			return nil, fmt.Errorf("header line longer than %d bytes", limit)
		}
		buf.Write(chunk)
		if err == nil {
			return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// writeResponse sends resp as one JSON line followed by payload.
func writeResponse(w io.Writer, resp wireResponse, payload []byte) error {
	head, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	bw.Write(head)
	bw.WriteByte('\n')
	bw.Write(payload)
	return bw.Flush()
}

// errResponse turns an error inside the init into a response with a berth code.
func errResponse(err error) wireResponse {
	var be *berth.Error
	if errors.As(err, &be) {
		return wireResponse{Code: be.Code, Message: be.Message}
	}
	return wireResponse{Code: berth.EInternal, Message: err.Error()}
}
