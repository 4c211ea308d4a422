package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// replicaSet is n server replicas over one PostgreSQL database, each with its own store
// connection pool, as separate processes would have.
type replicaSet struct {
	key      string
	stores   []*postgres.Store
	servers  []*Server
	https    []*httptest.Server
	cancel   context.CancelFunc
	agentURL []string
}

func newReplicaSet(t *testing.T, n int, mutate func(*Config)) *replicaSet {
	t.Helper()
	db := pgtest.Start(t).NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	rs := &replicaSet{key: NewKeySecret(), cancel: cancel}
	for i := range n {
		st, err := postgres.Open(ctx, db)
		if err != nil {
			t.Fatalf("open store %d: %v", i, err)
		}
		if i == 0 {
			must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
			must(t, tenantErr(st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: time.Now()})))
			must(t, st.PutAPIKey(ctx, berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleAdmin, Hash: HashKey(rs.key), CreatedAt: time.Now()}))
		}
		cfg := DefaultConfig()
		cfg.ReplicaID = fmt.Sprintf("replica-%d", i)
		cfg.NodeToken = "node-token"
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if mutate != nil {
			mutate(&cfg)
		}
		s := New(cfg, st)
		go func() { _ = s.Run(ctx) }()
		rs.stores = append(rs.stores, st)
		rs.servers = append(rs.servers, s)
		rs.https = append(rs.https, httptest.NewServer(s.Handler()))
	}
	t.Cleanup(func() {
		cancel()
		for i := range rs.https {
			rs.https[i].Close()
			rs.stores[i].Close()
		}
	})
	return rs
}

func (rs *replicaSet) post(t *testing.T, replica int, path, body string, header map[string]string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, rs.https[replica].URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+rs.key)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// heartbeatVia posts an agent heartbeat through a replica, as a real agent would.
func (rs *replicaSet) heartbeatVia(t *testing.T, replica int, id, addr string, admittable int64) {
	t.Helper()
	hb := berth.Heartbeat{AgentID: id, Address: addr, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 1 << 20, MemoryMiBAdmittable: admittable, CPUTotal: 2}
	_, err := rs.stores[replica].ApplyHeartbeat(context.Background(), hb, time.Now())
	must(t, err)
}

// TestLED1_BurstAcrossReplicas: 4 replicas, one host with room for exactly N reserves,
// 40 concurrent creates round-robin over the replicas, 20 rounds: every round admits
// exactly N, and the ledger is empty afterwards (LED-1, LED-3).
func TestLED1_BurstAcrossReplicas(t *testing.T) {
	const n, rounds, creates = 4, 20, 40
	rs := newReplicaSet(t, 4, nil)
	a := newFakeAgent(t, "")
	ctx := context.Background()
	for round := range rounds {
		rs.heartbeatVia(t, 0, "a1", a.srv.URL, n*512)
		var mu sync.Mutex
		var ids []string
		codes := map[int]int{}
		var wg sync.WaitGroup
		for i := range creates {
			wg.Go(func() {
				code, b := rs.post(t, i%4, "/v1/sandboxes", `{"template":"python"}`, nil)
				mu.Lock()
				defer mu.Unlock()
				codes[code]++
				if code == http.StatusCreated {
					ids = append(ids, string(b))
				}
			})
		}
		wg.Wait()
		if codes[http.StatusCreated] != n || codes[http.StatusServiceUnavailable] != creates-n {
			t.Fatalf("round %d: outcomes %v, want exactly %d created and %d refused", round, codes, n, creates-n)
		}
		// End the round: the host reports the sandboxes gone and the ledger must be empty.
		sbs, err := rs.stores[0].Sandboxes(ctx, berth.SandboxFilter{State: berth.SandboxRunning})
		must(t, err)
		for _, sb := range sbs {
			_, err := rs.stores[0].TransitionSandbox(ctx, sb.ID, nil, berth.SandboxStopped, "round over", "test", time.Now())
			must(t, err)
		}
		left, err := rs.stores[0].Reservations(ctx)
		must(t, err)
		if len(left) != 0 {
			t.Fatalf("round %d: %d reservations left after the sandboxes ended", round, len(left))
		}
	}
}

