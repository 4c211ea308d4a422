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

// scrape reads the server's /metrics and returns the families by name.
func scrape(t *testing.T, st *devStack) map[string]*dto.MetricFamily {
	t.Helper()
	return scrapeURL(t, st.URL+"/metrics")
}

// scrapeAgents reads every agent's /metrics (no node token: it is public) and returns the
// families by name, the series of all agents together.
func scrapeAgents(t *testing.T, st *devStack) map[string]*dto.MetricFamily {
	t.Helper()
	agents, err := st.Store.Agents(context.Background())
	if err != nil || len(agents) == 0 {
		t.Fatalf("agents: %v %v", agents, err)
	}
	all := map[string]*dto.MetricFamily{}
	for _, a := range agents {
		for name, f := range scrapeURL(t, a.Address+"/metrics") {
			if have, ok := all[name]; ok {
				have.Metric = append(have.Metric, f.Metric...)
			} else {
				all[name] = f
			}
		}
	}
	return all
}

// scrapeURL reads one Prometheus text exposition.
func scrapeURL(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
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
		{"berth_ledger_outstanding_reserved_bytes", map[string]string{"agent": "dev-agent-1"}, func(v float64) bool { return v >= 0 && v <= 1024<<20 }, "a gauge per agent, in bytes"},
		{"berth_fleet_resident_committed_ratio", nil, func(v float64) bool { return v >= 0 && v < 1 }, "idle sandboxes use little of their commitment"},
		{"berth_agent_heartbeat_age_seconds", map[string]string{"agent": "dev-agent-1"}, func(v float64) bool { return v >= 0 && v < 30 }, "a fresh heartbeat"},
		{"berth_agents", map[string]string{"status": "active"}, func(v float64) bool { return v == 1 }, "one active agent"},
		{"berth_agents", map[string]string{"status": "stale"}, func(v float64) bool { return v == 0 }, "no stale agent"},
		{"berth_agent_ended_sandboxes_total", map[string]string{"state": "stopped"}, func(v float64) bool { return v >= 1 }, "the TTL stop"},
		{"berth_agent_ended_sandboxes_total", map[string]string{"state": "evicted"}, func(v float64) bool { return v == 0 }, "no eviction"},
		{"berth_agent_oom_kills_total", map[string]string{"agent": "dev-agent-1"}, func(v float64) bool { return v == 0 }, "no OOM kill (the agent's own counter)"},
		{"berth_agent_measurement_errors_total", map[string]string{"agent": "dev-agent-1"}, func(v float64) bool { return v == 0 }, "no clamped reading (the agent's own counter)"},
	}
	for name, f := range scrapeAgents(t, st) {
		fams[name] = f
	}
	for _, ck := range checks {
		v, ok := value(fams, ck.name, ck.labels)
		if !ok || !ck.want(v) {
			t.Errorf("%s%v = %v (present %v), want %s", ck.name, ck.labels, v, ok, ck.what)
		}
	}
}

// TestDeployFilesNameRealMetrics: every berth_* series the shipped Grafana dashboard and
// Prometheus alert rules query is one the server or an agent exports, so they cannot silently
// rot; and every exported name follows the Prometheus conventions (issue 15): counters end
// in _total, nothing is in MiB, and the Go and process collectors are there.
func TestDeployFilesNameRealMetrics(t *testing.T) {
	st := bootDev(t, nil)
	// One request first, so the HTTP series exist.
	if resp, err := http.Get(st.URL + "/healthz"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	fams := scrape(t, st)
	for _, side := range []map[string]*dto.MetricFamily{fams, scrapeAgents(t, st)} {
		for _, name := range []string{"go_goroutines", "process_open_fds"} {
			if _, ok := side[name]; !ok {
				t.Errorf("a /metrics lacks %s", name)
			}
		}
		for name, f := range side {
			if f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s does not end in _total", name)
			}
			if strings.HasPrefix(name, "berth_") && (strings.Contains(name, "_mib") || strings.Contains(name, "_mb")) {
				t.Errorf("%s is not in base units (bytes)", name)
			}
		}
	}
	if v, ok := value(fams, "berth_http_requests_total", map[string]string{"route": "GET /healthz", "code": "200"}); !ok || v < 1 {
		t.Errorf(`berth_http_requests_total{route="GET /healthz",code="200"} = %v (present %v), want ≥ 1`, v, ok)
	}
	for name, f := range scrapeAgents(t, st) {
		if _, ok := fams[name]; !ok {
			fams[name] = f
		}
	}
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
				t.Errorf("%s queries %s, which neither the server nor an agent exports", file, n)
			}
		}
	}
}
