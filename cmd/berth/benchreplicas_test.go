package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
)

// TestBenchReplicas is `berth bench fleet` on a throwaway PostgreSQL: 2 replicas, 4 no-op
// agents, 32 clients for 10 s, then pgbench's single-row insert on the same database, for
// docs/PERFORMANCE.md. It reports figures and asserts nothing about speed; it runs only with
// BERTH_BENCH=1 (BERTH_BENCH_CLIENTS sets the clients, BERTH_BENCH_SIM_AGENTS simulated agents
// heartbeating every 10 s beside the creates, BERTH_BENCH_DURATION the creates' duration):
//
//	BERTH_BENCH=1 go test ./cmd/berth -run TestBenchReplicas -v -count=1
func TestBenchReplicas(t *testing.T) {
	if os.Getenv("BERTH_BENCH") != "1" {
		t.Skip("a measurement, not a test: set BERTH_BENCH=1")
	}
	clients := 32
	if n, err := strconv.Atoi(os.Getenv("BERTH_BENCH_CLIENTS")); err == nil && n > 0 {
		clients = n // 1 client: the control-plane latency of a create without queueing (goal 4)
	}
	sim, _ := strconv.Atoi(os.Getenv("BERTH_BENCH_SIM_AGENTS")) // goal 2: heartbeating agents beside the creates
	dur := 10 * time.Second
	if d, err := time.ParseDuration(os.Getenv("BERTH_BENCH_DURATION")); err == nil && d > 0 {
		dur = d
	}
	rep, err := runBenchFleet(context.Background(), fleetConfig{Store: pgtest.Start(t).NewDatabase(t), Replicas: 2, Agents: 4,
		Heartbeat: time.Second, Clients: clients, Duration: dur, PGBench: sim == 0, SimAgents: sim, SimInterval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.print(&out)
	t.Log("\n" + out.String())
	if path := os.Getenv("BERTH_REPORT"); path != "" {
		_ = os.WriteFile(path, out.Bytes(), 0o644)
	}
}

// TestBenchFleet runs `berth bench fleet` as a user would, briefly, on SQLite: it starts,
// creates, reports every figure and stops what it started; a store off this machine is
// refused before anything starts.
func TestBenchFleet(t *testing.T) {
	r := runCLI(t, "", "bench", "fleet", "--agents", "2", "--clients", "4", "--duration", "1s")
	if r.code != 0 {
		t.Fatalf("bench fleet: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{"creates/s", "control-plane latency p50 / p99", "store round trips per create", "refused: none", "CPU: this process", "CPU: PostgreSQL", "unknown (not PostgreSQL)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the report lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "created  0 of") {
		t.Errorf("nothing was created:\n%s", r.stdout)
	}
	for _, args := range [][]string{
		{"--store", "postgres://bench@db.example.com/berth"},
		{"--replicas", "2"},
		{"--agents", "0"},
	} {
		r := runCLI(t, "", append([]string{"bench", "fleet", "--duration", "1s"}, args...)...)
		if r.code != exitInvalid {
			t.Errorf("bench fleet %v: exit %d, want %d (%s)", args, r.code, exitInvalid, r.stderr)
		}
	}
	_ = berth.EInvalidRequest
}

// TestBenchFleetSimAgents runs `berth bench fleet --sim-agents` briefly on SQLite: the
// simulated agents' sandboxes are seeded as running rows, and every simulated heartbeat is
// acknowledged without a resync or a failure.
func TestBenchFleetSimAgents(t *testing.T) {
	r := runCLI(t, "", "bench", "fleet", "--agents", "1", "--clients", "2", "--duration", "3s",
		"--sim-agents", "20", "--sim-interval", "1s")
	if r.code != 0 {
		t.Fatalf("bench fleet: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{"simulated agents                 20,", "(resyncs 0, failures 0)", "agents > 30 s between two acks   0"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the report lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestCreateReplayWritesACreate pins the SQL `bench fleet` replays with pgbench as the store's
// ceiling (benchfleet_create.pgbench): on a migrated database with a no-op agent, each run of
// the script leaves what a create leaves — a running sandbox, its two events, its reservation
// held then netted (two events, no row left) and the answer kept for its key — and pgbench
// reports no failed run. A script out of step with the schema fails here, not in a
// measurement.
func TestCreateReplayWritesACreate(t *testing.T) {
	url := pgtest.Start(t).NewDatabase(t)
	ctx := t.Context()
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	hb := berth.Heartbeat{AgentID: "bench-noop-1", Status: berth.AgentActive, BootID: "b1", MemoryMiBTotal: 1 << 30,
		MemoryMiBAdmittable: 1 << 30, IntakeOpen: true, HeartbeatAt: now}
	if _, err := st.ApplyHeartbeat(ctx, hb, now); err != nil {
		t.Fatal(err)
	}
	rate, err := pgbenchCreatesPerSecond(ctx, url, 1, 2, time.Second, t.TempDir())
	if err != nil || rate <= 0 {
		t.Fatalf("pgbench replay: %v creates/s, %v", rate, err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	count := func(q string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	n := count(`SELECT COUNT(*) FROM sandboxes WHERE tenant = 'pgbench'`)
	for what, got := range map[string]int{
		"running sandboxes":         count(`SELECT COUNT(*) FROM sandboxes WHERE tenant = 'pgbench' AND state = 'running' AND agent_id = 'bench-noop-1'`),
		"sandbox events / 2":        count(`SELECT COUNT(*) FROM events WHERE entity LIKE 'sandbox/pgbench-%'`) / 2,
		"reservation events netted": count(`SELECT COUNT(*) FROM events WHERE entity LIKE 'reservation/pgbench-r-%' AND to_state = 'netted'`),
		"reservation events held":   count(`SELECT COUNT(*) FROM events WHERE entity LIKE 'reservation/pgbench-r-%' AND to_state = 'held'`),
		"answers kept":              count(`SELECT COUNT(*) FROM idempotent_calls WHERE scope = 'tenant/pgbench' AND status = 201`),
	} {
		if got != n {
			t.Errorf("%s: %d, want one per create (%d)", what, got, n)
		}
	}
	if n == 0 {
		t.Error("the replay created nothing")
	}
	if left := count(`SELECT COUNT(*) FROM reservations WHERE id LIKE 'pgbench-r-%'`); left != 0 {
		t.Errorf("%d reservations left, want 0 (each is netted)", left)
	}
}
