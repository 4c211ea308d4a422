package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/preempt"
	"github.com/google/go-cmp/cmp"
)

// fakeRuntime is a hand-written function-field fake (STYLE habit 7): the agent's logic is
// tested here; the real process runtime is tested in its own package and end to end.
type fakeRuntime struct {
	mu       sync.Mutex
	start    func(id string) error
	resident map[string]int64
	seen     bool
	stopped  []string
	// stopping, when set, is called inside Stop (unlocked): a slow runtime's stop.
	stopping func(id string)
	exited   map[string]bool // guests that read as exited
}

func (f *fakeRuntime) Start(ctx context.Context, spec Spec) error {
	if f.start != nil {
		return f.start(spec.ID)
	}
	return nil
}
func (f *fakeRuntime) Stop(ctx context.Context, id string) error {
	if f.stopping != nil {
		f.stopping(id)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, id)
	return nil
}
func (f *fakeRuntime) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	return berth.ExecResult{}, nil
}
func (f *fakeRuntime) WriteFile(ctx context.Context, id, path string, content io.Reader) error {
	return nil
}
func (f *fakeRuntime) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	return io.NopCloser(strings.NewReader("")), 0, nil
}
func (f *fakeRuntime) Measure(id string) (Measurement, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Measurement{ResidentMiB: f.resident[id], Seen: f.seen, Exited: f.exited[id]}, nil
}

func newTestAgent(t *testing.T, mode string, memMiB int64, rt *fakeRuntime) *Agent {
	t.Helper()
	return newAgentOn(t, mode, memMiB, rt, nil)
}

// newAgentOn is newTestAgent on any runtime, its config changed by mutate (nil: none) before
// the agent is made.
func newAgentOn(t *testing.T, mode string, memMiB int64, rt Runtime, mutate func(*Config)) *Agent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID = "a1"
	cfg.Admission = mode
	cfg.MemoryMiB = memMiB
	cfg.HeadroomMiB = 0
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ln.Close() })
	return a
}

func create(a *Agent, id string, mib int64) error {
	return a.Create(context.Background(), berth.AgentCreate{ID: id, MemoryMiB: mib, ExpiresAt: time.Now().Add(time.Hour)})
}

// TestAGT2_LocalGateCommitted: the agent's own gate admits exactly what ADM-2 allows,
// whatever the scheduler believed.
func TestAGT2_LocalGateCommitted(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, &fakeRuntime{})
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		if err := create(a, id, 512); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
	}
	if err := create(a, "s5", 512); berth.ErrorCode(err) != berth.ENoCapacity {
		t.Fatalf("5th create: %v, want no_capacity", err)
	}
	if hb := a.Heartbeat(time.Now()); hb.MemoryMiBAdmittable != 0 || hb.MemoryMiBCommitted != 2048 {
		t.Fatalf("heartbeat admittable %d committed %d, want 0 and 2048", hb.MemoryMiBAdmittable, hb.MemoryMiBCommitted)
	}
	if err := create(a, "s1", 512); err != nil {
		t.Fatalf("a repeated create of a held id must succeed (scheduler retry): %v", err)
	}
}

// TestADM5_ReserveUntilMeasured: a working-set guest is charged its reserve until a
// measurement sees it, then its resident size.
func TestADM5_ReserveUntilMeasured(t *testing.T) {
	rt := &fakeRuntime{resident: map[string]int64{"s1": 40}}
	a := newTestAgent(t, berth.AdmissionWorkingSet, 2048, rt)
	if err := create(a, "s1", 1024); err != nil {
		t.Fatal(err)
	}
	if got := a.Heartbeat(time.Now()).MemoryMiBAdmittable; got != 2048-512 {
		t.Fatalf("before measurement admittable = %d, want %d (reserve 512)", got, 2048-512)
	}
	a.measureOnce(context.Background(), time.Now()) // runtime has not seen the guest yet
	if got := a.Heartbeat(time.Now()).MemoryMiBAdmittable; got != 2048-512 {
		t.Fatalf("unseen guest admittable = %d, want reserve still charged", got)
	}
	rt.mu.Lock()
	rt.seen = true
	rt.mu.Unlock()
	a.measureOnce(context.Background(), time.Now())
	if got := a.Heartbeat(time.Now()).MemoryMiBAdmittable; got != 2048-40 {
		t.Fatalf("measured admittable = %d, want %d", got, 2048-40)
	}
}

