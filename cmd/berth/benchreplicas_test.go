package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/noop"
	"github.com/jackc/pgx/v5"
)

// TestBenchReplicas measures `berth bench create` against 2 replicas on PostgreSQL with 4
// no-op agents, and pgbench's single-row insert TPS on the same cluster in the same run, for
// docs/PERFORMANCE.md. It reports figures and asserts nothing about speed; it runs only with
// BERTH_BENCH=1:
//
//	BERTH_BENCH=1 go test ./cmd/berth -run TestBenchReplicas -v -count=1
func TestBenchReplicas(t *testing.T) {
	if os.Getenv("BERTH_BENCH") != "1" {
		t.Skip("a measurement, not a test: set BERTH_BENCH=1")
	}
	f := newPGFleet(t)
	for range 2 {
		f.replica(t, nil)
	}
	for i := range 4 {
		cfg := agent.DefaultConfig()
		cfg.ID, cfg.MemoryMiB, cfg.HeadroomMiB = fmt.Sprintf("noop-%d", i), 1<<30, 0
		cfg.HeartbeatInterval, cfg.MaxStarts = time.Second, 1024
		cfg.ServerURL, cfg.NodeToken, cfg.Logger = f.urls[i%2], f.nodeToken, f.log
		a, err := agent.New(cfg, &noop.Runtime{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	waitFor(t, 30*time.Second, "every agent heartbeats once", func() (bool, string) {
		as, err := f.seed.Agents(context.Background())
		return err == nil && len(as) == 4, fmt.Sprint(len(as), " agents, ", err)
	})
	clients, dur := 32, 10*time.Second
	res, err := runBenchCreate(context.Background(), benchConfig{URLs: f.urls, Key: f.adminKey, Clients: clients,
		Duration: dur, MaxCreates: 1_000_000, Template: "shell", Cleanup: true})
	if err != nil {
		t.Fatal(err)
	}
	creates := float64(res.Created) / res.Elapsed.Seconds()
	tps := pgbenchInsert(t, f.db, clients, dur)
	report := fmt.Sprintf("bench create: 2 replicas, 4 no-op agents, %d clients, %s: %d created, %.0f creates/s, p50 %s p99 %s, refusals %v, outstanding at stop %d, after cleanup %d; pgbench single-row insert, %d clients, same cluster: %.0f TPS; creates/s ÷ insert TPS = %.3f",
		clients, res.Elapsed.Round(time.Millisecond), res.Created, creates, pct(res.Latency, .5).Round(10*time.Microsecond),
		pct(res.Latency, .99).Round(10*time.Microsecond), res.ByCode, res.Outstanding, res.AfterCleanup, clients, tps, creates/tps)
	t.Log(report)
	if path := os.Getenv("BERTH_REPORT"); path != "" {
		_ = os.WriteFile(path, []byte(report+"\n"), 0o644)
	}
}

// pgbenchInsert runs pgbench with a one-row INSERT script against db and returns its TPS.
func pgbenchInsert(t *testing.T, db string, clients int, dur time.Duration) float64 {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	bin := "pgbench"
	if len(bins) > 0 {
		bin = bins[len(bins)-1]
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE bench_insert (id bigserial PRIMARY KEY, v bigint, at timestamptz DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	script := filepath.Join(t.TempDir(), "insert.sql")
	if err := os.WriteFile(script, []byte("INSERT INTO bench_insert (v) VALUES (1);\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-n", "-f", script, "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(int(dur.Seconds())), db).CombinedOutput()
	if err != nil {
		t.Fatalf("pgbench: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no tps in pgbench output:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	return tps
}
