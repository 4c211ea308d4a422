package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestAgentRoutesRefuseBadText (an attack found it, on PostgreSQL): an agent id in the path
// with a NUL byte or invalid UTF-8, and heartbeat text fields with a NUL character, reached
// the store and came back 500 internal; they are bad input, 400 invalid_request. So are a
// sandbox id too long for the store's indexes and a heartbeat_at outside years 1–9999 (a
// later attack: the first was a 500 on PostgreSQL, the second left GET /v1/agents 200 and
// empty).
func TestAgentRoutesRefuseBadText(t *testing.T) {
	rs := newReplicaSet(t, 1, nil)
	secret := NewKeySecret()
	must(t, rs.stores[0].JoinAgent(context.Background(), berth.AgentCredential{AgentID: "ok1", Hash: HashKey(secret), CreatedAt: time.Now()}))
	send := func(method, path, bearer, body string) (int, string) {
		t.Helper()
		return call(t, rs.https[0].URL, method, path, bearer, strings.NewReader(body))
	}
	for _, id := range []string{"%00", "a%00b", "%ff", "%c3%28"} {
		for _, route := range []struct{ method, path string }{
			{http.MethodPost, "/v1/agents/" + id + "/revoke"},
			{http.MethodPost, "/v1/agents/" + id + "/drain"},
			{http.MethodPost, "/v1/agents/" + id + "/undrain"},
			{http.MethodGet, "/v1/agents/" + id + "/drain"},
		} {
			if code, body := send(route.method, route.path, rs.key, ""); code != http.StatusBadRequest || !strings.Contains(body, berth.EInvalidRequest) {
				t.Errorf("%s %s: %d %s, want 400 invalid_request", route.method, route.path, code, body)
			}
		}
	}
	const hb = `{"agent_id":"ok1","address":"http://127.0.0.1:1","status":"active","memory_admission":"committed","memory_mb_total":1024,"memory_mb_admittable":1024,"seq":1,"boot_id":"b1"`
	for _, body := range []string{
		hb + `,"ended":[{"id":"\u0000","state":"failed"}]}`,
		hb + `,"sandboxes":[{"id":"a\u0000"}]}`,
		hb + `,"region":"\u0000"}`,
		`{"agent_id":"ok1","address":"http://127.0.0.1:1","memory_admission":"committed","seq":3,"base_seq":2,"delta":true,"boot_id":"\u0000","removed":["\u0000"]}`,
		// A sandbox id longer than the store's indexes take (a 500 on PostgreSQL), whole or
		// in a delta, and a time JSON cannot write back (it emptied every GET /v1/agents).
		hb + `,"sandboxes":[{"id":"` + strings.Repeat("x", 6000) + `"}]}`,
		`{"agent_id":"ok1","address":"http://127.0.0.1:1","memory_admission":"committed","seq":3,"base_seq":2,"delta":true,"boot_id":"b1","sandboxes":[{"id":"` + strings.Repeat("x", 6000) + `"}]}`,
		hb + `,"ended":[{"id":"` + strings.Repeat("x", 129) + `","state":"failed"}]}`,
		hb + `,"heartbeat_at":"0000-01-01T00:00:00+01:00"}`,
		hb + `,"heartbeat_at":"9999-12-31T23:59:59-01:00"}`,
	} {
		if code, got := send(http.MethodPost, "/v1/agents/heartbeat", secret, body); code != http.StatusBadRequest || !strings.Contains(got, berth.EInvalidRequest) {
			t.Errorf("heartbeat %s: %d %s, want 400 invalid_request", body, code, got)
		}
	}
	if code, got := send(http.MethodPost, "/v1/agents/heartbeat", secret, hb+`}`); code != http.StatusOK {
		t.Errorf("a good heartbeat: %d %s, want 200", code, got)
	}
	if code, got := send(http.MethodGet, "/v1/agents", rs.key, ""); code != http.StatusOK || !strings.Contains(got, `"ok1"`) {
		t.Errorf("GET /v1/agents after the bad heartbeats: %d %q, want 200 listing ok1", code, got)
	}
}

