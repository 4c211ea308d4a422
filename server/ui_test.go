package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/prometheus/client_golang/prometheus"
)

// uiGet fetches path from the harness's server without following redirects, with key (none
// when empty) and extra headers.
func uiGet(t *testing.T, h *harness, path, key string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.srv.URL+path, nil)
	must(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return resp, string(b)
}

// TestDashboardFilesAndHeaders: /ui redirects to /ui/, the page and every file it loads are
// served from the binary with a strict CSP (no inline script or style, no other origin, never
// framed), X-Frame-Options DENY and nosniff, without a key; the page has no inline script and
// names no other origin; an unknown file is a 404 not_found; an ETag revalidates.
func TestDashboardFilesAndHeaders(t *testing.T) {
	h := newHarness(t, time.Second)

	resp, _ := uiGet(t, h, "/ui", "", nil)
	if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("GET /ui: %d Location %q, want 308 to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	checkUIHeaders(t, "/ui (redirect)", resp.Header)
	resp, _ = uiGet(t, h, "/", "", nil)
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("GET /: %d Location %q, want 302 to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	checkUIHeaders(t, "/ (redirect)", resp.Header)

	resp, page := uiGet(t, h, "/ui/", "", nil)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /ui/: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	checkUIHeaders(t, "/ui/", resp.Header)
	for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAllString(page, -1) {
		if !strings.Contains(tag, ` src=`) {
			t.Errorf("inline script in the page: %s", tag)
		}
	}
	if strings.Contains(page, " style=") || strings.Contains(page, "<style") {
		t.Error("inline style in the page: the CSP refuses it")
	}

	// Every file the page and its modules load, found by following them from the page.
	want := map[string]string{".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".html": "text/html"}
	ref := regexp.MustCompile(`(?:src|href)="([a-z]+\.[a-z]+)"|from "\./([a-z]+\.js)"|url\("([a-z]+\.[a-z]+)"\)`)
	seen := map[string]bool{}
	queue := []string{page}
	for len(queue) > 0 {
		body := queue[0]
		queue = queue[1:]
		for _, m := range ref.FindAllStringSubmatch(body, -1) {
			name := m[1] + m[2] + m[3]
			if seen[name] {
				continue
			}
			seen[name] = true
			resp, b := uiGet(t, h, "/ui/"+name, "", nil)
			ext := name[strings.LastIndex(name, "."):]
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), want[ext]) {
				t.Fatalf("GET /ui/%s: %d %q, want 200 %s", name, resp.StatusCode, resp.Header.Get("Content-Type"), want[ext])
			}
			checkUIHeaders(t, "/ui/"+name, resp.Header)
			for _, u := range regexp.MustCompile(`https?://[^\s"')]+`).FindAllString(b, -1) {
				if u != "http://www.w3.org/2000/svg" { // the SVG namespace names, never fetches
					t.Errorf("/ui/%s names another origin: %s", name, u)
				}
			}
			queue = append(queue, b)
		}
	}
	for _, name := range []string{"app.js", "api.js", "views.js", "table.js", "chart.js", "format.js", "style.css", "favicon.svg"} {
		if !seen[name] {
			t.Errorf("the page never loads %s", name)
		}
	}

	resp, _ = uiGet(t, h, "/ui/app.js", "", nil)
	tag := resp.Header.Get("ETag")
	if resp, _ = uiGet(t, h, "/ui/app.js", "", map[string]string{"If-None-Match": tag}); tag == "" || resp.StatusCode != http.StatusNotModified {
		t.Fatalf("revalidating app.js with ETag %q: %d, want 304", tag, resp.StatusCode)
	}

	resp, body := uiGet(t, h, "/ui/nope.js", "", nil)
	var eb berth.ErrorBody
	if resp.StatusCode != http.StatusNotFound || json.Unmarshal([]byte(body), &eb) != nil || eb.Error.Code != berth.ENotFound {
		t.Fatalf("GET /ui/nope.js: %d %s, want 404 not_found", resp.StatusCode, body)
	}
	checkUIHeaders(t, "/ui/nope.js (404)", resp.Header)
}

func checkUIHeaders(t *testing.T, path string, hdr http.Header) {
	t.Helper()
	csp := hdr.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("%s: CSP %q lacks %q", path, csp, want)
		}
	}
	if strings.Contains(csp, "unsafe") || strings.Contains(csp, "*") {
		t.Errorf("%s: CSP %q allows unsafe or any source", path, csp)
	}
	if hdr.Get("X-Frame-Options") != "DENY" || hdr.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("%s: X-Frame-Options %q, X-Content-Type-Options %q", path, hdr.Get("X-Frame-Options"), hdr.Get("X-Content-Type-Options"))
	}
}

