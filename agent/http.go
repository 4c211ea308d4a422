package agent

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
)

// File bodies are capped at 64 MiB (sbinit.MaxFileBytes); JSON bodies at 1 MiB, an exec's
// at maxForwardedExecBytes.
const (
	maxFileBytes = 64 << 20
	maxJSONBytes = berth.MaxJSONBodyBytes
	// maxForwardedExecBytes bounds an exec body from a replica: the API took at most
	// MaxJSONBodyBytes from the caller, and the replica re-encodes it without HTML escaping —
	// a byte of the caller's JSON comes out as at most three (an invalid UTF-8 byte becomes
	// U+FFFD; U+2028 written raw becomes \u2028, 6 bytes for 3) — and adds the default
	// timeout_s. Held to the API's own bound, an exec the API accepted was refused here with
	// 413 (found by a new user's helper: 1,048,562 bytes without timeout_s).
	maxForwardedExecBytes = 3*berth.MaxJSONBodyBytes + 4096
)

// Handler returns the agent's internal API. Every call carries the replicas' call token for
// this agent in X-Berth-Agent-Call (or, from older servers, the node token in X-Node-Token),
// compared in constant time (AGT-5, authenticate):
//
//	POST   /internal/sandboxes                 berth.AgentCreate → 201
//	DELETE /internal/sandboxes/{id}            → 204 (idempotent); ?boot=B&incarnation=N
//	                                           stops only that copy (409 conflict for
//	                                           another, or another boot; AGT-6)
//	POST   /internal/sandboxes/{id}/exec       berth.ExecRequest → 200 berth.ExecResult
//	PUT    /internal/sandboxes/{id}/files?path → 204;  GET → 200 raw bytes
//	POST   /internal/drain?reason=, /internal/undrain → 202 / 200 (400 invalid_request for a
//	                                           reason berth.CheckReason refuses)
//	GET    /internal/heartbeat                 → 200 berth.Heartbeat (what the agent would send now)
//	POST   /internal/sandboxes/{id}/checkpoint berth.CheckpointRequest → 200 berth.CheckpointResult
//	                                           (PAUSE-1; 501 unsupported without the capability)
//
// App services (APP-1), for sandboxes this agent holds; 501 unsupported when the runtime
// has no Services (see Services):
//
//	POST   /internal/sandboxes/{id}/service    berth.ServiceRequest → 204 (400 invalid_request
//	                                           for an empty cmd, 409 service_running, 404)
//	GET    /internal/sandboxes/{id}/service    → 200 berth.ServiceStatus
//	any    /internal/sandboxes/{id}/port/{port}/{path...}
//	                                           reverse proxy to http://127.0.0.1:{port}/{path}
//	                                           inside the sandbox, query kept, X-Node-Token
//	                                           never forwarded (see handleApp); 400 for a port
//	                                           outside 1..65535; 502 app_unreachable or
//	                                           service_exited when the app does not answer
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal/sandboxes", a.handleCreate)
	mux.HandleFunc("DELETE /internal/sandboxes/{id}", a.handleDelete)
	mux.HandleFunc("POST /internal/sandboxes/{id}/exec", a.handleExec)
	mux.HandleFunc("PUT /internal/sandboxes/{id}/files", a.handleWriteFile)
	mux.HandleFunc("GET /internal/sandboxes/{id}/files", a.handleReadFile)
	mux.HandleFunc("POST /internal/drain", a.handleDrain)
	mux.HandleFunc("POST /internal/undrain", func(w http.ResponseWriter, r *http.Request) {
		a.Undrain()
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /internal/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		httpjson.WriteJSON(w, http.StatusOK, a.Heartbeat(time.Now()))
	})
	mux.HandleFunc("POST /internal/sandboxes/{id}/checkpoint", a.handleCheckpoint)
	mux.HandleFunc("POST /internal/sandboxes/{id}/service", a.handleServe)
	mux.HandleFunc("GET /internal/sandboxes/{id}/service", a.handleServiceStatus)
	// App requests bypass the mux: it would clean their paths ("//", "..") and redirect,
	// which is not a proxy's business.
	root := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, port, rest, ok := appRoute(r.URL.EscapedPath()); ok {
			a.handleApp(w, r, id, port, rest)
			return
		}
		mux.ServeHTTP(w, r)
	})
	return a.public(httpjson.EchoRequestID(a.authenticate(root)))
}

