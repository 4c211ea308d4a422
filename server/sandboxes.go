package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/berth-dev/berth/internal/inflight"
)

// Input bounds for creates; anything outside is invalid_request, never a 500.
const (
	maxVCPUs          = 1024
	maxMetadataKeys   = 32
	maxMetadataKeyLen = 63
	maxMetadataValLen = 256
	maxIdemKeyLen     = 255
	maxExecTimeoutS   = berth.MaxExecTimeoutS
	defaultExecS      = 60
)

// validateCreate fills defaults from the template and checks every field's range.
func (s *Server) validateCreate(ctx context.Context, req berth.CreateRequest) (berth.Template, error) {
	if req.Template == "" {
		return berth.Template{}, berth.Errorf(berth.EInvalidRequest, "template is required")
	}
	t, err := s.templates.get(ctx, req.Template)
	if errors.Is(err, berth.ErrNotFound) {
		var names []string
		if ts, err := s.store.Templates(ctx); err == nil {
			for _, t := range ts {
				names = append(names, t.Name)
			}
		}
		return t, berth.Errorf(berth.ETemplateNotFound, "no template %q (templates: %s)", req.Template, strings.Join(names, ", "))
	}
	if err != nil {
		return t, berth.Fault(err, "read template")
	}
	switch {
	case req.MemoryMiB < 0 || (req.MemoryMiB > 0 && req.MemoryMiB < berth.MinSandboxMiB) || req.MemoryMiB > s.cfg.MaxSandboxMiB:
		// Below the floor no runtime starts it, and each host's failure would count toward
		// its quarantine (PLC-9): refused here, before any host is asked.
		return t, berth.Errorf(berth.EInvalidRequest, "memory_mb must be between %d (the least every runtime can start) and %d MiB",
			berth.MinSandboxMiB, s.cfg.MaxSandboxMiB)
	case req.VCPUs < 0 || req.VCPUs > maxVCPUs:
		return t, berth.Errorf(berth.EInvalidRequest, "vcpus must be between 1 and %d", maxVCPUs)
	case req.TTLSeconds < 0 || req.TTLSeconds > int64(s.cfg.MaxTTL/time.Second):
		return t, berth.Errorf(berth.EInvalidRequest, "ttl_seconds must be between 1 and %d", int64(s.cfg.MaxTTL/time.Second))
	case req.Pool != "" && req.Pool != berth.PoolStateful && req.Pool != berth.PoolEphemeral:
		return t, berth.Errorf(berth.EInvalidRequest, "pool must be %q or %q", berth.PoolStateful, berth.PoolEphemeral)
	case req.Stateful && req.Pool == berth.PoolEphemeral:
		return t, berth.Errorf(berth.EInvalidRequest, "stateful sandboxes run only in the stateful pool (POOL-2)")
	case req.Volume != "" && !nameRE.MatchString(req.Volume):
		return t, berth.Errorf(berth.EInvalidRequest, "volume must be lowercase letters, digits, '.', '_' or '-', at most 63")
	case req.Volume != "" && req.Pool == berth.PoolEphemeral:
		return t, berth.Errorf(berth.EInvalidRequest, "sandboxes with a volume run only in the stateful pool (POOL-2)")
	case len(req.Region) > berth.MaxRegionBytes:
		return t, berth.Errorf(berth.EInvalidRequest, "region is longer than %d bytes", berth.MaxRegionBytes)
	case len(req.Metadata) > maxMetadataKeys:
		return t, berth.Errorf(berth.EInvalidRequest, "metadata has more than %d keys", maxMetadataKeys)
	}
	for k, v := range req.Metadata {
		if k == "" || len(k) > maxMetadataKeyLen || len(v) > maxMetadataValLen {
			return t, berth.Errorf(berth.EInvalidRequest, "metadata keys must be 1–%d bytes and values at most %d", maxMetadataKeyLen, maxMetadataValLen)
		}
	}
	return t, nil
}