// TestRefusalsPerMinute: GET /v1/refusals counts real create refusals (a fleet with no agent:
// no_healthy_agents) in the minute they happened, keeps the window's minutes oldest first,
// and refuses tenant keys (403) and a window out of range (400).
func TestRefusalsPerMinute(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC)}
	h := newHarnessWith(t, func(c *Config) { c.Clock = clk.Now })
	refuse := func(n int) {
		for range n {
			if code, body := h.do(t, http.MethodPost, "/v1/sandboxes", `{"template":"python"}`); code != http.StatusServiceUnavailable {
				t.Fatalf("create on an empty fleet: %d %s, want 503", code, body)
			}
		}
	}
	read := func(window string) RefusalWindow {
		code, body := h.do(t, http.MethodGet, "/v1/refusals?window="+window, "")
		if code != http.StatusOK {
			t.Fatalf("GET /v1/refusals: %d %s", code, body)
		}
		var w RefusalWindow
		must(t, json.Unmarshal([]byte(body), &w))
		return w
	}

	refuse(3)
	// A read samples the counter, as the window's own sampler does every 5 s (real time).
	if w := read("60"); len(w.Buckets) != 1 || w.Buckets[0].Counts[berth.ENoHealthyAgents] != 3 {
		t.Fatalf("minute 10:00: %+v, want 3 %s", w.Buckets, berth.ENoHealthyAgents)
	}
	clk.Add(2 * time.Minute) // 10:02:30
	refuse(2)
	w := read("600")
	if w.WindowS != 600 || w.BucketS != 60 || len(w.Buckets) != 10 {
		t.Fatalf("window %d s, buckets of %d s, %d buckets; want 600, 60, 10", w.WindowS, w.BucketS, len(w.Buckets))
	}
	last := w.Buckets[9]
	if !last.Start.Equal(time.Date(2026, 3, 1, 10, 2, 0, 0, time.UTC)) || last.Counts[berth.ENoHealthyAgents] != 2 {
		t.Fatalf("current minute %v %v, want 10:02 with 2 %s", last.Start, last.Counts, berth.ENoHealthyAgents)
	}
	if w.Buckets[8].Counts[berth.ENoHealthyAgents] != 0 || w.Buckets[7].Counts[berth.ENoHealthyAgents] != 3 {
		t.Fatalf("minutes 10:01 and 10:00: %v %v, want 0 and 3", w.Buckets[8].Counts, w.Buckets[7].Counts)
	}
	if w.Totals[berth.ENoHealthyAgents] != 5 || len(w.Codes) != 1 || w.Codes[0] != berth.ENoHealthyAgents || w.Replica != h.s.cfg.ReplicaID {
		t.Fatalf("totals %v codes %v replica %q", w.Totals, w.Codes, w.Replica)
	}

	clk.Add(time.Hour) // the hour after: every minute of it empty
	if w := read("3600"); len(w.Buckets) != 60 || len(w.Totals) != 0 || w.Codes == nil {
		t.Fatalf("an hour later: %d buckets, totals %v, codes %#v; want 60 empty, codes []", len(w.Buckets), w.Totals, w.Codes)
	}

	for _, bad := range []string{"59", "3601", "abc", "-60"} {
		if code, body := h.do(t, http.MethodGet, "/v1/refusals?window="+bad, ""); code != http.StatusBadRequest || !strings.Contains(body, berth.EInvalidRequest) {
			t.Errorf("window=%s: %d %s, want 400 invalid_request", bad, code, body)
		}
	}
	must(t, h.st.PutAPIKey(context.Background(), berth.APIKey{ID: "k-t", Tenant: "acme", Role: berth.RoleTenant, Hash: HashKey("bk_tenant_ui"), CreatedAt: clk.Now()}))
	if resp, body := uiGet(t, h, "/v1/refusals", "bk_tenant_ui", nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("tenant key: %d %s, want 403", resp.StatusCode, body)
	}
}

// TestRefusalSamplerEndsWithItsWindow: the sampling goroutine samples while its window is in
// use and ends once nothing holds the window (no Close needed, no goroutine per discarded
// Server left behind).
func TestRefusalSamplerEndsWithItsWindow(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_refusals_total"}, []string{"code"})
	w := newRefusalWindow(vec, time.Now, time.Millisecond)
	stopped := w.stopped
	vec.WithLabelValues(berth.ENoCapacity).Add(4)
	deadline := time.Now().Add(10 * time.Second)
	for sampled := false; !sampled; {
		w.mu.Lock()
		sampled = w.last[berth.ENoCapacity] == 4 // the goroutine sampled it (read() would sample itself)
		w.mu.Unlock()
		select {
		case <-stopped:
			t.Fatal("the sampler ended while its window is in use")
		default:
		}
		if !sampled && time.Now().After(deadline) {
			t.Fatal("the sampler never sampled the counter")
		}
		time.Sleep(time.Millisecond) // real: the sampler goroutine runs on the real clock, and the GC decides when its window goes
	}
	w = nil
	for ended := false; !ended; {
		runtime.GC()
		select {
		case <-stopped:
			ended = true
		case <-time.After(5 * time.Millisecond):
		}
		if !ended && time.Now().After(deadline) {
			t.Fatal("the sampler of an unreachable window still runs")
		}
	}
}
