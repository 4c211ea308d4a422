package berth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
)

// IdempotencyRetention is how long a finished call's answer is kept for replays (API-4, C26):
// a client retries within minutes, and a day covers a client that was down for a night. After
// it a sandbox create's key still finds its sandbox (the key lives on the sandbox's row), but
// the replay then shows the sandbox as it is now.
const IdempotencyRetention = 24 * time.Hour

// IdempotentCall is one call made with an Idempotency-Key (API-4, C26): the key binds to the
// request it first came with (RequestHash) and, once the call has succeeded, to its answer,
// which every replay returns byte for byte.
type IdempotentCall struct {
	// Scope is who made the call and which call it was: "<tenant> <METHOD> <route>", so one
	// tenant's keys never meet another's and a key used on two routes is two calls.
	Scope string
	// Key is the client's Idempotency-Key (at most 255 bytes).
	Key string
	// RequestHash is RequestHash of the call's decoded body and path.
	RequestHash string
	// Status is the HTTP status of the answer; 0 while the call is in flight (claimed).
	Status int
	// Answer is the answer's JSON body, exactly as first written.
	Answer []byte
	// CreatedAt is when the call was claimed (or its answer recorded, if never claimed), in
	// the store's precision (milliseconds).
	CreatedAt time.Time
}

// Done reports whether the call has an answer to replay.
func (c IdempotentCall) Done() bool { return c.Status != 0 }

// IdempotencyStore keeps the answers of calls made with an Idempotency-Key (API-4, C26). A
// call is claimed before it runs (ClaimCall), so a concurrent retry on any replica waits for
// it instead of running it twice, then finished with its answer (FinishCall) or, if it failed,
// abandoned so a retry can run it anew (AbandonCall).
type IdempotencyStore interface {
	// ClaimCall inserts c as in flight (its Status is ignored) unless (c.Scope, c.Key) is
	// already held; it returns the call as stored and whether this claim made it.
	ClaimCall(ctx context.Context, c IdempotentCall) (IdempotentCall, bool, error)
	// FinishCall records c's answer: it inserts c if the key is unheld, or completes the
	// claim holding it if that claim is in flight with the same RequestHash. It returns the
	// call as stored: an answer recorded first (by a concurrent retry) wins, and the caller
	// writes what is returned.
	FinishCall(ctx context.Context, c IdempotentCall) (IdempotentCall, error)
	// AbandonCall removes the claim on (scope, key) if it is still in flight and was made at
	// claimedAt (so a claim taken over since is left alone); an answered call stays.
	AbandonCall(ctx context.Context, scope, key string, claimedAt time.Time) error
	// Call returns the call holding (scope, key), or an error wrapping ErrNotFound.
	Call(ctx context.Context, scope, key string) (IdempotentCall, error)
	// ForgetCalls deletes the calls claimed or answered before cutoff and returns how many.
	ForgetCalls(ctx context.Context, cutoff time.Time) (int64, error)
}

// RequestHash is the hex SHA-256 of a call's route and its decoded body re-encoded as JSON,
// so two bodies that decode to the same request (key order, spacing, an explicit zero) hash
// alike and any difference in what was asked for does not (C26).
func RequestHash(route string, body any) string {
	h := sha256.New()
	h.Write([]byte(route))
	h.Write([]byte{0})
	// A decoded request always re-encodes: its fields are plain values and string maps.
	b, _ := json.Marshal(body)
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}
