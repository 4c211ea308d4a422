package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
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

// racedTenants is a store where another replica creates the tenant, stamped other, just
// before this replica's write.
type racedTenants struct {
	berth.Store
	other time.Time
}

func (r racedTenants) PutTenant(ctx context.Context, t berth.Tenant) (bool, error) {
	if _, err := r.Store.PutTenant(ctx, berth.Tenant{Name: t.Name, CreatedAt: r.other}); err != nil {
		return false, err
	}
	return r.Store.PutTenant(ctx, t)
}

// TestCreateTenantTakenIsConflict (a new user's report, item 4): POST /v1/tenants for a name
// that exists answered 201 with a new created_at each time, a record the store never held.
// It is 409 conflict, as the CLI and the SDKs document, and the tenant is left as it is: its
// created_at, quota and keys. A create that loses a race to another replica is a conflict
// too, never a 201 with a time that is not stored — also when both stamp the same
// millisecond, which answered 201 twice while the server told the two apart by created_at.
func TestCreateTenantTakenIsConflict(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 3, 1, 9, 0, 0, 123456789, time.UTC)}
	h := newHarnessWith(t, func(c *Config) { c.Clock = clock.Now })
	ctx := context.Background()
	code, body := h.do(t, http.MethodPost, "/v1/tenants", `{"name":"beta"}`)
	var first berth.Tenant
	if err := json.Unmarshal([]byte(body), &first); code != http.StatusCreated || err != nil || first.Name != "beta" {
		t.Fatalf("first create: %d %s; want 201", code, body)
	}
	if stored := clock.Now().Truncate(time.Millisecond); !first.CreatedAt.Equal(stored) { // stores keep ms
		t.Errorf("first create answered created_at %s; the store holds %s", first.CreatedAt, stored)
		first.CreatedAt = stored
	}
	if code, body := h.do(t, http.MethodPut, "/v1/tenants/beta/quota", `{"max_sandboxes":3}`); code != http.StatusOK {
		t.Fatalf("quota: %d %s", code, body)
	}
	clock.Add(time.Hour)
	for _, name := range []string{"beta", "acme"} { // acme: made by the store, not the API
		code, body := h.do(t, http.MethodPost, "/v1/tenants", `{"name":"`+name+`"}`)
		if e := errorOf(t, body); code != http.StatusConflict || e.Code != berth.EConflict || !strings.Contains(e.Message, "tenant "+name+" exists") {
			t.Errorf("create of existing %s: %d %s; want 409 conflict naming it", name, code, body)
		}
	}
	tenants, err := h.st.Tenants(ctx)
	must(t, err)
	if len(tenants) != 2 || tenants[1].Name != "beta" || !tenants[1].CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("tenants after the second create: %+v; want beta as first created (%s)", tenants, first.CreatedAt)
	}
	if q, err := h.st.Quota(ctx, "beta"); err != nil || q.MaxSandboxes != 3 {
		t.Errorf("beta's quota after the second create: %+v %v; want max_sandboxes 3 kept", q, err)
	}

	// Another replica creates the tenant just before this one's write: a minute earlier
	// ("delta"), or in the same millisecond ("gamma").
	store := h.s.store
	for _, tc := range []struct {
		name  string
		other time.Time
	}{
		{"delta", clock.Now().Add(-time.Minute).Truncate(time.Millisecond)},
		{"gamma", clock.Now().Truncate(time.Millisecond)},
	} {
		h.s.store = racedTenants{Store: store, other: tc.other}
		code, body = h.do(t, http.MethodPost, "/v1/tenants", `{"name":"`+tc.name+`"}`)
		if e := errorOf(t, body); code != http.StatusConflict || e.Code != berth.EConflict {
			t.Errorf("create of %s that lost a race: %d %s; want 409 conflict", tc.name, code, body)
		}
		tenants, err = h.st.Tenants(ctx)
		must(t, err)
		i := slices.IndexFunc(tenants, func(t berth.Tenant) bool { return t.Name == tc.name })
		if i < 0 || !tenants[i].CreatedAt.Equal(tc.other) {
			t.Errorf("tenants after the race for %s: %+v; want it as the other replica made it (%s)", tc.name, tenants, tc.other)
		}
	}
}

