package server

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for seedRunning
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkMetricsScrape is one scrape of a replica's fleet series (fleetCollector and
// ledgerCollector: heartbeat ages, agents by status, the resident ÷ committed ratio, the
// ledger per agent) over PostgreSQL holding BERTH_BENCH_SCRAPE_AGENTS agents (default 2,000)
// with BERTH_BENCH_SCRAPE_HELD held sandboxes each (default 50; heldFleet). It reports the
// time of one scrape; the collectors give up after 2 s, and a scrape that did fails.
//
//	BERTH_BENCH_SCRAPE_AGENTS=10000 go test ./server -run '^$' -bench BenchmarkMetricsScrape -benchtime 10x
func BenchmarkMetricsScrape(b *testing.B) {
	st, _ := heldFleet(b, "BERTH_BENCH_SCRAPE")
	agents := envInt("BERTH_BENCH_SCRAPE_AGENTS", 2000)
	reg := prometheus.NewRegistry()
	newMetrics(reg, st, 30*time.Second, 5*time.Minute, time.Now)
	b.ResetTimer()
	for b.Loop() {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		ages := 0
		for _, mf := range mfs {
			if mf.GetName() == "berth_agent_heartbeat_age_seconds" {
				ages = len(mf.GetMetric())
			}
		}
		if ages != agents {
			b.Fatalf("a scrape exported %d heartbeat ages, want %d: a collector gave up", ages, agents)
		}
	}
}

// BenchmarkRetryAfterEstimate is one fresh Retry-After estimate of a refusal (API-3; the
// estimate is kept a second, so a replica makes at most one a second) over the same fleet as
// BenchmarkMetricsScrape (BERTH_BENCH_ESTIMATE_AGENTS, default 2,000, each holding
// BERTH_BENCH_ESTIMATE_HELD, default 50; one guest in ten agents not yet measured), each held
// sandbox a running row of its own (at 10,000 × 50, half a million), as a full fleet has.
//
//	BERTH_BENCH_ESTIMATE_AGENTS=10000 go test ./server -run '^$' -bench BenchmarkRetryAfterEstimate -benchtime 10x
func BenchmarkRetryAfterEstimate(b *testing.B) {
	st, url := heldFleet(b, "BERTH_BENCH_ESTIMATE")
	seedRunning(b, url)
	cfg := DefaultConfig()
	cfg.Clock = time.Now
	s := newScheduler(st, cfg, nil, newMetrics(prometheus.NewRegistry(), st, cfg.StaleAfter, cfg.DeadAfter, time.Now))
	if err := s.refresh(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		s.raMu.Lock()
		s.raAt = time.Time{} // a fresh estimate each time
		s.raMu.Unlock()
		s.retryAfter(context.Background(), berth.ENoCapacity, 512)
	}
}

// heldFleet seeds a throwaway PostgreSQL with <prefix>_AGENTS agents (default 2,000) holding
// <prefix>_HELD sandboxes each (default 50, measured but for one guest of every tenth agent)
// and returns its store and its database's URL.
func heldFleet(b *testing.B, prefix string) (*postgres.Store, string) {
	agents := envInt(prefix+"_AGENTS", 2000)
	held := envInt(prefix+"_HELD", 50)
	ctx := context.Background()
	url := pgtest.Start(b).NewDatabase(b)
	st, err := postgres.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	now := time.Now()
	for i := range agents {
		hb := berth.Heartbeat{AgentID: fmt.Sprintf("agent-%05d", i), Address: "http://127.0.0.1:1", Status: berth.AgentActive,
			MemoryAdmission: berth.AdmissionWorkingSet, MemoryMiBTotal: 65536, MemoryMiBAdmittable: 32768, CPUTotal: 8,
			IntakeOpen: true, BootID: "b", Seq: 1}
		for j := range held {
			hb.Sandboxes = append(hb.Sandboxes, berth.HeldSandbox{ID: fmt.Sprintf("sb-%05d-%03d", i, j), ResidentMiB: 100,
				Measured: j > 0 || i%10 != 0})
		}
		if _, err := st.RecordHeartbeat(ctx, hb, "", now); err != nil {
			b.Fatal(err)
		}
	}
	return st, url
}

// seedRunning gives every sandbox the agents of heldFleet hold a running row of its own (512
// MiB, stateless, expiring within the next 30 minutes), in one statement.
func seedRunning(b *testing.B, url string) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	now := time.Now().UnixMilli()
	_, err = db.ExecContext(context.Background(), `INSERT INTO sandboxes (id, template, tenant, agent_id, state, memory_mb, vcpus, created_at, expires_at)
		SELECT h.sandbox_id, 'python', 't', h.agent_id, 'running', 512, 1, $1::bigint, $1::bigint + 60000 + (hashtext(h.sandbox_id)::bigint & 1048575)
		FROM agent_held h`, now)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{`VACUUM ANALYZE sandboxes`, `VACUUM ANALYZE agent_held`} {
		if _, err := db.ExecContext(context.Background(), q); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkListAgents is the store side of GET /v1/agents over the fleet of heldFleet
// (BERTH_BENCH_LIST_AGENTS agents, default 2,000, holding BERTH_BENCH_LIST_HELD each, default
// 50): held=list reads every held list, held=count (the dashboard's and `berth agents list`'s
// read) the agent table and a count per agent. It reports the time of the store read and
// the size of the JSON body it becomes (body-MB).
//
//	BERTH_BENCH_LIST_AGENTS=10000 go test ./server -run '^$' -bench BenchmarkListAgents -benchtime 10x
func BenchmarkListAgents(b *testing.B) {
	st, _ := heldFleet(b, "BERTH_BENCH_LIST")
	s := &Server{store: st, cfg: DefaultConfig()}
	for _, held := range []string{"list", "count"} {
		b.Run("held="+held, func(b *testing.B) {
			var as []berth.Agent
			for b.Loop() {
				var err error
				if as, err = s.agentsHeld(context.Background(), held); err != nil {
					b.Fatal(err)
				}
			}
			body, err := json.Marshal(as)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(body))/1e6, "body-MB")
		})
	}
}