// TestADM5_ReserveExpires: a reserve no measurement ever confirms expires on its TTL.
func TestADM5_ReserveExpires(t *testing.T) {
	rt := &fakeRuntime{resident: map[string]int64{"s1": 0}}
	a := newTestAgent(t, berth.AdmissionWorkingSet, 2048, rt)
	if err := create(a, "s1", 1024); err != nil {
		t.Fatal(err)
	}
	a.measureOnce(context.Background(), time.Now().Add(a.cfg.ReserveTTL+time.Second))
	if got := a.Heartbeat(time.Now()).MemoryMiBAdmittable; got != 2048 {
		t.Fatalf("after reserve TTL admittable = %d, want 2048", got)
	}
}

// TestADM10_StartSemaphore: a create that cannot get a start slot quickly is refused with
// host_starts_saturated, and a failed start releases its reserve (ADM-5).
func TestADM10_StartSemaphore(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	rt := &fakeRuntime{start: func(id string) error {
		if id == "slow" {
			close(started)
			<-release
			return errors.New("boom")
		}
		return nil
	}}
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, rt)
	a.cfg.StartSlotWait = 20 * time.Millisecond
	a.starts = make(chan struct{}, 1)
	done := make(chan error)
	go func() { done <- create(a, "slow", 512) }()
	<-started
	if err := create(a, "next", 512); berth.ErrorCode(err) != berth.EHostStartsSaturated {
		t.Fatalf("create while the only slot is held: %v, want host_starts_saturated", err)
	}
	close(release)
	if err := <-done; berth.ErrorCode(err) != berth.EUnavailable {
		t.Fatalf("failed start: %v, want unavailable", err)
	}
	hb := a.Heartbeat(time.Now())
	if hb.MemoryMiBAdmittable != 2048 || len(hb.Sandboxes) != 0 || hb.StartsInFlight != 0 {
		t.Fatalf("after a failed start: admittable %d, sandboxes %v, starts %d; want everything released",
			hb.MemoryMiBAdmittable, hb.Sandboxes, hb.StartsInFlight)
	}
}

// TestAGT7_TTLStops: a guest past its TTL is stopped, its memory freed, and the transition
// queued for the heartbeat.
func TestAGT7_TTLStops(t *testing.T) {
	rt := &fakeRuntime{}
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, rt)
	if err := a.Create(context.Background(), berth.AgentCreate{ID: "s1", MemoryMiB: 512, ExpiresAt: time.Now().Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Add(2 * time.Second)
	a.measureOnce(context.Background(), now)
	hb := a.Heartbeat(now)
	want := []berth.EndedSandbox{{ID: "s1", State: berth.SandboxStopped, Reason: "ttl", At: now.UTC()}}
	if diff := cmp.Diff(want, hb.Ended); diff != "" {
		t.Fatalf("ended (-want +got):\n%s", diff)
	}
	if hb.MemoryMiBAdmittable != 2048 || len(rt.stopped) != 1 {
		t.Fatalf("admittable %d, stopped %v", hb.MemoryMiBAdmittable, rt.stopped)
	}
}

// TestCase_C07_BadReadingClamped: a resident reading above the host's total is clamped and
// counted; admittable never goes negative or wraps.
func TestCase_C07_BadReadingClamped(t *testing.T) {
	rt := &fakeRuntime{resident: map[string]int64{"s1": 1 << 40}, seen: true}
	a := newTestAgent(t, berth.AdmissionWorkingSet, 2048, rt)
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	a.measureOnce(context.Background(), time.Now())
	hb := a.Heartbeat(time.Now())
	if hb.MemoryMiBAdmittable != 0 || hb.MeasurementErrors != 1 || hb.Sandboxes[0].ResidentMiB != 2048 {
		t.Fatalf("heartbeat %+v: want admittable 0, 1 measurement error, resident clamped to 2048", hb)
	}
}

// TestAGT5_DrainClosesIntake: a drained agent publishes admittable 0 and refuses creates.
func TestAGT5_DrainClosesIntake(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, &fakeRuntime{})
	a.Drain("test")
	a.Drain("test") // idempotent
	hb := a.Heartbeat(time.Now())
	if hb.Status != berth.AgentDraining || hb.IntakeOpen || hb.MemoryMiBAdmittable != 0 {
		t.Fatalf("drained heartbeat %+v", hb)
	}
	if err := create(a, "s1", 512); berth.ErrorCode(err) != berth.ENoCapacity {
		t.Fatalf("create on drained agent: %v", err)
	}
	a.Undrain()
	if err := create(a, "s1", 512); err != nil {
		t.Fatalf("create after undrain: %v", err)
	}
}