// TestDrainReasonBounded (a new user's report, item 5): a drain with a 100,000-character
// reason was 202 and stored in the agent's events. An operator's reason is held to the bound
// apps' reasons get in events (ReasonExcerptBytes), without a NUL (PostgreSQL refuses it):
// past it, 400 invalid_request and nothing changes — the agent is not drained, no event is
// written. A reason at the bound is taken whole.
func TestDrainReasonBounded(t *testing.T) {
	h := newHarness(t, time.Second)
	ag := newFakeAgent(t, "")
	h.heartbeat(t, "a1", ag.srv.URL, 4096)
	ctx := context.Background()
	events := func() int {
		evs, err := h.st.Events(ctx, berth.EventFilter{Entity: "agent/a1", Limit: 100})
		must(t, err)
		return len(evs)
	}
	before := events()
	for _, tc := range []struct{ path, reason string }{
		{"/v1/agents/a1/drain", strings.Repeat("x", 100_000)},
		{"/v1/agents/a1/drain", strings.Repeat("é", ReasonExcerptBytes/2) + "x"},
		{"/v1/agents/a1/drain", `spot \u0000 notice`},
		{"/v1/agents/a1/undrain", strings.Repeat("x", ReasonExcerptBytes+1)},
	} {
		code, body := h.do(t, http.MethodPost, tc.path, `{"reason":"`+tc.reason+`"}`)
		if e := errorOf(t, body); code != http.StatusBadRequest || e.Code != berth.EInvalidRequest {
			t.Errorf("%s with a %d-byte reason: %d %s; want 400 invalid_request", tc.path, len(tc.reason), code, body)
		}
	}
	a, err := h.st.Agent(ctx, "a1")
	must(t, err)
	if a.Status != berth.AgentActive || a.DrainReason != "" || events() != before {
		t.Fatalf("after refused drains: status %s, reason %d bytes, %d events (was %d); want it untouched", a.Status, len(a.DrainReason), events(), before)
	}
	whole := strings.Repeat("é", ReasonExcerptBytes/2)
	if code, body := h.do(t, http.MethodPost, "/v1/agents/a1/drain", `{"reason":"`+whole+`"}`); code != http.StatusAccepted {
		t.Fatalf("drain with a reason at the bound: %d %s; want 202", code, body)
	}
	evs, err := h.st.Events(ctx, berth.EventFilter{Entity: "agent/a1", Limit: 100})
	must(t, err)
	if last := evs[len(evs)-1]; last.Reason != whole {
		t.Errorf("the drain's event reason is %d bytes; want the %d sent, whole", len(last.Reason), len(whole))
	}
}

// TestEventFiltersRefuseWhatMatchesNothing (a new user's report, item 6): GET
// /v1/events?entity=bogus and ?to=bogus answered 200 and no events while ?type=bogus was 400.
// An entity that is not <kind>/<id> (or the prefix <kind>/) of a kind events are written for,
// and a to that no entity's events move to, are 400 invalid_request; every kind events exist
// for — tenant and volume included, which ?type= used to refuse — and every prefix still work.
func TestEventFiltersRefuseWhatMatchesNothing(t *testing.T) {
	h := newHarness(t, time.Second)
	h.heartbeat(t, "a1", "http://127.0.0.1:1", 4096) // agent/a1: "" → active
	if code, body := h.do(t, http.MethodPut, "/v1/tenants/acme/quota", `{"max_sandboxes":5}`); code != http.StatusOK {
		t.Fatalf("quota: %d %s", code, body) // tenant/acme: → quota
	}
	for _, q := range []string{
		"entity=bogus", "entity=bogus/x", "entity=/x", "entity=sandbox", "entity=Sandbox/x", "entity=sandbox/a%00b",
		"entity=sandbox/" + strings.Repeat("x", 300), "to=bogus", "to=Running", "to=" + strings.Repeat("x", 100),
		"type=bogus", "entity=agent/&to=bogus",
	} {
		code, body := h.do(t, http.MethodGet, "/v1/events?"+q, "")
		if code != http.StatusBadRequest || errorOf(t, body).Code != berth.EInvalidRequest {
			t.Errorf("GET /v1/events?%.60s: %d %.200s; want 400 invalid_request", q, code, body)
		}
	}
	for q, want := range map[string]int{
		"":                             2,
		"entity=agent/":                1,
		"entity=agent/a1":              1,
		"entity=agent/a1&to=active":    1,
		"to=active":                    1,
		"entity=sandbox/":              0,
		"entity=sandbox/sb-none":       0,
		"to=lost":                      0,
		"entity=reservation/&to=held":  0,
		"entity=tenant/acme&to=quota":  1,
		"type=tenant":                  1,
		"type=volume":                  0,
		"entity=volume/acme/":          0,
		"to=waiting_capacity&type=app": 0,
	} {
		code, body := h.do(t, http.MethodGet, "/v1/events?"+q, "")
		var got struct{ Events []berth.Event }
		if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil || len(got.Events) != want {
			t.Errorf("GET /v1/events?%s: %d %.300s; want 200 with %d events", q, code, body, want)
		}
	}
}

// TestEventFilterDocMatchesCode: the type and to values api/openapi.yaml lists for GET
// /v1/events are exactly the kinds and states the server takes.
func TestEventFilterDocMatchesCode(t *testing.T) {
	params := loadOpenAPI(t).Paths.Value("/v1/events").Get.Parameters
	for name, want := range map[string][]string{"type": berth.EventKinds(), "to": berth.EventTos()} {
		var got []string
		for _, v := range params.GetByInAndName("query", name).Schema.Value.Enum {
			got = append(got, fmt.Sprint(v))
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("api/openapi.yaml's %s values for GET /v1/events (-code +doc):\n%s", name, diff)
		}
	}
}
