package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/berth-dev/berth"
)

// principal is who made a request: a tenant or admin API key.
type principal struct {
	Tenant string
	Role   string
}

func (p principal) admin() bool { return p.Role == berth.RoleAdmin }

// actor is who p is in an event's actor (LIF-3): "admin/<tenant>" for an admin key, so an
// operator's drain or delete is not read as the tenant's own doing, else "tenant/<tenant>".
func (p principal) actor() string {
	if p.admin() {
		return "admin/" + p.Tenant
	}
	return "tenant/" + p.Tenant
}

// HashKey returns the hex SHA-256 of an API key secret: the only form a key is stored in
// (API-1). Keys are 256-bit random strings, so a fast hash is enough; no password stretching.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// authenticator resolves bearer keys, caching positive lookups for a few seconds so the
// create path does not read the store for every request.
type authenticator struct {
	store     berth.TenantStore
	nodeToken []byte
	cache     ttlCache[principal]
}

const keyCacheTTL = 10 * time.Second

func newAuthenticator(st berth.TenantStore, nodeToken string) *authenticator {
	return &authenticator{store: st, nodeToken: []byte(nodeToken), cache: ttlCache[principal]{ttl: keyCacheTTL, max: 10000}}
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// key resolves the request's API key. Errors: unauthorized, or unavailable if the store fails.
func (a *authenticator) key(ctx context.Context, r *http.Request) (principal, error) {
	secret := bearer(r)
	if secret == "" {
		return principal{}, berth.Errorf(berth.EUnauthorized, "missing API key: send Authorization: Bearer <key>")
	}
	h := HashKey(secret)
	if p, ok := a.cache.get(h, time.Now()); ok {
		return p, nil
	}
	k, err := a.store.APIKeyByHash(ctx, h)
	if errors.Is(err, berth.ErrNotFound) {
		return principal{}, berth.Errorf(berth.EUnauthorized, "unknown API key")
	}
	if err != nil {
		return principal{}, berth.Fault(err, "key lookup failed")
	}
	p := principal{Tenant: k.Tenant, Role: k.Role}
	a.cache.put(h, p, time.Now())
	return p, nil
}

// node checks the request carries the node token (heartbeats), in constant time.
func (a *authenticator) node(r *http.Request) error {
	got := []byte(bearer(r))
	if len(a.nodeToken) == 0 || subtle.ConstantTimeCompare(got, a.nodeToken) != 1 {
		return berth.Errorf(berth.EUnauthorized, "missing or wrong node token")
	}
	return nil
}