// createSandbox is POST /v1/sandboxes: validate, honour Idempotency-Key (API-4), place
// (PLC-1…7). The sandbox row is written once a host's reservation is taken, as starting, so
// a refusal before that leaves nothing behind and a retry with the same key on any replica
// finds the create in flight and waits for its outcome instead of starting a second one.
func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	start := time.Now()
	outcome := "internal"
	defer func() { s.metrics.createSecond.WithLabelValues(outcome).Observe(time.Since(start).Seconds()) }()

	var req berth.CreateRequest
	if err := httpjson.Decode(w, r, maxJSONBytes, &req); err != nil {
		outcome = berth.ErrorCode(err)
		return err
	}
	idem, err := idempotencyKey(r)
	if err != nil {
		outcome = berth.ErrorCode(err)
		return err
	}
	t, err := s.validateCreate(r.Context(), req)
	if err != nil {
		outcome = berth.ErrorCode(err)
		return err
	}
	sb := s.newSandboxFor(req, t, p.Tenant, idem)
	placed, replayed, err := s.createIdempotent(r.Context(), sb, req, p.actor())
	switch {
	case err != nil:
		outcome = berth.ErrorCode(err)
		return err
	case replayed:
		outcome = "replayed"
		s.answerCreate(w, r, p, sb, placed)
		return nil
	}
	if r.Context().Err() != nil && idem == "" {
		// The client left before the answer and no Idempotency-Key can find this
		// sandbox again: stop it rather than let it run unowned until its TTL.
		s.discard(r.Context(), placed, "the client went away before the answer and holds no Idempotency-Key")
		outcome = "client_gone"
		return berth.Errorf(berth.EUnavailable, "create abandoned: the client went away")
	}
	outcome = "created"
	s.observeFirstRefusal(r)
	s.log.Info("sandbox created", "sandbox", placed.ID, "agent", placed.AgentID, "tenant", p.Tenant, "memory_mb", placed.MemoryMiB)
	s.answerCreate(w, r, p, sb, placed)
	return nil
}

// newSandboxFor is the sandbox a valid create request req asks for from template t, for tenant,
// holding the Idempotency-Key idem ("" for none) bound to the request's hash (C26). Memory
// (MiB) and vCPUs default to the template's, the TTL to DefaultTTL; a volume makes it
// stateful (POOL-2, POOL-3).
func (s *Server) newSandboxFor(req berth.CreateRequest, t berth.Template, tenant, idem string) berth.Sandbox {
	// In the store's precision (milliseconds), so the answer is the sandbox as every later
	// read shows it, and a replay is the first answer byte for byte (C26).
	now := s.cfg.Clock().UTC().Truncate(time.Millisecond)
	ttl := s.cfg.DefaultTTL
	if req.TTLSeconds > 0 {
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}
	sb := berth.Sandbox{
		ID: newID("sb"), Template: t.Name, Tenant: tenant,
		MemoryMiB: berth.SandboxMiB(req.MemoryMiB, t.MemoryMiB), VCPUs: cmp.Or(req.VCPUs, t.VCPUs),
		Stateful: req.Stateful, CreatedAt: now, ExpiresAt: now.Add(ttl),
		Metadata: req.Metadata, IdempotencyKey: idem, Volume: req.Volume,
	}
	if idem != "" {
		sb.RequestHash = berth.RequestHash(createRoute, req) // C26: the key binds to this request
	}
	if req.Volume != "" {
		// Durable data makes it stateful: charged in full, never evicted, stateful pool only
		// (POOL-2, POOL-3).
		sb.Stateful = true
	}
	return sb
}

// observeFirstRefusal records MET-4 for a create that succeeded after being refused at least
// once: the time from its first attempt (the SDK's Berth-First-Attempt) to now, in seconds.
func (s *Server) observeFirstRefusal(r *http.Request) {
	if n, _ := strconv.Atoi(r.Header.Get(berth.HeaderAttempt)); n <= 1 {
		return
	}
	if fa, err := time.Parse(time.RFC3339Nano, r.Header.Get(berth.HeaderFirstAttempt)); err == nil {
		if d := time.Since(fa); d >= 0 && d < 24*time.Hour {
			s.metrics.firstRefusal.WithLabelValues("sandbox").Observe(d.Seconds())
		}
	}
}

// createRoute is the route a sandbox create's Idempotency-Key is scoped to (C26).
const createRoute = "POST /v1/sandboxes"