// TestNewRejectsBadConfig: POOL-1 and ADM-1 are checked before the agent starts.
func TestNewRejectsBadConfig(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"bad mode":             func(c *Config) { c.Admission = "optimistic" },
		"bad pool":             func(c *Config) { c.Pool = "gold" },
		"preemptible stateful": func(c *Config) { c.Preemptible = true },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultConfig()
			mutate(&cfg)
			if a, err := New(cfg, &fakeRuntime{}); err == nil {
				a.ln.Close()
				t.Fatalf("New accepted %+v", cfg)
			}
		})
	}
}

func TestParsePSISome(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=1.00 avg60=0 avg300=0 total=9\n", 12.5, true},
		{"full avg10=1.00\n", 0, false},
		{"some avg10=abc\n", 0, false},
		{"some avg10=-1\n", 0, false},
		{"", 0, false},
	} {
		got, ok := parsePSISome(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parsePSISome(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestDeleteDuringStart: a delete that arrives while the sandbox is still starting wins: the
// start is undone and nothing stays running; while it starts it is listed as starting.
func TestDeleteDuringStart(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	rt := &fakeRuntime{start: func(id string) error {
		close(started)
		<-release
		return nil
	}}
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, rt)
	done := make(chan error)
	go func() { done <- create(a, "s1", 512) }()
	<-started
	want := []berth.HeldSandbox{{ID: "s1", Starting: true, Incarnation: 1}}
	if hb := a.Heartbeat(time.Now()); !cmp.Equal(hb.Sandboxes, want) || hb.MemoryMiBAdmittable != 1536 {
		t.Fatalf("while starting: listed %v, admittable %d; want listed as starting and charged", hb.Sandboxes, hb.MemoryMiBAdmittable)
	}
	if err := a.Delete(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("create deleted mid-start: %v, want conflict", err)
	}
	hb := a.Heartbeat(time.Now())
	if len(hb.Sandboxes) != 0 || hb.MemoryMiBAdmittable != 2048 {
		t.Fatalf("after: %v, admittable %d", hb.Sandboxes, hb.MemoryMiBAdmittable)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.stopped) < 2 { // once by Delete, once by the undone start
		t.Fatalf("runtime stops %v: the started sandbox was not stopped", rt.stopped)
	}
}

// TestCase_C07_NegativeReadingClamped: a negative resident reading (real traces have
// -1.2e-05 utilisation) counts as 0 and as a measurement error, never as free memory.
func TestCase_C07_NegativeReadingClamped(t *testing.T) {
	rt := &fakeRuntime{resident: map[string]int64{"s1": -5}, seen: true}
	a := newTestAgent(t, berth.AdmissionWorkingSet, 2048, rt)
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	a.measureOnce(context.Background(), time.Now())
	hb := a.Heartbeat(time.Now())
	if hb.MemoryMiBAdmittable != 2048 || hb.MeasurementErrors != 1 || hb.Sandboxes[0].ResidentMiB != 0 {
		t.Fatalf("heartbeat %+v: want admittable 2048 (never above total), 1 measurement error, resident 0", hb)
	}
}

// TestADM8_PressureClosesIntake: above the close line the agent publishes admittable 0 and
// intake closed and its local gate refuses; after the hold below the open line it reopens.
func TestADM8_PressureClosesIntake(t *testing.T) {
	pressure := 50.0
	cfg := DefaultConfig()
	cfg.ID, cfg.Admission, cfg.MemoryMiB, cfg.HeadroomMiB = "a1", berth.AdmissionCommitted, 2048, 0
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.PressureSource = func() (float64, bool) { return pressure, true }
	a, err := New(cfg, &fakeRuntime{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ln.Close() })
	t0 := time.Now()
	a.measureOnce(context.Background(), t0)
	hb := a.Heartbeat(t0)
	if hb.IntakeOpen || hb.MemoryMiBAdmittable != 0 || hb.MemoryPressure != 50 {
		t.Fatalf("under pressure: %+v; want intake closed, admittable 0", hb)
	}
	if err := create(a, "s1", 512); berth.ErrorCode(err) != berth.ENoCapacity {
		t.Fatalf("create under pressure: %v, want no_capacity", err)
	}
	pressure = 0
	a.measureOnce(context.Background(), t0.Add(time.Second))
	a.measureOnce(context.Background(), t0.Add(10*time.Second))
	if a.Heartbeat(t0.Add(10 * time.Second)).IntakeOpen {
		t.Fatal("reopened before the 15 s hold")
	}
	a.measureOnce(context.Background(), t0.Add(17*time.Second))
	if hb := a.Heartbeat(t0.Add(17 * time.Second)); !hb.IntakeOpen || hb.MemoryMiBAdmittable != 2048 {
		t.Fatalf("after the hold: %+v; want intake open, admittable 2048", hb)
	}
	if err := create(a, "s1", 512); err != nil {
		t.Fatalf("create after reopening: %v", err)
	}
}

// TestADM9_EvictsLargestStatelessFirst: past the critical line for two measurements the
// agent evicts the stateless sandbox with the largest working set, one per measurement,
// never the stateful one, and stops once memory is back above the floor.
func TestADM9_EvictsLargestStatelessFirst(t *testing.T) {
	rt := &fakeRuntime{resident: map[string]int64{"stateful": 1000, "small": 300, "big": 500}, seen: true}
	cfg := DefaultConfig()
	cfg.ID, cfg.Admission, cfg.MemoryMiB, cfg.HeadroomMiB = "a1", berth.AdmissionNone, 2048, 0
	cfg.EvictFloorMiB = 400
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.PressureSource = func() (float64, bool) { return 0, true }
	a, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ln.Close() })
	for _, id := range []string{"stateful", "small", "big"} {
		if err := a.Create(context.Background(), berth.AgentCreate{ID: id, MemoryMiB: 1024, Stateful: id == "stateful", ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	a.measureOnce(context.Background(), t0) // available 248 MiB < 400: first critical reading
	if hb := a.Heartbeat(t0); len(hb.Ended) != 0 {
		t.Fatalf("evicted on one reading: %+v (one bad sample must not evict, C07)", hb.Ended)
	}
	a.measureOnce(context.Background(), t0.Add(time.Second))
	a.measureOnce(context.Background(), t0.Add(2*time.Second)) // available 748 MiB: calm
	hb := a.Heartbeat(t0.Add(2 * time.Second))
	if len(hb.Ended) != 1 || hb.Ended[0].ID != "big" || hb.Ended[0].State != berth.SandboxEvicted {
		t.Fatalf("ended %+v, want only the largest stateless sandbox evicted", hb.Ended)
	}
	held := map[string]bool{}
	for _, s := range hb.Sandboxes {
		held[s.ID] = true
	}
	if !held["stateful"] || !held["small"] || held["big"] {
		t.Fatalf("held %v, want stateful and small kept", held)
	}
}

// TestSPOT2_NoticeCordonsOnce: a notice cordons at once; the same notice again changes
// nothing (C13); a soft rebalance notice cordons only until its expiry, then the host returns
// to service by itself (C15), unless a real notice arrived meanwhile.
func TestSPOT2_NoticeCordonsOnce(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, &fakeRuntime{})
	a.cfg.SoftCordon = time.Minute
	t0 := time.Now()
	a.HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindRebalance, ID: "r1", Soft: true}, t0)
	if hb := a.Heartbeat(t0); hb.Status != berth.AgentDraining || hb.IntakeOpen {
		t.Fatalf("after a rebalance notice: %+v, want a cordon", hb)
	}
	a.expireSoftCordon(t0.Add(30 * time.Second))
	if a.Heartbeat(t0).Status != berth.AgentDraining {
		t.Fatal("soft cordon lifted before its expiry")
	}
	a.expireSoftCordon(t0.Add(61 * time.Second))
	if hb := a.Heartbeat(t0); hb.Status != berth.AgentActive || !hb.IntakeOpen {
		t.Fatalf("after the soft cordon expired: %+v, want back in service", hb)
	}
	a.HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindRebalance, ID: "r1", Soft: true}, t0.Add(62*time.Second))
	if a.Heartbeat(t0).Status != berth.AgentActive {
		t.Fatal("the same rebalance notice cordoned again (C13)")
	}
	a.HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindRebalance, ID: "r2", Soft: true}, t0.Add(70*time.Second))
	a.HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindTerminate, ID: "t1", Deadline: t0.Add(3 * time.Minute)}, t0.Add(71*time.Second))
	a.expireSoftCordon(t0.Add(10 * time.Minute))
	if hb := a.Heartbeat(t0); hb.Status != berth.AgentDraining {
		t.Fatalf("a real notice must keep the cordon past the soft expiry: %+v", hb)
	}
}

