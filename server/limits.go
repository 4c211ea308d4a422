package server

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth"
	"golang.org/x/time/rate"
)

// tenantLimits is one token bucket per tenant (issue 15, point 3): Config.TenantRate requests
// per second with bursts of Config.TenantBurst. Only tenant keys are limited; the admin key
// and the node token are not (docs/DECISIONS.md "Bounded servers"). The map holds one entry
// per tenant that made a call, so it is bounded by the tenant table.
type tenantLimits struct {
	every rate.Limit
	burst int
	now   func() time.Time
	mu    sync.Mutex
	m     map[string]*rate.Limiter
}

// newTenantLimits returns nil (no limit) when perSecond is not positive.
func newTenantLimits(perSecond float64, burst int, now func() time.Time) *tenantLimits {
	if perSecond <= 0 {
		return nil
	}
	return &tenantLimits{every: rate.Limit(perSecond), burst: max(burst, 1), now: now, m: map[string]*rate.Limiter{}}
}

// admit takes one token from tenant's bucket, or returns a rate_limited error (429,
// retryable) whose RetryAfter is the bucket's own delay until a token is there.
func (l *tenantLimits) admit(tenant string) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	lim, ok := l.m[tenant]
	if !ok {
		lim = rate.NewLimiter(l.every, l.burst)
		l.m[tenant] = lim
	}
	l.mu.Unlock()
	now := l.now()
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		e := berth.Errorf(berth.ERateLimited, "tenant %q is over its request rate (%g requests/s, bursts of %d); retry after the Retry-After delay", tenant, float64(l.every), l.burst)
		e.RetryAfter = d
		return e
	}
	return nil
}

// LongLived reports whether r's answer may stream for long (an exec, a file read, a request
// to an app, by path or by Host): such requests get no write deadline from
// internal/httpbound.
func (s *Server) LongLived(r *http.Request) bool {
	p := r.URL.Path
	if strings.HasPrefix(p, "/apps/") || strings.HasSuffix(p, "/exec") || strings.HasSuffix(p, "/files") {
		return true
	}
	if s.cfg.AppsDomain != "" {
		if _, ok := s.appHost(r); ok {
			return true
		}
	}
	return false
}
