package server

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/berth-dev/berth"
)

// claimTimeout is how long a keyed call may stay in flight before a retry takes its claim over:
// the calls that claim (app create, deploy) are a few store writes, so a claim this old belongs
// to a replica that died mid-call (C26).
const claimTimeout = 2 * time.Minute

// idempotencyKey returns the request's Idempotency-Key ("" for none). Errors: invalid_request
// when it is longer than 255 bytes, has a byte outside printable ASCII (0x20–0x7E), or starts
// with berth.AppKeyPrefix (the app reconciler's keys).
func idempotencyKey(r *http.Request) (string, error) {
	key := r.Header.Get(berth.HeaderIdempotencyKey)
	if len(key) > maxIdemKeyLen {
		return "", berth.Errorf(berth.EInvalidRequest, "Idempotency-Key is longer than %d bytes", maxIdemKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "", berth.Errorf(berth.EInvalidRequest,
				"Idempotency-Key must be printable ASCII (byte %d is 0x%02x); a random hex or UUID string is the usual key", i, key[i])
		}
	}
	if strings.HasPrefix(key, berth.AppKeyPrefix) {
		return "", berth.Errorf(berth.EInvalidRequest,
			"Idempotency-Key may not start with %q: that prefix is the app reconciler's", berth.AppKeyPrefix)
	}
	return key, nil
}

// callScope is the IdempotentCall scope of p's calls to route: keys are per tenant, role and
// route, so an admin key and a tenant key of the same tenant never share a key's answer.
func callScope(p principal, route string) string {
	return cmp.Or(p.Tenant, "admin") + "/" + p.Role + " " + route
}

// mismatch is the C26 refusal: the key was first used with another request.
func mismatch(key string) error {
	return berth.Errorf(berth.EIdempotencyMismatch,
		"Idempotency-Key %q was first used with a different request; use a new key for a new request", key)
}

// keyed runs a call made with an Idempotency-Key at most once (API-4, C26). Without a key it
// just runs. With one, the key is claimed for route and req (the decoded body: RequestHash)
// before run: a retry of the same request, on any replica, waits for the first and then
// writes its answer byte for byte; a retry with another request is 422
// idempotency_key_mismatch. Only a success (2xx) binds the key: a call that fails frees it,
// so a retry runs anew. run writes its answer to the ResponseWriter it is given, as any
// handler does. Errors: run's, unavailable when the store fails or the request ends while
// the first call is in flight.
func (s *Server) keyed(w http.ResponseWriter, r *http.Request, p principal, route string, req any,
	run func(w http.ResponseWriter) error) error {
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	if key == "" {
		return run(w)
	}
	ctx := r.Context()
	call := berth.IdempotentCall{Scope: callScope(p, route), Key: key, RequestHash: berth.RequestHash(route, req)}
	for {
		call.CreatedAt = s.cfg.Clock().UTC().Truncate(time.Millisecond)
		held, claimed, err := s.store.ClaimCall(ctx, call)
		if err != nil {
			return berth.Fault(err, "claim Idempotency-Key")
		}
		if !claimed {
			switch {
			case held.RequestHash != call.RequestHash:
				return mismatch(key)
			case held.Done():
				writeAnswer(w, held)
				return nil
			case call.CreatedAt.Sub(held.CreatedAt) > claimTimeout:
				// Its replica died mid-call: take the claim over.
				if err := s.store.AbandonCall(ctx, call.Scope, key, held.CreatedAt); err != nil {
					return berth.Fault(err, "take over Idempotency-Key")
				}
				continue
			}
			select {
			case <-ctx.Done():
				return berth.Wrap(berth.EUnavailable, ctx.Err(), "gave up waiting for the call holding this Idempotency-Key")
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		rec := &recorder{header: http.Header{}}
		err = run(rec)
		if err != nil || rec.status < 200 || rec.status > 299 {
			s.abandonCall(ctx, call)
			if err != nil {
				return err
			}
			rec.flush(w)
			return nil
		}
		call.Status, call.Answer = rec.status, rec.body.Bytes()
		s.finishCall(ctx, w, call)
		return nil
	}
}

// finishCall records a keyed call's answer and writes the answer the store holds (the first
// recorded, should a concurrent retry have recorded one first). When the store fails, the
// call has happened anyway: its own answer is written and the failure logged; a retry then
// finds the call's effect (the sandbox by its key) or, for a claimed call, waits out the claim.
func (s *Server) finishCall(ctx context.Context, w http.ResponseWriter, call berth.IdempotentCall) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if call.CreatedAt.IsZero() {
		call.CreatedAt = s.cfg.Clock().UTC().Truncate(time.Millisecond)
	}
	stored, err := s.store.FinishCall(cctx, call)
	if err != nil {
		s.log.Error("could not record the answer of a keyed call; a replay will rebuild it", "key", call.Key, "scope", call.Scope, "err", err)
		writeAnswer(w, call)
		return
	}
	if !stored.Done() || stored.RequestHash != call.RequestHash {
		writeAnswer(w, call) // the key was reused meanwhile after being forgotten: ours stands
		return
	}
	writeAnswer(w, stored)
}

// abandonCall frees a failed call's claim, on a context of its own.
func (s *Server) abandonCall(ctx context.Context, call berth.IdempotentCall) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.store.AbandonCall(cctx, call.Scope, call.Key, call.CreatedAt); err != nil {
		s.log.Warn("could not free the Idempotency-Key of a failed call; a retry takes it over later", "key", call.Key, "err", err)
	}
}

// writeAnswer writes a recorded answer exactly as first written.
func writeAnswer(w http.ResponseWriter, c berth.IdempotentCall) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(c.Status)
	_, _ = w.Write(c.Answer)
}

// answerOf is v as WriteJSON writes it, for recording.
func answerOf(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// recorder is the ResponseWriter a keyed call runs against: its answer is recorded before it
// is written, so the bytes a replay writes are the bytes the first call wrote.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

// flush writes what was recorded to w.
func (r *recorder) flush(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(cmp.Or(r.status, http.StatusOK))
	_, _ = w.Write(r.body.Bytes())
}

// forgetCalls drops keyed calls older than berth.IdempotencyRetention, at most once a minute.
func (s *Server) forgetCalls(ctx context.Context) {
	now := s.cfg.Clock()
	last := s.lastForget.Load()
	if d := now.UnixMilli() - last; d >= 0 && d < time.Minute.Milliseconds() {
		return
	}
	if !s.lastForget.CompareAndSwap(last, now.UnixMilli()) {
		return // another sweep round is at it
	}
	n, err := s.store.ForgetCalls(ctx, now.Add(-berth.IdempotencyRetention))
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		s.log.Warn("could not forget old Idempotency-Keys", "err", err)
	case n > 0:
		s.log.Debug("forgot old Idempotency-Keys", "count", n)
	}
}
