package sbinit

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/berth-dev/berth"
)

// Wire protocol between a runtime (host side, Client) and the init inside a sandbox (Serve).
//
// One request per connection, over whatever byte stream the runtime has to the init (the
// process runtime: a unix socket; gVisor: a relay process started with `runsc exec`):
//
//	runtime → init: one line of JSON (wireRequest) ending in '\n'.
//	init → runtime: one line of JSON (wireResponse) ending in '\n', then, for op "read",
//	                exactly Size raw bytes of file content.
//
// Op "write" streams (ISO-3: no whole-body buffering anywhere): after the request line the
// init opens a temporary file beside the target and answers a first response line (an error
// ends the exchange there); the runtime then sends the content as frames — a 4-byte
// big-endian length and that many bytes, at most maxFrameBytes each — ended by a frame of
// length 0; the init renames the temporary file over the target only after that end frame
// and answers a final response line. A connection that ends before the end frame (the
// uploader went away) leaves no file and no partial content behind.
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
	// MaxFileBytes caps one file written or read through the files API, bytes.
	MaxFileBytes   = 64 << 20
	MaxOutputBytes = 1 << 20  // exec stdout and stderr cap, bytes each (a note says what was dropped)
	maxHeaderBytes = 16 << 20 // a JSON header line: up to 2 MiB of output, escaped
	maxFrameBytes  = 1 << 20  // one frame of a streamed write
)

type wireRequest struct {
	Op       string   `json:"op"`
	Cmd      []string `json:"cmd,omitempty"`
	Stdin    string   `json:"stdin,omitempty"`
	TimeoutS int      `json:"timeout_s,omitempty"`
	Path     string   `json:"path,omitempty"`
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

// roundTrip writes the header of req to conn and reads the response header through br (a
// reader of conn). Errors are transport or decoding failures; a response carrying a code is
// returned as is.
func roundTrip(conn net.Conn, br *bufio.Reader, req wireRequest) (wireResponse, error) {
	op := req.Op
	if err := writeRequest(conn, req); err != nil {
		return wireResponse{}, err
	}
	return readResponse(br, op)
}

// writeRequest writes req as one header line. Without HTML escaping, as the replica sends it
// to the agent: an exec's '<' stays one byte in the header the init holds in the sandbox's
// memory, not six (\u003c). Encode ends the line with '\n'. Its own function so that nothing
// of the request — an exec's stdin, up to 3 MiB encoded — stays reachable while the command
// runs (roundTrip waits for the answer for up to the exec's timeout).
func writeRequest(conn net.Conn, req wireRequest) error {
	var head bytes.Buffer
	enc := json.NewEncoder(&head)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return fmt.Errorf("encode %s request: %w", req.Op, err)
	}
	_, err := conn.Write(head.Bytes())
	return err
}

// readResponse reads one response line.
func readResponse(br *bufio.Reader, op string) (wireResponse, error) {
	var resp wireResponse
	line, err := readLine(br, maxHeaderBytes)
	if err != nil {
		return resp, err
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return resp, fmt.Errorf("decode %s response: %w", op, err)
	}
	return resp, nil
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

// writeResponse sends resp as one JSON line.
func writeResponse(w io.Writer, resp wireResponse) error {
	head, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	_, err = w.Write(append(head, '\n'))
	return err
}

// errResponse turns an error inside the init into a response with a berth code.
func errResponse(err error) wireResponse {
	var be *berth.Error
	if errors.As(err, &be) {
		return wireResponse{Code: be.Code, Message: be.Message}
	}
	return wireResponse{Code: berth.EInternal, Message: err.Error()}
}

// writeFrames copies r to w as frames and ends with the empty frame once r says io.EOF. It
// returns how many bytes of content went, and stops with ETooLarge past limit bytes. Any
// other error of r (an upload cut short: io.ErrUnexpectedEOF from an HTTP body) is returned
// as it is, without the end frame, so the init discards the upload.
func writeFrames(w io.Writer, r io.Reader, limit int64) (int64, error) {
	buf := make([]byte, 4+maxFrameBytes)
	var total int64
	for {
		n, err := fill(r, buf[4:])
		if n > 0 {
			total += int64(n)
			if total > limit {
				return total, berth.Errorf(berth.ETooLarge, "file over %d bytes", limit)
			}
			binary.BigEndian.PutUint32(buf[:4], uint32(n))
			if _, werr := w.Write(buf[:4+n]); werr != nil {
				return total, werr
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			binary.BigEndian.PutUint32(buf[:4], 0)
			_, werr := w.Write(buf[:4])
			return total, werr
		default:
			return total, err
		}
	}
}

// fill reads into b until it is full or r fails; unlike io.ReadFull it passes r's own error
// through, so a clean io.EOF is told apart from a stream cut short.
func fill(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// frameReader reads the content of a framed upload; it returns io.EOF after the end frame
// and io.ErrUnexpectedEOF when the stream ends before it.
type frameReader struct {
	r    io.Reader
	left uint32 // bytes left in the current frame
	done bool
}

func (f *frameReader) Read(p []byte) (int, error) {
	if f.done {
		return 0, io.EOF
	}
	if f.left == 0 {
		var h [4]byte
		if _, err := io.ReadFull(f.r, h[:]); err != nil {
			return 0, io.ErrUnexpectedEOF
		}
		f.left = binary.BigEndian.Uint32(h[:])
		if f.left == 0 {
			f.done = true
			return 0, io.EOF
		}
		if f.left > maxFrameBytes {
			return 0, fmt.Errorf("frame of %d bytes is over %d", f.left, maxFrameBytes)
		}
	}
	if uint32(len(p)) > f.left {
		p = p[:f.left]
	}
	n, err := f.r.Read(p)
	f.left -= uint32(n)
	if err != nil && n == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	return n, nil
}
