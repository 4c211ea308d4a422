package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/gvisor"
	"github.com/berth-dev/berth/client"
)

// TestBenchWarmPool measures create latency through the API with and without the warm pool
// (issue 16, goal 5): one `berth dev` stack, one agent with --warm-pool shell=1 (256 MiB),
// rounds of a cold create (shell at 320 MiB, a size the pool does not hold: a miss) and a
// hit (shell at 256 MiB), each deleted at once, interleaved so both see the same load, and
// each taken while the pool is full and idle (no refill running beside it). It asserts
// nothing about time; it checks only that every hit was a hit and every cold create a miss
// (the agent's counters). gVisor where runsc and root are there, else the process runtime
// (BERTH_BENCH_RUNTIME forces one); BERTH_BENCH_N rounds (default 30).
//
//	BERTH_BENCH=1 go test ./cmd/berth -run TestBenchWarmPool -v -count=1 -timeout 30m
func TestBenchWarmPool(t *testing.T) {
	if os.Getenv("BERTH_BENCH") != "1" {
		t.Skip("a measurement, not a test: set BERTH_BENCH=1")
	}
	rt, platform := os.Getenv("BERTH_BENCH_RUNTIME"), ""
	runsc, rerr := gvisor.Find("")
	if rt == "" {
		rt = runtimeProcess
		if rerr == nil && os.Geteuid() == 0 {
			rt = runtimeGVisor
		}
	}
	if rt == runtimeGVisor {
		if rerr != nil {
			t.Skipf("gvisor: %v", rerr)
		}
		platform = rtPlatform(runsc, os.Getenv("BERTH_BENCH_PLATFORM"))
		t.Logf("machine: %s", benchMachine(runsc, platform))
	}
	n := benchEnvInt(t, "BERTH_BENCH_N", 30)

	cfg := defaultDevConfig()
	cfg.Listen, cfg.Data, cfg.Agents, cfg.AgentMemoryMiB = "127.0.0.1:0", t.TempDir(), 1, 8192
	cfg.Runtime.Runtime, cfg.Runtime.Platform = rt, platform
	cfg.Runtime.Insecure = rt == runtimeProcess && os.Geteuid() != 0
	cfg.WarmPool = []agent.WarmPoolEntry{{Template: "shell", MemoryMiB: 256, Size: 1}}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := startDev(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start %s stack: %v", rt, err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("close stack: %v", err)
		}
	})
	c := adminClient(st, client.WithDeadline(5*time.Minute))
	metrics := agentByID(t, c, "dev-agent-1").Address + "/metrics"
	gauge := func(name string) int {
		resp, err := http.Get(metrics)
		if err != nil {
			t.Fatalf("metrics: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+`{agent="dev-agent-1",template="shell"} `); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return int(f)
			}
		}
		return -1
	}
	waitReady := func() {
		for deadline := time.Now().Add(2 * time.Minute); gauge("berth_agent_warm_pool_ready") != 1; {
			if time.Now().After(deadline) {
				t.Fatal("the pool did not refill within 2 minutes")
			}
			time.Sleep(10 * time.Millisecond) // real: the agent's refill starts a real sandbox
		}
	}
	create := func(mem int64) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell", MemoryMiB: mem})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("create shell %d MiB: %v", mem, err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatalf("delete %s: %v", sb.ID, err)
		}
		return took
	}

	var hit, cold []time.Duration
	for i := range n {
		waitReady()
		misses := gauge("berth_agent_warm_pool_misses_total")
		cold = append(cold, create(320))
		if got := gauge("berth_agent_warm_pool_misses_total"); got != misses+1 {
			t.Fatalf("round %d: the cold create was not a miss (misses %d → %d)", i, misses, got)
		}
		waitReady()
		hits := gauge("berth_agent_warm_pool_hits_total")
		hit = append(hit, create(256))
		if got := gauge("berth_agent_warm_pool_hits_total"); got != hits+1 {
			t.Fatalf("round %d: the pooled create was not a hit (hits %d → %d)", i, hits, got)
		}
	}
	hp50, cp50 := rtPct(hit, 0.5), rtPct(cold, 0.5)
	t.Logf("runtime %s %s, %d rounds, create through the API (SDK CreateSandbox), ms:", rt, platform, n)
	t.Logf("  warm hit   p50 %s  p90 %s  min %s  max %s", rtMS(hp50), rtMS(rtPct(hit, 0.9)), rtMS(hit[0]), rtMS(hit[len(hit)-1]))
	t.Logf("  cold start p50 %s  p90 %s  min %s  max %s", rtMS(cp50), rtMS(rtPct(cold, 0.9)), rtMS(cold[0]), rtMS(cold[len(cold)-1]))
	t.Logf("  ratio of medians hit/cold: %s", fmt.Sprintf("%.3f", float64(hp50)/float64(cp50)))
}
