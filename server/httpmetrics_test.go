package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// get sends GET path with key (none when "") and returns the status and the body.
func (h *harness) get(t *testing.T, path, key string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.srv.URL+path, nil)
	must(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return resp.StatusCode, string(b)
}

// scrapeFamilies reads the server's GET /metrics over HTTP.
func scrapeFamilies(t *testing.T, h *harness) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := h.get(t, "/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	must(t, err)
	return fams
}

// labelsOf returns the label sets of family name's series.
func labelsOf(fams map[string]*dto.MetricFamily, name string) []map[string]string {
	var out []map[string]string
	for _, m := range fams[name].GetMetric() {
		ls := map[string]string{}
		for _, l := range m.GetLabel() {
			ls[l.GetName()] = l.GetValue()
		}
		out = append(out, ls)
	}
	return out
}

// TestHTTPMetrics_RoutesArePatterns: /metrics carries the Go and process collectors, and every
// request is counted by its mux pattern and status code, never by its raw path (issue 15).
func TestHTTPMetrics_RoutesArePatterns(t *testing.T) {
	h := newHarness(t, time.Millisecond)
	if code, _ := h.get(t, "/v1/sandboxes/sb-secret-looking-id", h.key); code != http.StatusNotFound {
		t.Fatalf("GET an unknown sandbox: %d, want 404", code)
	}
	if code, _ := h.get(t, "/no/such/path/12345", h.key); code != http.StatusNotFound {
		t.Fatalf("GET an unknown path: %d, want 404", code)
	}
	if code, _ := h.get(t, "/v1/sandboxes", h.key); code != http.StatusOK {
		t.Fatalf("GET /v1/sandboxes: %d, want 200", code)
	}
	fams := scrapeFamilies(t, h)
	for _, name := range []string{"go_goroutines", "process_open_fds", "berth_http_requests_total", "berth_http_request_duration_seconds"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	counted := map[string]float64{}
	for _, m := range fams["berth_http_requests_total"].GetMetric() {
		var route, code string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "route":
				route = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		counted[route+" → "+code] = m.GetCounter().GetValue()
	}
	for _, want := range []string{"GET /v1/sandboxes/{id} → 404", "/ → 404", "GET /v1/sandboxes → 200"} {
		if counted[want] != 1 {
			t.Errorf("berth_http_requests_total %s = %v, want 1 (all: %v)", want, counted[want], counted)
		}
	}
	for _, name := range []string{"berth_http_requests_total", "berth_http_request_duration_seconds"} {
		for _, ls := range labelsOf(fams, name) {
			if strings.Contains(ls["route"], "sb-secret") || strings.Contains(ls["route"], "12345") {
				t.Errorf("%s has a raw path as its route: %v", name, ls)
			}
		}
	}
	if _, ok := fams["berth_ledger_outstanding_reserved_mib"]; ok {
		t.Error("berth_ledger_outstanding_reserved_mib is still exported; it is _bytes now")
	}
}

// TestPprof_AdminOnly: /debug/pprof is on the admin side only (issue 15): no key 401, a
// tenant key 403, the admin key the profile index and a profile.
func TestPprof_AdminOnly(t *testing.T) {
	h := newHarness(t, time.Millisecond)
	tenantKey := NewKeySecret()
	ctx := context.Background()
	must(t, tenantErr(h.st.PutTenant(ctx, berth.Tenant{Name: "globex", CreatedAt: time.Now()})))
	must(t, h.st.PutAPIKey(ctx, berth.APIKey{ID: "k-tenant", Tenant: "globex", Role: berth.RoleTenant, Hash: HashKey(tenantKey), CreatedAt: time.Now()}))
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		if code, body := h.get(t, path, ""); code != http.StatusUnauthorized {
			t.Errorf("GET %s without a key: %d %q, want 401", path, code, body)
		}
		if code, body := h.get(t, path, tenantKey); code != http.StatusForbidden {
			t.Errorf("GET %s with a tenant key: %d %q, want 403", path, code, body)
		}
	}
	code, body := h.get(t, "/debug/pprof/", h.key)
	if code != http.StatusOK || !strings.Contains(body, "goroutine") || !strings.Contains(body, "heap") {
		t.Fatalf("GET /debug/pprof/ as admin: %d, want 200 and the profile index; got %.200q", code, body)
	}
	if code, body := h.get(t, "/debug/pprof/goroutine?debug=1", h.key); code != http.StatusOK || !strings.Contains(body, "goroutine profile:") {
		t.Fatalf("GET the goroutine profile as admin: %d %.200q", code, body)
	}
}

// TestPprof_BoundedAndOneAtATime (found by an attack): trace?seconds=1e9 streamed until the
// request's write deadline, and a second CPU profile was pprof's plain-text 500. A duration
// outside (0, 120] s is 400, and while one profile runs another is 409 conflict.
func TestPprof_BoundedAndOneAtATime(t *testing.T) {
	h := newHarness(t, time.Millisecond)
	for _, path := range []string{"/debug/pprof/trace?seconds=1e9", "/debug/pprof/profile?seconds=121", "/debug/pprof/profile?seconds=abc",
		"/debug/pprof/trace?seconds=-1", "/debug/pprof/profile?seconds=0.5"} {
		if code, body := h.get(t, path, h.key); code != http.StatusBadRequest || !strings.Contains(body, berth.EInvalidRequest) {
			t.Errorf("GET %s: %d %.200q, want 400 invalid_request", path, code, body)
		}
	}
	// Two profiles that overlap: whichever comes second is 409. A 2 s one runs beside
	// 1 s ones sent one after another until one of the two sides meets a conflict.
	first := make(chan int, 1)
	go func() {
		code, _ := h.get(t, "/debug/pprof/profile?seconds=2", h.key)
		first <- code
	}()
	codes := map[int]int{}
	for range 5 { // each try takes 1 s while it holds the profiler, or none while the other does
		code, body := h.get(t, "/debug/pprof/profile?seconds=1", h.key)
		codes[code]++
		if code == http.StatusConflict && !strings.Contains(body, berth.EConflict) {
			t.Fatalf("a second profile: %d %.200q, want the conflict code", code, body)
		}
		if code == http.StatusConflict {
			break
		}
	}
	codes[<-first]++
	if codes[http.StatusConflict] == 0 || codes[http.StatusOK] == 0 || len(codes) != 2 {
		t.Fatalf("overlapping profiles answered %v; want 200s and at least one 409 conflict, nothing else", codes)
	}
}
