package server

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// errorOf decodes an API-2 error body, failing the test when body is not one.
func errorOf(t *testing.T, body string) berth.ErrorDetail {
	t.Helper()
	var b berth.ErrorBody
	if err := json.Unmarshal([]byte(body), &b); err != nil || b.Error.Code == "" {
		t.Fatalf("not an error body: %q (%v)", body, err)
	}
	return b.Error
}

// TestBadNumbersAnswerInJSONTerms (a new user's report, items 1 and 7): an integer too big
// for its field is 400 invalid_request saying it is out of range, not that it is no integer;
// and a field is named as the client sent it — POST /v1/apps said "AppSpec.port" where the
// deploy call said "port".
func TestBadNumbersAnswerInJSONTerms(t *testing.T) {
	h := newHarness(t, time.Second)
	for _, tc := range []struct{ method, path, body, want string }{
		{http.MethodPost, "/v1/sandboxes", `{"template":"python","memory_mb":99999999999999999999999}`,
			`field "memory_mb": 99999999999999999999999 is out of range (-9223372036854775808 to 9223372036854775807)`},
		{http.MethodPost, "/v1/sandboxes", `{"template":"python","memory_mb":9223372036854775808}`,
			`field "memory_mb": 9223372036854775808 is out of range (-9223372036854775808 to 9223372036854775807)`},
		{http.MethodPut, "/v1/tenants/acme/quota", `{"max_memory_mb":9223372036854775808}`,
			`field "max_memory_mb": 9223372036854775808 is out of range (-9223372036854775808 to 9223372036854775807)`},
		{http.MethodPost, "/v1/apps", `{"name":"web","template":"python","command":"python3","port":8080}`,
			`field "command" must be an array`},
		{http.MethodPost, "/v1/apps", `{"name":"web","template":"python","command":["python3"],"port":"8080"}`,
			`field "port" must be an integer`},
		{http.MethodPost, "/v1/apps", `{"name":"web","template":"python","command":["python3"],"port":99999999999999999999}`,
			`field "port": 99999999999999999999 is out of range (-9223372036854775808 to 9223372036854775807)`},
		{http.MethodPost, "/v1/apps/web/deploy", `{"template":"python","command":["python3"],"port":"8080"}`,
			`field "port" must be an integer`},
	} {
		code, body := h.do(t, tc.method, tc.path, tc.body)
		if code != http.StatusBadRequest {
			t.Errorf("%s %s %s: %d %s, want 400", tc.method, tc.path, tc.body, code, body)
			continue
		}
		if e := errorOf(t, body); e.Code != berth.EInvalidRequest || e.Message != tc.want {
			t.Errorf("%s %s %s:\n got %s %q\nwant invalid_request %q", tc.method, tc.path, tc.body, e.Code, e.Message, tc.want)
		}
	}
}

// TestQuotaRefusalSaysTheSizeAsked (a new user's report, item 2): tenant acme with a quota of
// 1 sandbox and 300 MiB creating a 512 MiB python sandbox was told it "uses 0 sandboxes and
// 0 MiB of its quota (1 sandboxes, 300 MiB…)" — not why. The 403 tenant_over_quota now says
// what was asked, from the pre-check and from the store's own check (a concurrent create
// took the room after the pre-check) alike.
func TestQuotaRefusalSaysTheSizeAsked(t *testing.T) {
	h := newHarness(t, time.Second)
	if code, body := h.do(t, http.MethodPut, "/v1/tenants/acme/quota", `{"max_sandboxes":1,"max_memory_mb":300}`); code != http.StatusOK {
		t.Fatalf("set quota: %d %s", code, body)
	}
	const want = "tenant acme asks for a 512 MiB sandbox, over its quota: it uses 0 of 1 sandboxes and 0 of 300 MiB"
	code, body := h.do(t, http.MethodPost, "/v1/sandboxes", `{"template":"python"}`)
	if e := errorOf(t, body); code != http.StatusForbidden || e.Code != berth.ETenantOverQuota || e.Message != want || e.Retryable {
		t.Errorf("create over quota: %d %+v\nwant 403 tenant_over_quota, not retryable, %q", code, e, want)
	}
	// The store's check, inside the create's transaction, words it the same way.
	err := recordError(h.st.CreateSandbox(context.Background(), newSandbox(""), "test", h.clock()))
	if berth.ErrorCode(err) != berth.ETenantOverQuota || berth.ErrorMessage(err) != want {
		t.Errorf("the store's refusal answers %v\nwant tenant_over_quota %q", err, want)
	}
}