// TestSPOT2_CordonsLiftOnTheirOwn (found writing C15's test): each cause of a closed intake
// is lifted on its own. A soft cordon's expiry reopened a host an operator drained during it
// (the agent's own gate answered creates again), and an operator's undrain would have
// reopened a host a real notice cordoned.
func TestSPOT2_CordonsLiftOnTheirOwn(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, &fakeRuntime{})
	a.cfg.NodeToken = testToken
	a.cfg.SoftCordon = time.Minute
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	hdr := http.Header{berth.HeaderNodeToken: {testToken}}
	t0 := time.Now()
	a.HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindRebalance, ID: "r1", Soft: true}, t0)
	if code, _ := call(t, http.MethodPost, srv.URL+"/internal/drain?reason=maintenance", nil, hdr); code != http.StatusAccepted {
		t.Fatalf("operator drain: %d, want 202", code)
	}
	// The heartbeat says why, for the status change's event (LIF-3).
	if hb := a.Heartbeat(t0); hb.StatusReason != "aws rebalance notice; maintenance" {
		t.Fatalf("status reason under both: %q, want the notice's and the operator's", hb.StatusReason)
	}
	a.expireSoftCordon(t0.Add(2 * time.Minute))
	if hb := a.Heartbeat(t0); hb.Status != berth.AgentDraining || hb.IntakeOpen || hb.StatusReason != "maintenance" {
		t.Fatalf("after the soft cordon expired under an operator drain: %+v, want still drained for maintenance", hb)
	}
	if code, _ := call(t, http.MethodPost, srv.URL+"/internal/undrain", nil, hdr); code != http.StatusOK {
		t.Fatalf("operator undrain: %d, want 200", code)
	}
	if hb := a.Heartbeat(t0); hb.Status != berth.AgentActive || !hb.IntakeOpen || hb.StatusReason != "" {
		t.Fatalf("after the undrain, no notice in force: %+v, want back in service", hb)
	}
	// Soft cordon, then an operator's undrain: the cordon holds until it expires.
	a.HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindRebalance, ID: "r2", Soft: true}, t0.Add(3*time.Minute))
	call(t, http.MethodPost, srv.URL+"/internal/undrain", nil, hdr)
	if hb := a.Heartbeat(t0); hb.Status != berth.AgentDraining {
		t.Fatalf("an undrain lifted a soft cordon: %+v", hb)
	}
	a.expireSoftCordon(t0.Add(5 * time.Minute))
	if hb := a.Heartbeat(t0); hb.Status != berth.AgentActive {
		t.Fatalf("the soft cordon expired with nothing else in force: %+v, want back in service", hb)
	}
	// Shutting down (found by an attack): an undrain in the seconds before the listener
	// closes does not reopen the host.
	a.beginShutdown()
	call(t, http.MethodPost, srv.URL+"/internal/undrain", nil, hdr)
	if hb := a.Heartbeat(t0); hb.Status != berth.AgentDraining || hb.IntakeOpen || hb.StatusReason != "agent shutting down" {
		t.Fatalf("a shutting-down agent after an undrain: %+v, want still draining, shutting down", hb)
	}
}