// authenticate admits the servers' calls (AGT-5): HeaderAgentCall holding the call token for
// this agent's own id and address (berth.AgentCallToken), or — from a server of an older release —
// HeaderNodeToken holding the node token itself.
func (a *Agent) authenticate(next http.Handler) http.Handler {
	token := []byte(a.cfg.NodeToken)
	call := []byte(berth.AgentCallToken(a.cfg.NodeToken, a.cfg.ID, a.addr))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok := subtle.ConstantTimeCompare([]byte(r.Header.Get(berth.HeaderAgentCall)), call) == 1 ||
			subtle.ConstantTimeCompare([]byte(r.Header.Get(berth.HeaderNodeToken)), token) == 1
		if len(token) == 0 || !ok {
			a.writeError(w, r, berth.Errorf(berth.EUnauthorized, "missing or wrong agent-call token"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// writeError answers err as an API-2 error body, keeping the calling server's request id, and
// logs it with that id when it is a 5xx (issue 15: every 5xx is logged; a 500's cause is only
// in the log).
func (a *Agent) writeError(w http.ResponseWriter, r *http.Request, err error) {
	httpjson.LogError(a.log, w, r, "", err)
	httpjson.WriteError(w, "", err)
}

func (a *Agent) handleCreate(w http.ResponseWriter, r *http.Request) {
	var c berth.AgentCreate
	if err := httpjson.Decode(w, r, maxJSONBytes, &c); err != nil {
		a.writeError(w, r, err)
		return
	}
	if err := a.Create(r.Context(), c); err != nil {
		a.log.Info("create refused", "sandbox", c.ID, "err", err)
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// handleDrain is POST /internal/drain?reason= (AGT-5): the reason is held to the bound the
// server holds an operator's to (berth.CheckReason: at most 512 bytes of UTF-8, no NUL), since
// it goes into the agent's heartbeats and from there into events; a refused reason drains
// nothing.
func (a *Agent) handleDrain(w http.ResponseWriter, r *http.Request) {
	// A query Go cannot parse loses the pair it cannot read, and a second reason would be
	// dropped: refused, not drained without the reason the caller sent.
	q, err := httpjson.Query(r.URL.RawQuery)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	reason := q.Get("reason")
	if err := berth.CheckReason(reason); err != nil {
		a.writeError(w, r, err)
		return
	}
	a.Drain(reason)
	w.WriteHeader(http.StatusAccepted)
}

// handleDelete is DELETE /internal/sandboxes/{id}[?boot=B&incarnation=N]: 204 once stopped
// (or when there is nothing to stop); with boot and incarnation, 409 conflict for a copy
// that is another incarnation or an agent of another boot (DeleteIncarnation). A query that
// does not parse, a parameter given twice, an incarnation that is not a positive integer, or
// one without its boot (or a boot without it) is 400 invalid_request, and nothing is stopped:
// a query dropped as unparsable would have stopped whatever copy is here.
func (a *Agent) handleDelete(w http.ResponseWriter, r *http.Request) {
	boot, inc, err := deleteCopy(r.URL.RawQuery)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if err := a.DeleteIncarnation(r.Context(), r.PathValue("id"), boot, inc); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// deleteCopy reads a delete's query (handleDelete): the boot and incarnation it names, both
// or neither ("" and 0: any copy). Errors: invalid_request.
func deleteCopy(raw string) (boot string, inc int64, err error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return "", 0, berth.Errorf(berth.EInvalidRequest, "the query does not parse: %v", err)
	}
	for k, v := range q {
		if len(v) > 1 {
			return "", 0, berth.Errorf(berth.EInvalidRequest, "%s is given %d times", k, len(v))
		}
	}
	if !q.Has("incarnation") && !q.Has("boot") {
		return "", 0, nil
	}
	inc, err = strconv.ParseInt(q.Get("incarnation"), 10, 64)
	if err != nil || inc <= 0 || q.Get("boot") == "" {
		return "", 0, berth.Errorf(berth.EInvalidRequest, "boot and incarnation go together: a boot id and a positive integer")
	}
	return q.Get("boot"), inc, nil
}

func (a *Agent) handleExec(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	release, err := a.holdExec(r, id)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	defer release()
	var req berth.ExecRequest
	// DecodeBinary: stdin may be binary.
	if err := httpjson.DecodeBinary(w, r, maxForwardedExecBytes, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	if err := a.held(id); err != nil {
		a.writeError(w, r, err)
		return
	}
	res, err := a.rt.Exec(r.Context(), id, req)
	if err != nil {
		a.writeError(w, r, a.runtimeErr(id, "exec", err))
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, res)
}

// execShare is the part of a sandbox's memory its execs' requests may hold at once at the
// agent: the init holds each exec's request three to four times over while it runs (the
// header line, its decoded stdin, the pipe's copy), so a burst of large execs killed its
// own sandbox (150 execs of 900 KB, a 2 GiB sandbox under gVisor).
const execShare = 16

// holdExec counts r's body (its Content-Length, or the most a forwarded exec may be) against
// the execs in flight of sandbox id (1/execShare of its memory) and of this agent
// (Config.ExecInflightMiB) until release, before the body is read. Over either:
// rate_limited (429), retry after 1 s, which the replica passes on.
func (a *Agent) holdExec(r *http.Request, id string) (release func(), err error) {
	n := r.ContentLength
	if n < 0 || n > maxForwardedExecBytes {
		n = maxForwardedExecBytes
	}
	a.mu.Lock()
	g, ok := a.guests[id]
	var memMiB int64
	if ok {
		memMiB = g.spec.MemoryMiB
	}
	a.mu.Unlock()
	if !ok {
		return nil, a.held(id) // sandbox_not_found, as the exec itself would answer
	}
	perSandbox := max(memMiB<<20/execShare, 1)
	release, ok = a.execs.Take(id, n, perSandbox)
	if ok {
		return release, nil
	}
	// The message names what the caller's own sandbox holds, never what the host holds for
	// other tenants (found by an attack: a byte count of everyone's execs is a side channel).
	mine := a.execs.Held(id)
	msg := fmt.Sprintf("agent %s holds as many exec requests as it takes at once (--exec-inflight-mb %d)", a.cfg.ID, a.cfg.ExecInflightMiB)
	if mine+n > perSandbox {
		msg = fmt.Sprintf("sandbox %s has %d KiB of exec requests in flight and this one needs %d KiB, over the 1/%d of its %d MiB its host takes for it",
			id, mine>>10, n>>10, execShare, memMiB)
	}
	e := berth.Errorf(berth.ERateLimited, "%s; retry when one ends", msg)
	e.RetryAfter = time.Second
	return nil, e
}

// handleWriteFile streams the request body into the sandbox (ISO-3): nothing is buffered
// whole, and a body cut short (the caller went away) writes nothing.
func (a *Agent) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.held(id); err != nil {
		a.writeError(w, r, err)
		return
	}
	if r.ContentLength > maxFileBytes {
		a.writeError(w, r, berth.Errorf(berth.ETooLarge, "file of %d bytes is over %d", r.ContentLength, maxFileBytes))
		return
	}
	body := http.MaxBytesReader(w, r.Body, maxFileBytes)
	err := a.rt.WriteFile(r.Context(), id, r.URL.Query().Get("path"), body)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		err = berth.Errorf(berth.ETooLarge, "file over %d bytes", maxFileBytes)
	}
	if err != nil {
		a.writeError(w, r, a.runtimeErr(id, "write a file", err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleReadFile streams a file out of the sandbox with its Content-Length.
func (a *Agent) handleReadFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.held(id); err != nil {
		a.writeError(w, r, err)
		return
	}
	rc, size, err := a.rt.ReadFile(r.Context(), id, r.URL.Query().Get("path"))
	if err != nil {
		a.writeError(w, r, a.runtimeErr(id, "read a file", err))
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	if _, err := io.Copy(w, rc); err != nil {
		// The status is out; a short body with its Content-Length tells the caller.
		a.log.Warn("file read cut", "sandbox", id, "err", err)
	}
}

// runtimeErr turns a runtime failure without a code (the sandbox's init died: deleted,
// OOM-killed, crashed) into one a client can act on, and logs the cause, which would
// otherwise be lost behind "internal error" (API-2: a sandbox's state is never a 500): 404
// sandbox_not_found when a delete (or the agent ending it) stopped it or it is gone, else 409
// conflict.
func (a *Agent) runtimeErr(id, op string, err error) error {
	if code := berth.ErrorCode(err); code != berth.EInternal {
		return err
	}
	a.log.Warn("runtime call failed", "sandbox", id, "op", op, "err", err)
	a.mu.Lock()
	g, ok := a.guests[id]
	why := ""
	if ok && g.deleting {
		why = g.stopWhy
	}
	a.mu.Unlock()
	if why != "" { // a delete, or its TTL or an eviction, stops it while the call ran: not the init's death
		return berth.Errorf(berth.ESandboxNotFound, "sandbox %s was %s during the %s", id, why, op)
	}
	if a.held(id) != nil {
		return berth.Errorf(berth.ESandboxNotFound, "sandbox %s ended during the %s", id, op)
	}
	return berth.Errorf(berth.EConflict, "sandbox %s could not %s (its init may have died, e.g. out of memory): %v", id, op, err)
}