// answerCreate writes a create's 201. With an Idempotency-Key the answer is recorded, or, if
// the key's first create recorded one, that answer is written byte for byte (API-4, C26).
func (s *Server) answerCreate(w http.ResponseWriter, r *http.Request, p principal, asked, placed berth.Sandbox) {
	if asked.IdempotencyKey == "" {
		httpjson.WriteJSON(w, http.StatusCreated, placed)
		return
	}
	answer, err := answerOf(placed)
	if err != nil { // a sandbox always encodes; a failure here is a bug worth a log
		s.log.Error("encode a create's answer", "sandbox", placed.ID, "err", err)
		httpjson.WriteJSON(w, http.StatusCreated, placed)
		return
	}
	s.finishCall(r.Context(), w, berth.IdempotentCall{Scope: callScope(p, createRoute), Key: asked.IdempotencyKey,
		RequestHash: asked.RequestHash, Status: http.StatusCreated, Answer: answer})
}

// createIdempotent checks the tenant's quota (ADM-11) and places sb (PLC-1…7), honouring its
// Idempotency-Key (API-4): it returns the sandbox holding the key — the one it made, or
// (replayed) the outcome of an earlier or concurrent create with the same key, on any
// replica. A create still starting elsewhere is waited for. A refusal (full fleet, quota)
// does not hide an earlier create that succeeded: its sandbox is returned instead. A first
// attempt pays no extra read for the key: the insert of its starting row meets the key
// (errIdempotent). Used by POST /v1/sandboxes and by the app reconciler's starts.
func (s *Server) createIdempotent(ctx context.Context, sb berth.Sandbox, req berth.CreateRequest, actor string) (berth.Sandbox, bool, error) {
	key := sb.IdempotencyKey
	// earlier returns the create holding the key, if one does; one made with another request
	// is the C26 mismatch (rows from before request hashes, RequestHash "", are not compared).
	earlier := func() (berth.Sandbox, bool, error) {
		if key == "" {
			return sb, false, nil
		}
		first, found, err := s.awaitIdempotent(ctx, sb.Tenant, key)
		if err == nil && found && first.RequestHash != "" && sb.RequestHash != "" && first.RequestHash != sb.RequestHash {
			return sb, false, mismatch(key)
		}
		return first, err == nil && found, err
	}
	if err := s.checkQuota(ctx, sb.Tenant, sb.MemoryMiB); err != nil {
		first, ok, kerr := earlier()
		if ok || berth.ErrorCode(kerr) == berth.EIdempotencyMismatch {
			return first, ok, kerr
		}
		return sb, false, err
	}
	for awaiting := false; ; awaiting = true {
		if awaiting {
			first, found, err := earlier()
			if err != nil {
				return sb, false, err
			}
			if found {
				return first, true, nil
			}
		}
		placed, err := s.sched.place(ctx, sb, req, actor)
		if errors.Is(err, errIdempotent) {
			continue // another create holds the key: wait for its outcome
		}
		if err != nil && !awaiting {
			first, ok, kerr := earlier()
			if ok || berth.ErrorCode(kerr) == berth.EIdempotencyMismatch {
				return first, ok, kerr
			}
		}
		return placed, false, err
	}
}

// discard stops a sandbox nobody can own and records why, on a context of its own; a paused
// one's image is removed instead.
func (s *Server) discard(ctx context.Context, sb berth.Sandbox, reason string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if sb.State == berth.SandboxPaused {
		s.deleteImages(cctx, sb.ID+"/")
	} else if addr, err := s.agentAddress(cctx, sb.AgentID); err == nil {
		if err := s.agents.delete(cctx, addr, sb.ID); err != nil {
			s.log.Warn("could not stop a discarded sandbox; its TTL will", "sandbox", sb.ID, "err", err)
		} else {
			s.sched.noteEnded(sb.AgentID)
		}
	}
	if _, err := s.store.TransitionSandbox(cctx, sb.ID, nil, berth.SandboxStopped, reason, "server/"+s.cfg.ReplicaID, s.cfg.Clock()); err != nil {
		s.log.Warn("could not record a discarded sandbox", "sandbox", sb.ID, "err", err)
	}
}