// TestPLC5_DrainReachesOtherReplica: a drain through replica A reaches replica B's placement
// snapshot by push alone (B's cache never expires in this test). It measures the delay of
// 100 drains and logs the percentiles for docs/PERFORMANCE.md; it asserts only that every
// drain arrives.
func TestPLC5_DrainReachesOtherReplica(t *testing.T) {
	rs := newReplicaSet(t, 2, func(c *Config) { c.CacheTTL = time.Hour })
	rs.heartbeatVia(t, 0, "a1", "http://127.0.0.1:1", 4096) // no agent listens: only the store mark can drain
	b := rs.servers[1]
	must(t, b.sched.refresh(context.Background()))
	draining := func() bool {
		b.sched.mu.RLock()
		defer b.sched.mu.RUnlock()
		i, ok := b.sched.index["a1"]
		return ok && b.sched.hosts[i].Draining
	}
	wait := func(want bool, start time.Time) time.Duration {
		for draining() != want {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("replica B never saw draining=%v", want)
			}
			time.Sleep(100 * time.Microsecond) // real: replica B learns of the drain by PostgreSQL NOTIFY
		}
		return time.Since(start)
	}
	var delays []time.Duration
	for range 100 {
		// The delay runs from the moment the drain is sent to replica A.
		start := time.Now()
		code, body := rs.post(t, 0, "/v1/agents/a1/drain", `{"reason":"test"}`, nil)
		if code != http.StatusAccepted {
			t.Fatalf("drain: %d %s", code, body)
		}
		delays = append(delays, wait(true, start))
		if code, body := rs.post(t, 0, "/v1/agents/a1/undrain", ``, nil); code != http.StatusOK {
			t.Fatalf("undrain: %d %s", code, body)
		}
		wait(false, time.Now())
	}
	slices.Sort(delays)
	msg := fmt.Sprintf("drain sent to A → B's snapshot draining, over %d drains: p50 %v, p99 %v, max %v",
		len(delays), delays[len(delays)/2], delays[len(delays)*99/100], delays[len(delays)-1])
	t.Log(msg)
	if path := os.Getenv("BERTH_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, msg)
			f.Close()
		}
	}
}

// TestPostgresOutage: while PostgreSQL is down every call answers 503 (never 500), and the
// replica recovers by itself when it is back.
func TestPostgresOutage(t *testing.T) {
	pg := pgtest.StartPrivate(t)
	db := pg.NewDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key := NewKeySecret()
	must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
	must(t, tenantErr(st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: time.Now()})))
	must(t, st.PutAPIKey(ctx, berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleAdmin, Hash: HashKey(key), CreatedAt: time.Now()}))
	a := newFakeAgent(t, "")
	_, err = st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 8192, MemoryMiBAdmittable: 8192, CPUTotal: 2}, time.Now())
	must(t, err)
	cfg := DefaultConfig()
	cfg.NodeToken = "node-token"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(New(cfg, st).Handler())
	t.Cleanup(srv.Close)
	call := func(method, path, body string) int {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := call("POST", "/v1/sandboxes", `{"template":"python"}`); code != 201 {
		t.Fatalf("create before the outage: %d", code)
	}
	pg.Stop(t)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes", `{"template":"python"}`},
		{"GET", "/v1/sandboxes", ``},
		{"GET", "/v1/sandboxes/sb-x", ``},
		{"GET", "/v1/agents", ``},
		{"GET", "/v1/templates", ``},
		{"GET", "/v1/events", ``},
		{"GET", "/readyz", ``},
	} {
		if code := call(c.method, c.path, c.body); code != http.StatusServiceUnavailable {
			t.Errorf("%s %s with PostgreSQL down = %d, want 503", c.method, c.path, code)
		}
	}
	pg.Start(t)
	deadline := time.Now().Add(30 * time.Second)
	for call("POST", "/v1/sandboxes", `{"template":"python"}`) != 201 {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not recover after PostgreSQL came back")
		}
		time.Sleep(100 * time.Millisecond) // real: PostgreSQL restarting
	}
}
