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

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/client"
)

// TestWarmPoolFlag: --warm-pool's spellings (issue 16, goal 5): built-in templates take
// their own memory size, others must name one, and a malformed value is refused with what
// was wrong rather than half-applied.
func TestWarmPoolFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []agent.WarmPoolEntry
		bad  bool
	}{
		{in: "", want: nil},
		{in: "none", want: nil},
		{in: "shell=2,python=1", want: []agent.WarmPoolEntry{{Template: "shell", MemoryMiB: 256, Size: 2}, {Template: "python", MemoryMiB: 512, Size: 1}}},
		{in: " shell=0 , ml=1:4096", want: []agent.WarmPoolEntry{{Template: "shell", MemoryMiB: 256, Size: 0}, {Template: "ml", MemoryMiB: 4096, Size: 1}}},
		{in: "shell=2:1024", want: []agent.WarmPoolEntry{{Template: "shell", MemoryMiB: 1024, Size: 2}}},
		{in: "ml=1", bad: true},
		{in: "shell", bad: true},
		{in: "=1", bad: true},
		{in: "shell=-1", bad: true},
		{in: "shell=x", bad: true},
		{in: "shell=1:0", bad: true},
		{in: "shell=1:big", bad: true},
		{in: "shell=1,", bad: true},
	} {
		var got []agent.WarmPoolEntry
		err := warmPoolFlag{&got}.Set(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("Set(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("Set(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Set(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

// TestWarmPoolFlagMessages (a new user's report: `--warm-pool "nope=abc": want "nope=abc": the
// count must be…`): a malformed --warm-pool exits 2 and says after "want" what form is
// wanted, not the value again; in a list it names the entry at fault.
func TestWarmPoolFlagMessages(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"nope=abc", "want TEMPLATE=COUNT[:MEMORY_MB] with COUNT a whole number ≥ 0, e.g. shell=2"},
		{"shell=-1", "want TEMPLATE=COUNT[:MEMORY_MB] with COUNT a whole number ≥ 0"},
		{"shell", "want TEMPLATE=COUNT[:MEMORY_MB], comma-separated, e.g. shell=2,python=1"},
		{"=1", "want TEMPLATE=COUNT[:MEMORY_MB], comma-separated"},
		{"shell=1:big", "want TEMPLATE=COUNT:MEMORY_MB with MEMORY_MB a positive number of MiB, e.g. shell=1:1024"},
		{"ml=1", "want ml=1:MEMORY_MB: ml is not a built-in template (python, shell), so give its memory size in MiB, e.g. ml=1:1024"},
		{"shell=1,nope=abc", `with COUNT a whole number ≥ 0, e.g. shell=2 (entry "nope=abc")`},
		{"shell=1,", "(an entry is empty)"},
	} {
		r := runCLI(t, "", "dev", "--warm-pool", tc.in)
		if r.code != exitInvalid {
			t.Errorf("--warm-pool %q: exit %d, want %d; stderr %q", tc.in, r.code, exitInvalid, r.stderr)
			continue
		}
		checkStderr(t, r.stderr, tc.want)
		if _, after, _ := strings.Cut(r.stderr, ": want "); strings.Contains(after, strconv.Quote(tc.in)) {
			t.Errorf("--warm-pool %q: %q repeats the value after \"want\"", tc.in, r.stderr)
		}
	}
}

// TestWarmPool_ThroughTheAPI (issue 16, goal 5), end to end on `berth dev` with real
// sandboxes (the process runtime): one agent of 1024 MiB in committed mode with
// --warm-pool shell=2 (512 MiB held warm). A create of shell is a hit and the pool refills;
// then a create of 768 MiB — which fits only if the pool gives its room — is placed by the
// server (the agent's published room leaves the pool out) and admitted by the agent, which
// stops the warm guests first.
func TestWarmPool_ThroughTheAPI(t *testing.T) {
	cfg := defaultDevConfig()
	cfg.Listen, cfg.Data, cfg.Agents = "127.0.0.1:0", t.TempDir(), 1
	cfg.AgentMemoryMiB, cfg.HeadroomMiB, cfg.Admission = 1024, 0, berth.AdmissionCommitted
	cfg.Runtime.Runtime, cfg.Runtime.Insecure = runtimeProcess, os.Geteuid() != 0
	cfg.WarmPool = []agent.WarmPoolEntry{{Template: "shell", MemoryMiB: 256, Size: 2}}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := startDev(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	c := adminClient(st, client.WithDeadline(time.Minute))
	metrics := agentByID(t, c, "dev-agent-1").Address + "/metrics"
	series := func(name string) int {
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
	ready := func(n int) func() (bool, string) {
		return func() (bool, string) {
			got := series("berth_agent_warm_pool_ready")
			return got == n, fmt.Sprintf("%d ready", got)
		}
	}
	waitFor(t, time.Minute, "two warm guests", ready(2))

	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	if h := series("berth_agent_warm_pool_hits_total"); h != 1 {
		t.Fatalf("hits = %d after a create of shell, want 1", h)
	}
	if res, err := c.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"echo", "warm"}}); err != nil || res.Stdout != "warm\n" {
		t.Fatalf("exec in the warm sandbox: %+v, %v", res, err)
	}
	waitFor(t, time.Minute, "the pool refilled to two", ready(2))

	big, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python", MemoryMiB: 768})
	if err != nil {
		t.Fatalf("create of 768 MiB beside 256 MiB held and a 512 MiB pool on a 1024 MiB host: %v, want it placed (the pool gives its room)", err)
	}
	if big.State != berth.SandboxRunning {
		t.Fatalf("big is %s, want running", big.State)
	}
	if got := series("berth_agent_warm_pool_ready"); got != 0 {
		t.Fatalf("%d warm guests left beside 1024 MiB committed, want 0 (stopped for the create)", got)
	}
}