// TestAgentRegionNoCreateCanName: a region longer than a create may ask for (64 bytes) is
// refused at start: the host could never be asked for by name (found by an attack).
func TestAgentRegionNoCreateCanName(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ID, cfg.MemoryMiB, cfg.HeadroomMiB, cfg.Region = "a1", 2048, 0, strings.Repeat("r", berth.MaxRegionBytes+1)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := New(cfg, &fakeRuntime{})
	if err == nil {
		a.ln.Close()
		t.Fatal("an agent with a 65-byte region started")
	}
	if berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(err.Error(), "region") {
		t.Fatalf("a 65-byte region: %v; want invalid_request naming it", err)
	}
}

// TestSPOT2_NegativeSoftCordonRefused: `berth agent --soft-cordon -5m` is a mistake, refused
// at start, not silently the default.
func TestSPOT2_NegativeSoftCordonRefused(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ID, cfg.MemoryMiB, cfg.HeadroomMiB, cfg.SoftCordon = "a1", 2048, 0, -5*time.Minute
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := New(cfg, &fakeRuntime{})
	if err == nil {
		a.ln.Close()
		t.Fatal("an agent with a negative soft cordon started")
	}
	if berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(err.Error(), "soft cordon") {
		t.Fatalf("negative soft cordon: %v; want invalid_request naming it", err)
	}
}

