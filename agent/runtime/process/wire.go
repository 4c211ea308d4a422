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
const (
	opPing  = "ping"
	opExec  = "exec"
	opWrite = "write"
	opRead  = "read"
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
}

type wireResponse struct {
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout,omitempty"`
	Stderr   string `json:"stderr,omitempty"`
	Size     int64  `json:"size,omitempty"`
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

	head, err := json.Marshal(req)
	if err != nil {
		return resp, nil, fmt.Errorf("process: encode %s request: %w", req.Op, err)
	}
	w := bufio.NewWriter(conn)
	w.Write(head)
	w.WriteByte('\n')
	w.Write(body)
	if err := w.Flush(); err != nil {
		return resp, nil, r.callErr(ctx, sb, req.Op, err)
	}

	br := bufio.NewReader(io.LimitReader(conn, maxHeaderBytes+maxFileBytes))
	line, err := readLine(br, maxHeaderBytes)
	if err != nil {
		return resp, nil, r.callErr(ctx, sb, req.Op, err)
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return resp, nil, fmt.Errorf("process: decode %s response: %w", req.Op, err)
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
