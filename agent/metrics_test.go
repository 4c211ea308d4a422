package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// oomRuntime is fakeRuntime whose readings also carry OOM kills per guest (C09).
type oomRuntime struct {
	*fakeRuntime
	oom map[string]int64
}

func (r *oomRuntime) Measure(id string) (Measurement, error) {
	m, err := r.fakeRuntime.Measure(id)
	r.mu.Lock()
	m.OOMKills = r.oom[id]
	r.mu.Unlock()
	return m, err
}

// agentCounter scrapes GET /metrics over HTTP without a node token and returns the value of
// counter name for agent a1.
func agentCounter(t *testing.T, url, name string) float64 {
	t.Helper()
	code, body := call(t, http.MethodGet, url+"/metrics", nil, http.Header{berth.HeaderNodeToken: {"-"}})
	if code != http.StatusOK {
		t.Fatalf("GET /metrics without the node token: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"go_goroutines", "process_open_fds"} {
		if _, ok := fams[want]; !ok {
			t.Errorf("agent /metrics lacks %s", want)
		}
	}
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetCounter() == nil {
		t.Fatalf("agent /metrics has no counter %s: %v", name, f)
	}
	m := f.GetMetric()[0]
	if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "agent" || l[0].GetValue() != "a1" {
		t.Errorf("%s labels %v, want agent=a1", name, l)
	}
	return m.GetCounter().GetValue()
}

// TestMetrics_AgentCountersNeverDecrease: the OOM-kill and clamped-reading counters count
// since the agent booted and do not drop when a sandbox ends, deleted or exited (issue 15,
// C07, C09); the agent's /healthz and /metrics answer without the node token.
func TestMetrics_AgentCountersNeverDecrease(t *testing.T) {
	rt := &oomRuntime{fakeRuntime: &fakeRuntime{resident: map[string]int64{}, exited: map[string]bool{}, seen: true}, oom: map[string]int64{}}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt.fakeRuntime)
	a.rt = rt
	a.cfg.NodeToken = testToken
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)

	if code, body := call(t, http.MethodGet, srv.URL+"/healthz", nil, http.Header{berth.HeaderNodeToken: {"-"}}); code != http.StatusOK || string(body) != "ok\n" {
		t.Fatalf("GET /healthz without the node token: %d %q, want 200 \"ok\\n\"", code, body)
	}
	if code, _ := call(t, http.MethodGet, srv.URL+"/internal/heartbeat", nil, http.Header{berth.HeaderNodeToken: {"-"}}); code != http.StatusUnauthorized {
		t.Fatalf("the internal API without the node token: %d, want 401", code)
	}
	for _, id := range []string{"s1", "s2"} {
		if err := create(a, id, 512); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	rt.mu.Lock()
	rt.oom["s1"], rt.oom["s2"] = 2, 1
	rt.resident["s1"] = -5 // an impossible reading: clamped to 0 and counted (C07)
	rt.mu.Unlock()
	a.measureOnce(ctx, time.Now())
	step := func(what string, oom, errs float64) {
		t.Helper()
		if got := agentCounter(t, srv.URL, "berth_agent_oom_kills_total"); got != oom {
			t.Errorf("%s: berth_agent_oom_kills_total = %v, want %v", what, got, oom)
		}
		if got := agentCounter(t, srv.URL, "berth_agent_measurement_errors_total"); got != errs {
			t.Errorf("%s: berth_agent_measurement_errors_total = %v, want %v", what, got, errs)
		}
	}
	step("two guests killed 3 processes", 3, 1)

	if err := a.Delete(ctx, "s2"); err != nil { // s2 ends: its kill stays counted
		t.Fatal(err)
	}
	a.measureOnce(ctx, time.Now())
	step("after s2 was deleted", 3, 2)

	rt.mu.Lock()
	rt.oom["s1"], rt.exited["s1"] = 5, true // s1 dies of a last OOM kill between two readings
	rt.resident["s1"] = 100
	rt.mu.Unlock()
	a.measureOnce(ctx, time.Now())
	if hb := a.Heartbeat(time.Now()); len(hb.Sandboxes) != 0 {
		t.Fatalf("held after both ended: %+v", hb.Sandboxes)
	}
	step("after s1 exited", 6, 2)
}