// TestDeleteIsNotACrash: while a delete stops a guest (gVisor's stop takes ~60 ms), the
// runtime already reads it as exited; the measure loop must not report that exit as a
// crash (failed), which would beat the server's "stopped" and make a killed sandbox end
// failed (seen in TestE2E_GVisorREADME under load).
func TestDeleteIsNotACrash(t *testing.T) {
	rt := &fakeRuntime{exited: map[string]bool{}}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
	ctx := context.Background()
	if err := a.Create(ctx, berth.AgentCreate{ID: "sb-1", MemoryMiB: 256}); err != nil {
		t.Fatal(err)
	}
	inStop, release := make(chan struct{}), make(chan struct{})
	rt.stopping = func(string) {
		rt.mu.Lock()
		rt.exited["sb-1"] = true // the runtime killed it: it reads as exited from here on
		rt.mu.Unlock()
		close(inStop)
		<-release
	}
	done := make(chan error)
	go func() { done <- a.Delete(ctx, "sb-1") }()
	<-inStop
	a.measureOnce(ctx, time.Now()) // runs while the delete's stop is under way
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if hb := a.Heartbeat(time.Now()); len(hb.Ended) != 0 || len(hb.Sandboxes) != 0 {
		t.Fatalf("after a delete the heartbeat reports ended %+v, held %+v; want nothing", hb.Ended, hb.Sandboxes)
	}
}

// TestRuntimeErrDuringADelete: a runtime call that fails because a delete is stopping its
// sandbox is 404 sandbox_not_found "was deleted during the exec", not 409 "its init may have
// died, e.g. out of memory" (the guest was still held while the runtime stopped it).
func TestRuntimeErrDuringADelete(t *testing.T) {
	stopping, release := make(chan struct{}), make(chan struct{})
	rt := &fakeRuntime{stopping: func(string) { close(stopping); <-release }}
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, rt)
	if err := create(a, "s1", 512); err != nil {
		t.Fatal(err)
	}
	if err := a.runtimeErr("s1", "exec", errors.New("init socket closed")); berth.ErrorCode(err) != berth.EConflict {
		t.Fatalf("a held sandbox's failed exec: %v, want conflict", err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- a.Delete(context.Background(), "s1") }()
	<-stopping
	err := a.runtimeErr("s1", "exec", errors.New("init socket closed"))
	close(release)
	if berth.ErrorCode(err) != berth.ESandboxNotFound || !strings.Contains(err.Error(), "deleted during the exec") {
		t.Fatalf("an exec failed by a delete: %v, want sandbox_not_found \"deleted during the exec\"", err)
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
}
