package main

import (
	"context"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// scrape reads /metrics and returns the families by name.
func scrape(t *testing.T, st *devStack) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(st.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of the series of family name whose labels include want, and
// whether it exists. Counters, gauges and histograms (their sample count) are read.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.Metric {
		match := true
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// TestMET_MetricsMatchTheRun: after a scripted run, /metrics shows every MET series with the
// values the run implies (MET-1…5, LED-2, LED-3).
func TestMET_MetricsMatchTheRun(t *testing.T) {
	st := bootDev(t, func(c *devConfig) {
		c.Admission, c.AgentMemoryMiB, c.HeadroomMiB = berth.AdmissionCommitted, 1024, 0
	})
	for _, ttl := range []int{3, 3600} { // 2 created
		if code, _, _, e := rawCreate(t, st, `{"template":"python","ttl_seconds":`+strconv.Itoa(ttl)+`}`); code != http.StatusCreated {
			t.Fatalf("fill: %d %+v", code, e)
		}
	}
	refused := 0
	for range 3 { // 3 refused, each a 503 no_capacity
		if code, _, _, _ := rawCreate(t, st, `{"template":"python"}`); code == http.StatusServiceUnavailable {
			refused++
		}
	}
	// One SDK create refused first, then placed when the 3 s TTL frees room (MET-4).
	c := adminClient(st, client.WithDeadline(60*time.Second))
	if _, err := c.CreateSandbox(context.Background(), berth.CreateRequest{Template: "python"}); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, st)
	checks := []struct {
		name   string
		labels map[string]string
		want   func(float64) bool
		what   string
	}{
		{"berth_scheduler_refusals_total", map[string]string{"code": "no_capacity"}, func(v float64) bool { return v >= float64(refused+1) }, "≥ the 503s served (3 scripted + the SDK's)"},
		{"berth_api_create_seconds", map[string]string{"outcome": "created"}, func(v float64) bool { return v == 3 }, "3 creates"},
		{"berth_api_create_seconds", map[string]string{"outcome": "no_capacity"}, func(v float64) bool { return v >= float64(refused+1) }, "every refusal"},
		{"berth_api_time_to_success_seconds", map[string]string{"kind": "sandbox"}, func(v float64) bool { return v == 1 }, "one create succeeded after a refusal"},
		{"berth_scheduler_pick_seconds", nil, func(v float64) bool { return v >= 6 }, "a pick per attempt"},
		{"berth_ledger_expirations_total", nil, func(v float64) bool { return v == 0 }, "no leaked reservation"},
		{"berth_ledger_outstanding_reserved_mib", map[string]string{"agent": "dev-agent-1"}, func(v float64) bool { return v >= 0 && v <= 1024 }, "a gauge per agent"},
		{"berth_fleet_resident_committed_ratio", nil, func(v float64) bool { return v >= 0 && v < 1 }, "idle sandboxes use little of their commitment"},
		{"berth_agent_heartbeat_age_seconds", map[string]string{"agent": "dev-agent-1"}, func(v float64) bool { return v >= 0 && v < 30 }, "a fresh heartbeat"},
		{"berth_agents", map[string]string{"status": "active"}, func(v float64) bool { return v == 1 }, "one active agent"},
		{"berth_agents", map[string]string{"status": "stale"}, func(v float64) bool { return v == 0 }, "no stale agent"},
		{"berth_agent_ended_sandboxes_total", map[string]string{"state": "stopped"}, func(v float64) bool { return v >= 1 }, "the TTL stop"},
		{"berth_agent_ended_sandboxes_total", map[string]string{"state": "evicted"}, func(v float64) bool { return v == 0 }, "no eviction"},
		{"berth_agent_oom_kills", map[string]string{"agent": "dev-agent-1"}, func(v float64) bool { return v == 0 }, "no OOM kill"},
		{"berth_agent_measurement_errors", map[string]string{"agent": "dev-agent-1"}, func(v float64) bool { return v == 0 }, "no clamped reading"},
	}
	for _, ck := range checks {
		v, ok := value(fams, ck.name, ck.labels)
		if !ok || !ck.want(v) {
			t.Errorf("%s%v = %v (present %v), want %s", ck.name, ck.labels, v, ok, ck.what)
		}
	}
}

// TestDeployFilesNameRealMetrics: every berth_* series the shipped Grafana dashboard and
// Prometheus alert rules query is one the server exports, so they cannot silently rot.
func TestDeployFilesNameRealMetrics(t *testing.T) {
	st := bootDev(t, nil)
	fams := scrape(t, st)
	re := regexp.MustCompile(`berth_[a-z_]+`)
	for _, file := range []string{"../../deploy/grafana-dashboard.json", "../../deploy/prometheus-alerts.yml"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		names := re.FindAllString(string(b), -1)
		if len(names) == 0 {
			t.Fatalf("%s queries no berth metric", file)
		}
		for _, n := range names {
			base := n
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				base = strings.TrimSuffix(base, suffix)
			}
			if _, ok := fams[base]; !ok {
				t.Errorf("%s queries %s, which the server does not export", file, n)
			}
		}
	}
}
