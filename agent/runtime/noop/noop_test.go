package noop

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
)

// TestAPP1_NoopServicesAreBookkeeping: on the benchmark runtime a service is recorded and
// reported running (so app reconcilers can be driven against noop agents), a second one is
// service_running, and the port endpoint answers 501 unsupported: there is no app to reach.
func TestAPP1_NoopServicesAreBookkeeping(t *testing.T) {
	cfg := agent.DefaultConfig()
	cfg.ID = "n1"
	cfg.NodeToken = "tok"
	cfg.MemoryMiB = 4096
	cfg.HeadroomMiB = 0
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := agent.New(cfg, &Runtime{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	if err := a.Create(context.Background(), berth.AgentCreate{ID: "s1", MemoryMiB: 256, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	do := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewBufferString(body))
		req.Header.Set(berth.HeaderNodeToken, "tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code := func(b []byte) string {
		var e berth.ErrorBody
		_ = json.Unmarshal(b, &e)
		return e.Error.Code
	}
	if st, b := do("POST", "/internal/sandboxes/s1/service", `{"cmd":["app"]}`); st != http.StatusNoContent {
		t.Fatalf("POST service = %d %s, want 204", st, b)
	}
	if st, b := do("POST", "/internal/sandboxes/s1/service", `{"cmd":["app"]}`); st != http.StatusConflict || code(b) != berth.EServiceRunning {
		t.Fatalf("second POST service = %d %s, want 409 %s", st, b, berth.EServiceRunning)
	}
	st, b := do("GET", "/internal/sandboxes/s1/service", "")
	var got berth.ServiceStatus
	if err := json.Unmarshal(b, &got); st != http.StatusOK || err != nil || got != (berth.ServiceStatus{Started: true}) {
		t.Fatalf("GET service = %d %s, want 200 started", st, b)
	}
	if st, b := do("GET", "/internal/sandboxes/s1/port/8080/", ""); st != http.StatusNotImplemented || code(b) != berth.EUnsupported {
		t.Fatalf("GET port = %d %s, want 501 %s", st, b, berth.EUnsupported)
	}
	if err := a.Delete(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if st, b := do("GET", "/internal/sandboxes/s1/service", ""); st != http.StatusNotFound {
		t.Fatalf("GET service after delete = %d %s, want 404", st, b)
	}
}