// TestHeartbeatFiguresInRange (an attack found it): an agent's own credential could report
// figures no host has — cpu_total 1e308, a negative resident_mb or oom_kills, a pressure of
// 1,000 % — and get 200, so they reached placement's scores and the fleet's sums. Each is
// now 400 invalid_request and changes nothing; figures at the bounds are still taken.
func TestHeartbeatFiguresInRange(t *testing.T) {
	rs := newReplicaSet(t, 1, nil)
	secret := NewKeySecret()
	must(t, rs.stores[0].JoinAgent(context.Background(), berth.AgentCredential{AgentID: "ok1", Hash: HashKey(secret), CreatedAt: time.Now()}))
	send := func(body string) (int, string) {
		t.Helper()
		return call(t, rs.https[0].URL, http.MethodPost, "/v1/agents/heartbeat", secret, strings.NewReader(body))
	}
	const hb = `{"agent_id":"ok1","address":"http://127.0.0.1:1","status":"active","memory_admission":"committed","memory_mb_total":1024,"memory_mb_admittable":1024,"boot_id":"b1"`
	if code, got := send(hb + `,"seq":1,"cpu_total":4,"cpu_used":1.5}`); code != http.StatusOK {
		t.Fatalf("a good heartbeat: %d %s, want 200", code, got)
	}
	for _, figures := range []string{
		`"cpu_total":1e308`,
		`"cpu_total":-1`,
		`"cpu_used":-0.5`,
		`"cpu_used":65537`,
		`"memory_mb_used":-1`,
		`"memory_mb_committed":-1`,
		`"memory_mb_used":1099511627777`,
		`"memory_mb_committed":9223372036854775807`,
		`"memory_mb_total":9223372036854775807,"memory_mb_admittable":9223372036854775807`,
		`"memory_pressure":-1`,
		`"memory_pressure":1000`,
		`"starts_in_flight":-1`,
		`"measurement_errors":-1`,
		`"sandboxes":[{"id":"sb-1","resident_mb":-100,"measured":true}]`,
		`"sandboxes":[{"id":"sb-1","resident_mb":1099511627777,"measured":true}]`,
		`"sandboxes":[{"id":"sb-1","oom_kills":-1}]`,
		// A region no create could name (creates take at most 64 bytes; found by an attack).
		`"region":"` + strings.Repeat("r", 65) + `"`,
		// Text kept on the agent's row and in every listing (200 KB each were stored).
		`"version":"` + strings.Repeat("v", 1025) + `"`,
		`"boot_id":"` + strings.Repeat("b", 1025) + `"`,
	} {
		// The figures after the others: JSON's last duplicate key wins.
		if code, got := send(hb + `,"seq":2,` + figures + `}`); code != http.StatusBadRequest || !strings.Contains(got, berth.EInvalidRequest) {
			t.Errorf("heartbeat with %s: %d %s, want 400 invalid_request", figures, code, got)
		}
	}
	a, err := rs.stores[0].Agent(context.Background(), "ok1")
	must(t, err)
	if a.Seq != 1 || a.CPUTotal != 4 || a.CPUUsed != 1.5 {
		t.Fatalf("after the refused heartbeats the store holds seq %d, cpu %v/%v; want seq 1's 1.5/4", a.Seq, a.CPUUsed, a.CPUTotal)
	}
	// The bounds themselves are figures a host may report.
	edge := hb + `,"seq":3,"cpu_total":65536,"cpu_used":0,"memory_mb_committed":1099511627776,"memory_mb_used":0,"memory_pressure":100,` +
		`"sandboxes":[{"id":"sb-1","resident_mb":1099511627776,"measured":true}]}`
	if code, got := send(edge); code != http.StatusOK {
		t.Errorf("a heartbeat at the bounds: %d %s, want 200", code, got)
	}
}
