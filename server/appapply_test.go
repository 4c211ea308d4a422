package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/logtest"
)

// faultyAppWrites is the real store whose next fail app writes fail as a store fault would
// (a dropped connection), not as a stale revision; reads of sandbox unreadable fail too.
type faultyAppWrites struct {
	berth.Store
	mu           sync.Mutex
	fail, failed int
	unreadable   string
}

func (f *faultyAppWrites) Sandbox(ctx context.Context, id string) (berth.Sandbox, error) {
	if id == f.unreadable {
		return berth.Sandbox{}, errors.New("store: connection reset by peer")
	}
	return f.Store.Sandbox(ctx, id)
}

func (f *faultyAppWrites) UpdateApp(ctx context.Context, a berth.App, reason, actor string, now time.Time) (berth.App, error) {
	f.mu.Lock()
	if f.fail > 0 {
		f.fail--
		f.failed++
		f.mu.Unlock()
		return berth.App{}, errors.New("store: connection reset by peer")
	}
	f.mu.Unlock()
	return f.Store.UpdateApp(ctx, a, reason, actor, now)
}

// faultyReplica is a second server on h's store whose next fail app writes fail.
func faultyReplica(h *harness, fail int) (*Server, *faultyAppWrites, *logtest.Buffer) {
	st := &faultyAppWrites{Store: h.st, fail: fail}
	logs := &logtest.Buffer{}
	cfg := h.s.cfg
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.Registry = prometheus.NewRegistry()
	cfg.AppBackoffBase, cfg.AppBackoffCap = time.Millisecond, time.Millisecond // the waits between tries
	return New(cfg, st), st, logs
}

// TestAPP2_StoreFaultOnARefusalIsRetried: the write that records a refusal (waiting_capacity
// and the next try after Retry-After) meets two store faults. It is not dropped: each fault
// is logged and the write tried again with the shared backoff, so the round still records
// the refusal. (Dropped, the app stayed deploying with no retry time, and the next round
// tried to place it again at once, before Retry-After.)
func TestAPP2_StoreFaultOnARefusalIsRetried(t *testing.T) {
	clk := &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)}
	h := newHarnessWith(t, func(c *Config) { c.Clock = clk.Now })
	h.createApp(t, "web", `["python3","-m","http.server","8080"]`) // no reconciler loop runs
	s, st, logs := faultyReplica(h, 2)
	s.reconcileApp(context.Background(), h.app(t, "web")) // no agent: no_healthy_agents
	a := h.app(t, "web")
	if a.State != berth.AppWaitingCapacity || a.Attempts != 1 || a.RetryAt.IsZero() {
		t.Fatalf("after a round whose write met 2 store faults: %s, %d attempts, retry at %v (%s); want waiting_capacity, 1, a retry time",
			a.State, a.Attempts, a.RetryAt, a.Reason)
	}
	if st.failed != 2 || strings.Count(logs.String(), "store write failed") != 2 {
		t.Fatalf("%d faults, logged:\n%s\nwant 2 faults, each logged", st.failed, logs)
	}
}

// TestAPP2_StoreFaultRetriesAreBounded: a store that keeps failing gets appStoreTries tries
// in one round, each logged, the last saying it gives up; the app is left as it was for the
// next round.
func TestAPP2_StoreFaultRetriesAreBounded(t *testing.T) {
	clk := &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)}
	h := newHarnessWith(t, func(c *Config) { c.Clock = clk.Now })
	h.createApp(t, "web", `["python3","-m","http.server","8080"]`)
	s, st, logs := faultyReplica(h, 100)
	s.reconcileApp(context.Background(), h.app(t, "web"))
	if a := h.app(t, "web"); a.State != berth.AppDeploying || a.Attempts != 0 {
		t.Fatalf("after a round whose writes all failed: %s, %d attempts; want deploying, 0", a.State, a.Attempts)
	}
	if st.failed != appStoreTries || !strings.Contains(logs.String(), "giving_up=true") {
		t.Fatalf("%d tries, logged:\n%s\nwant %d, the last giving up", st.failed, logs, appStoreTries)
	}
}

// TestAPP2_RetireKeepsASandboxTheStoreCannotRead: a sandbox on an app's retire list whose
// row cannot be read (a store fault) stays on the list, logged, for the next round to stop.
// (Before, the read's error was dropped and the sandbox left the list still running, until
// its TTL.)
func TestAPP2_RetireKeepsASandboxTheStoreCannotRead(t *testing.T) {
	clk := &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)}
	h := newHarnessWith(t, func(c *Config) { c.Clock = clk.Now })
	ctx := context.Background()
	h.createApp(t, "web", `["python3","-m","http.server","8080"]`)
	must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-old", Template: "python", Tenant: "acme", State: berth.SandboxRunning,
		MemoryMiB: 256, CreatedAt: clk.Now(), ExpiresAt: clk.Now().Add(time.Hour)}, "test", clk.Now()))
	a := h.app(t, "web")
	a.Desired, a.State, a.Retire, a.RetireAt = berth.DesireStopped, berth.AppStopped, []string{"sb-old"}, clk.Now()
	_, err := h.st.UpdateApp(ctx, a, "test", "test", clk.Now())
	must(t, err)
	s, st, logs := faultyReplica(h, 0)
	st.unreadable = "sb-old"
	s.reconcileApp(ctx, h.app(t, "web"))
	if a := h.app(t, "web"); !slices.Equal(a.Retire, []string{"sb-old"}) {
		t.Fatalf("retire list %v after a round that could not read sb-old; want it kept", a.Retire)
	}
	if !strings.Contains(logs.String(), "stays on the retire list") {
		t.Fatalf("logged:\n%s\nwant the read's fault", logs)
	}
	st.unreadable = "" // the store is back: the next round stops it and empties the list
	s.reconcileApp(ctx, h.app(t, "web"))
	sb, err := h.st.Sandbox(ctx, "sb-old")
	must(t, err)
	if a := h.app(t, "web"); len(a.Retire) != 0 || !sb.State.Terminal() {
		t.Fatalf("next round: retire list %v, sb-old %s; want empty, stopped", a.Retire, sb.State)
	}
}
