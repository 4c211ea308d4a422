package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// testIdempotentCalls: a keyed call is claimed, then answered or abandoned; the answer is kept
// byte for byte; a claim or answer never replaces an answer or another request's claim; keys
// are per scope; old calls are forgotten (API-4, C26).
func testIdempotentCalls(t *testing.T, s berth.Store) {
	ctx := t.Context()
	const scope = "acme POST /v1/apps"
	c := berth.IdempotentCall{Scope: scope, Key: "k", RequestHash: "h1", CreatedAt: T0}
	if _, err := s.Call(ctx, scope, "k"); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("Call before any claim: %v, want ErrNotFound", err)
	}
	got, claimed, err := s.ClaimCall(ctx, c)
	if err != nil || !claimed || got.Done() || got.RequestHash != "h1" || !got.CreatedAt.Equal(T0) {
		t.Fatalf("first ClaimCall = %+v, %v, %v; want a fresh in-flight claim", got, claimed, err)
	}
	// A second claim (a retry, maybe another request) finds the first.
	other := c
	other.RequestHash, other.CreatedAt = "h2", at(time.Second)
	got, claimed, err = s.ClaimCall(ctx, other)
	if err != nil || claimed || got.RequestHash != "h1" || got.Done() {
		t.Fatalf("second ClaimCall = %+v, %v, %v; want the first claim, in flight", got, claimed, err)
	}
	// Finishing with another request's hash does not answer the first's claim.
	wrong := other
	wrong.Status, wrong.Answer = 201, []byte(`{"wrong":true}`)
	if got, err = s.FinishCall(ctx, wrong); err != nil || got.Done() || got.RequestHash != "h1" {
		t.Fatalf("FinishCall with another hash = %+v, %v; want the first claim untouched", got, err)
	}
	// An abandon with another claim time leaves the claim alone (it was taken over).
	if err := s.AbandonCall(ctx, scope, "k", at(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Call(ctx, scope, "k"); err != nil {
		t.Fatalf("abandon of a claim made at another time removed it: %v", err)
	}
	answer := []byte(`{"name":"web","created_at":"2031-03-14T15:09:26.535123456Z"}`)
	done := c
	done.Status, done.Answer = 201, answer
	if got, err = s.FinishCall(ctx, done); err != nil || !got.Done() || got.Status != 201 || string(got.Answer) != string(answer) {
		t.Fatalf("FinishCall = %+v, %v; want the answer stored", got, err)
	}
	// An answered call keeps its first answer and is not abandoned.
	again := done
	again.Answer = []byte(`{"second":true}`)
	if got, err = s.FinishCall(ctx, again); err != nil || string(got.Answer) != string(answer) {
		t.Fatalf("second FinishCall = %q, %v; want the first answer", got.Answer, err)
	}
	if err := s.AbandonCall(ctx, scope, "k", T0); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Call(ctx, scope, "k"); err != nil || !cmp.Equal(got.Answer, answer) || got.Status != 201 {
		t.Fatalf("Call after abandoning an answered call = %+v, %v; want the answer", got, err)
	}
	// The same key in another scope is another call; a FinishCall without a claim records.
	beta := berth.IdempotentCall{Scope: "beta POST /v1/apps", Key: "k", RequestHash: "h9", Status: 200,
		Answer: []byte(`{}`), CreatedAt: at(time.Hour)}
	if got, err = s.FinishCall(ctx, beta); err != nil || got.RequestHash != "h9" || got.Status != 200 {
		t.Fatalf("FinishCall in another scope = %+v, %v", got, err)
	}
	// An in-flight claim abandoned at its own time goes, and the key is free again.
	c2 := berth.IdempotentCall{Scope: scope, Key: "k2", RequestHash: "h", CreatedAt: at(2 * time.Second)}
	if _, claimed, err := s.ClaimCall(ctx, c2); err != nil || !claimed {
		t.Fatalf("claim k2: %v, %v", claimed, err)
	}
	if err := s.AbandonCall(ctx, scope, "k2", c2.CreatedAt); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Call(ctx, scope, "k2"); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("Call after abandon: %v, want ErrNotFound", err)
	}
	if _, err := s.FinishCall(ctx, berth.IdempotentCall{Scope: scope, Key: "z"}); err == nil {
		t.Fatal("FinishCall with status 0 succeeded")
	}
	// Forgetting: calls made before the cutoff go, later ones stay.
	n, err := s.ForgetCalls(ctx, at(time.Minute))
	if err != nil || n != 1 {
		t.Fatalf("ForgetCalls = %d, %v; want 1 (acme's k)", n, err)
	}
	if _, err := s.Call(ctx, scope, "k"); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("forgotten call still found: %v", err)
	}
	if _, err := s.Call(ctx, beta.Scope, "k"); err != nil {
		t.Fatalf("a call after the cutoff was forgotten: %v", err)
	}
}

// testIdempotentCallConcurrentClaims: of many concurrent claims on one key exactly one wins and
// the others see its claim (the race between replicas, C26).
func testIdempotentCallConcurrentClaims(t *testing.T, s berth.Store) {
	const n = 8
	var wg sync.WaitGroup
	wins := make(chan string, n)
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			c := berth.IdempotentCall{Scope: "acme POST /v1/apps", Key: "k", RequestHash: string(rune('a' + i)), CreatedAt: T0}
			got, claimed, err := s.ClaimCall(t.Context(), c)
			if err != nil {
				errs <- err
				return
			}
			if claimed {
				wins <- got.RequestHash
			}
		})
	}
	wg.Wait()
	close(wins)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var winners []string
	for w := range wins {
		winners = append(winners, w)
	}
	if len(winners) != 1 {
		t.Fatalf("%d claims won (%v), want exactly 1", len(winners), winners)
	}
	if got, err := s.Call(t.Context(), "acme POST /v1/apps", "k"); err != nil || got.RequestHash != winners[0] {
		t.Fatalf("stored claim %+v, %v; want the winner's %q", got, err, winners[0])
	}
}
