package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestTenantOverItsRateGets429 (issue 15, point 3): 100 requests from one tenant as fast as
// they go, over a limit of 1/s with bursts of 5, get 429 rate_limited, retryable, with a
// Retry-After of at least a second; another tenant's requests still succeed, and the admin
// key is not limited.
func TestTenantOverItsRateGets429(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) { c.TenantRate, c.TenantBurst = 1, 5 })
	ctx := context.Background()
	keys := map[string]string{}
	for _, tenant := range []string{"hot", "calm"} {
		must(t, tenantErr(h.st.PutTenant(ctx, berth.Tenant{Name: tenant, CreatedAt: time.Now()})))
		keys[tenant] = NewKeySecret()
		must(t, h.st.PutAPIKey(ctx, berth.APIKey{ID: "k-" + tenant, Tenant: tenant, Role: berth.RoleTenant, Hash: HashKey(keys[tenant]), CreatedAt: time.Now()}))
	}
	get := func(key string) (*http.Response, berth.ErrorBody) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, h.srv.URL+"/v1/sandboxes", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var eb berth.ErrorBody
		_ = json.Unmarshal(b, &eb)
		return resp, eb
	}

	limited := 0
	for i := range 100 {
		resp, eb := get(keys["hot"])
		switch resp.StatusCode {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			limited++
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || ra < 1 {
				t.Fatalf("request %d: Retry-After = %q, want whole seconds ≥ 1", i, resp.Header.Get("Retry-After"))
			}
			if eb.Error.Code != berth.ERateLimited || !eb.Error.Retryable || eb.Error.RetryAfterS < 1 {
				t.Fatalf("request %d: body %+v, want rate_limited, retryable, retry_after_s ≥ 1", i, eb.Error)
			}
		default:
			t.Fatalf("request %d: status %d %+v", i, resp.StatusCode, eb.Error)
		}
	}
	// At 1/s with bursts of 5, however slow this machine, far fewer than 100 pass.
	if limited < 50 {
		t.Fatalf("%d of 100 requests over the limit got 429, want most of them", limited)
	}
	for i := range 5 {
		if resp, eb := get(keys["calm"]); resp.StatusCode != http.StatusOK {
			t.Fatalf("other tenant's request %d: status %d %+v, want 200", i, resp.StatusCode, eb.Error)
		}
	}
	for i := range 20 {
		if resp, eb := get(h.key); resp.StatusCode != http.StatusOK {
			t.Fatalf("admin request %d: status %d %+v, want 200 (admin is not limited)", i, resp.StatusCode, eb.Error)
		}
	}
}