// awaitIdempotent returns the tenant's sandbox holding key (API-4). A create still starting
// elsewhere (another request, maybe on another replica) is waited for until it is running
// or has failed; a failed create has freed the key, so found is false and the caller
// creates anew. Errors: unavailable (store), or the request's end.
func (s *Server) awaitIdempotent(ctx context.Context, tenant, key string) (berth.Sandbox, bool, error) {
	for {
		sb, err := s.store.SandboxByIdempotencyKey(ctx, tenant, key)
		switch {
		case errors.Is(err, berth.ErrNotFound):
			return sb, false, nil
		case err != nil:
			return sb, false, berth.Fault(err, "read idempotency key")
		case sb.State != berth.SandboxStarting && sb.State != berth.SandboxPending:
			return sb, true, nil
		}
		select {
		case <-ctx.Done():
			return sb, false, berth.Wrap(berth.EUnavailable, ctx.Err(), "gave up waiting for the create holding this Idempotency-Key")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sandboxFor returns the sandbox if the principal may see it; other tenants' sandboxes are
// sandbox_not_found, exactly like missing ones.
func (s *Server) sandboxFor(ctx context.Context, p principal, id string) (berth.Sandbox, error) {
	sb, err := s.store.Sandbox(ctx, id)
	if errors.Is(err, berth.ErrNotFound) || (err == nil && !p.admin() && sb.Tenant != p.Tenant) {
		return sb, berth.Errorf(berth.ESandboxNotFound, "no sandbox %q", id)
	}
	if err != nil {
		return sb, berth.Fault(err, "read sandbox")
	}
	return sb, nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.sandboxFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, p principal) error {
	f := berth.SandboxFilter{State: berth.SandboxState(r.URL.Query().Get("state"))}
	if f.State != "" && !f.State.Valid() {
		return berth.Errorf(berth.EInvalidRequest, "unknown state %q: want one of %s", f.State, berth.SandboxStateList())
	}
	if !p.admin() {
		f.Tenant = p.Tenant
	}
	sbs, err := s.store.Sandboxes(r.Context(), f)
	if err != nil {
		return berth.Fault(err, "list sandboxes")
	}
	if sbs == nil {
		sbs = []berth.Sandbox{}
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"sandboxes": sbs})
	return nil
}

// deleteSandbox is DELETE /v1/sandboxes/{id}: idempotent 204. The sandbox is stopping until
// its agent confirms the stop; if the agent cannot be reached the answer is 503 and a retry
// (the SDK retries DELETE) tries again.
func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.sandboxFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	actor := p.actor()
	if sb.State == berth.SandboxPaused {
		// On no host: its image is all there is (PAUSE-1).
		s.deleteImages(r.Context(), sb.ID+"/")
		if _, err := s.store.TransitionSandbox(r.Context(), sb.ID, []berth.SandboxState{berth.SandboxPaused}, berth.SandboxStopped,
			"deleted while paused; its image removed", actor, s.cfg.Clock()); err != nil {
			return berth.Fault(err, "record stopped")
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if !sb.State.Terminal() {
		now := s.cfg.Clock()
		if _, err := s.store.TransitionSandbox(r.Context(), sb.ID, nil, berth.SandboxStopping, "delete requested", actor, now); err != nil {
			return berth.Fault(err, "record stopping")
		}
		addr, err := s.agentAddress(r.Context(), sb.AgentID)
		if err == nil {
			err = s.agents.delete(r.Context(), addr, sb.ID)
		}
		if err != nil {
			return berth.Wrap(berth.EUnavailable, err, "agent %s did not confirm the stop (retry the delete)", sb.AgentID)
		}
		s.sched.noteEnded(sb.AgentID)
		if _, err := s.store.TransitionSandbox(r.Context(), sb.ID, []berth.SandboxState{berth.SandboxStopping}, berth.SandboxStopped, "deleted", actor, s.cfg.Clock()); err != nil {
			return berth.Fault(err, "record stopped")
		}
		s.log.Info("sandbox deleted", "sandbox", sb.ID, "agent", sb.AgentID, "tenant", sb.Tenant)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// agentAddress returns the base URL of an agent's internal API: from the placement
// snapshot when it knows the agent, else from the store.
func (s *Server) agentAddress(ctx context.Context, agentID string) (agentAt, error) {
	if addr, ok := s.sched.address(agentID); ok {
		return agentAt{ID: agentID, URL: addr}, nil
	}
	a, err := s.store.Agent(ctx, agentID)
	if err != nil {
		return agentAt{ID: agentID}, fmt.Errorf("agent %s: %w", agentID, err)
	}
	return agentAt{ID: agentID, URL: a.Address}, nil
}

// runningOn returns the address of the agent running sandbox id, or conflict when the
// sandbox is not running.
func (s *Server) runningOn(ctx context.Context, p principal, id string) (berth.Sandbox, agentAt, error) {
	sb, err := s.sandboxFor(ctx, p, id)
	if err != nil {
		return sb, agentAt{}, err
	}
	if sb.State == berth.SandboxPaused {
		return sb, agentAt{}, berth.Errorf(berth.EConflict, "sandbox %s is paused: resume it first (POST /v1/sandboxes/%s/resume)", id, id)
	}
	if sb.State != berth.SandboxRunning {
		return sb, agentAt{}, berth.Errorf(berth.EConflict, "sandbox %s is %s, not running", id, sb.State)
	}
	addr, err := s.agentAddress(ctx, sb.AgentID)
	if err != nil {
		if errors.Is(err, berth.ErrNotFound) { // the agent's row is gone: it will not come back
			return sb, agentAt{}, berth.Wrap(berth.EUnavailable, err, "agent %s is unknown", sb.AgentID)
		}
		return sb, agentAt{}, berth.Fault(err, "read agent %s", sb.AgentID)
	}
	return sb, addr, nil
}

func (s *Server) execSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	var req berth.ExecRequest
	// DecodeBinary: stdin may be binary, and it is never stored.
	if err := httpjson.DecodeBinary(w, r, maxJSONBytes, &req); err != nil {
		return err
	}
	switch {
	case len(req.Cmd) == 0 || req.Cmd[0] == "":
		return berth.Errorf(berth.EInvalidRequest, "cmd must name a program")
	case len(req.Cmd) > 1024:
		return berth.Errorf(berth.EInvalidRequest, "cmd has more than 1024 arguments")
	case req.TimeoutS < 0 || req.TimeoutS > maxExecTimeoutS:
		return berth.Errorf(berth.EInvalidRequest, "timeout_s must be between 1 and %d", maxExecTimeoutS)
	}
	for _, a := range req.Cmd {
		if strings.IndexByte(a, 0) >= 0 {
			return berth.Errorf(berth.EInvalidRequest, "cmd arguments may not contain NUL bytes")
		}
	}
	if req.TimeoutS == 0 {
		req.TimeoutS = defaultExecS
	}
	sb, addr, err := s.runningOn(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	release, err := s.holdExec(p, max(r.ContentLength, execDecodedBytes(req)))
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(req.TimeoutS+10)*time.Second)
	defer cancel()
	res, err := s.agents.exec(ctx, addr, sb.ID, req)
	if err != nil {
		return execLost(err, sb.ID, req.TimeoutS+10)
	}
	httpjson.WriteJSON(w, http.StatusOK, res)
	return nil
}

// execLost is an exec's error from its agent call. An answer that never came, or came cut
// (errUnreachable, past waitS seconds or on a connection that broke), after the request was
// sent means the command may have run: outcome_unknown (504), not retryable, so nothing runs
// it again on Berth's word. A call of which nothing reached the agent (errNotSent: the dial
// or the TLS handshake failed) ran nothing and stays unavailable (503, retryable). Found by an attack: a guest
// standing in for its init that never answers, and execs past the replica's wait under load,
// were answered 503 unavailable, retryable, for commands that had run.
func execLost(err error, id string, waitS int) error {
	if !errors.Is(err, errUnreachable) || errors.Is(err, errNotSent) {
		return err
	}
	return berth.Wrap(berth.EOutcomeUnknown, err,
		"sandbox %s: its host took the exec, but no whole answer came back within %d s (timeout_s + 10); the command may have run: check before running it again",
		id, waitS)
}

// holdExec counts n bytes of an exec against its principal's execs in flight on this replica
// (Config.TenantExecMiB) and everyone's (Config.ExecInflightMiB) until release. It runs once
// the body is read and the sandbox found running and the caller's, so only an exec that is
// about to run holds anything: a hold taken from the Content-Length before the body arrived
// let four tenants fill the replica's bound with headers alone, for sandboxes they did not
// have (found by an attack). Over a bound: rate_limited (429), retry after 1 s — an exec
// ending frees its room, which no estimate foresees. The admin key is bounded as one more
// principal: the bound is on memory held, not on trust.
func (s *Server) holdExec(p principal, n int64) (release func(), err error) {
	key, who := p.actor(), fmt.Sprintf("tenant %q", p.Tenant)
	if p.admin() {
		key, who = "admin", "the admin key"
	}
	limit := inflight.MiB(s.cfg.TenantExecMiB)
	release, ok := s.execs.Take(key, n, limit)
	if ok {
		return release, nil
	}
	mine := s.execs.Held(key)
	msg := fmt.Sprintf("this replica holds as many exec requests as it takes at once (--exec-inflight-mb %d)", s.cfg.ExecInflightMiB)
	if limit > 0 && mine+n > limit {
		msg = fmt.Sprintf("%s has %d KiB of exec requests in flight on this replica and this one needs %d KiB, over --tenant-exec-mb %d",
			who, mine>>10, n>>10, s.cfg.TenantExecMiB)
	}
	e := berth.Errorf(berth.ERateLimited, "%s; retry when one ends", msg)
	e.RetryAfter = time.Second
	return nil, e
}

// execDecodedBytes is what a decoded exec request holds: its stdin and arguments. It can be
// three times its body: each byte of stdin that is not UTF-8 decodes to U+FFFD, three bytes,
// and the replica forwards the decoded form (found by an attack: 64 execs of 1 MB of 0xff
// took a replica from 37 to 907 MB while the bound counted 64 MiB of bodies).
func execDecodedBytes(req berth.ExecRequest) int64 {
	n := int64(len(req.Stdin))
	for _, a := range req.Cmd {
		n += int64(len(a))
	}
	return n
}

// filePath validates ?path=: absolute, clean, no NUL, at most 4096 bytes.
func filePath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" || !strings.HasPrefix(p, "/") || len(p) > 4096 || strings.IndexByte(p, 0) >= 0 || path.Clean(p) != p {
		return "", berth.Errorf(berth.EInvalidRequest, "path must be a clean absolute path, e.g. /tmp/data.txt")
	}
	return p, nil
}

// writeFile is PUT /v1/sandboxes/{id}/files?path=: the body streams through to the sandbox
// (ISO-3), at most 64 MiB; a body cut short writes nothing.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, p principal) error {
	fp, err := filePath(r)
	if err != nil {
		return err
	}
	if r.ContentLength > maxFileBytes {
		return berth.Errorf(berth.ETooLarge, "file of %d bytes is over %d", r.ContentLength, maxFileBytes)
	}
	sb, addr, err := s.runningOn(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	body := &readErr{r: http.MaxBytesReader(w, r.Body, maxFileBytes)}
	err = s.agents.writeFile(r.Context(), addr, sb.ID, fp, body, r.ContentLength)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig) || errors.As(body.err, &tooBig):
		return berth.Errorf(berth.ETooLarge, "file over %d bytes", maxFileBytes)
	case body.err != nil:
		// The caller's body broke off (a Content-Length not reached, a chunked body without
		// its end): its fault, not the agent's, and nothing was written (ISO-3).
		return berth.Errorf(berth.EInvalidRequest, "the file's body was cut short (%v): nothing was written", body.err)
	case err != nil:
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// readErr is a request body that keeps the first error reading it returned, other than
// io.EOF: what the caller's side of a streamed upload did, whatever the agent call made of it.
type readErr struct {
	r   io.Reader
	err error
}

func (b *readErr) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// readFile is GET /v1/sandboxes/{id}/files?path=: the file streams from the sandbox with its
// Content-Length.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request, p principal) error {
	fp, err := filePath(r)
	if err != nil {
		return err
	}
	sb, addr, err := s.runningOn(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	rc, size, err := s.agents.readFile(r.Context(), addr, sb.ID, fp)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Warn("file read cut", "sandbox", sb.ID, "err", err)
	}
	return nil
}
