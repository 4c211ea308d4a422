package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestMetrics_OOMCounterSurvivesSandboxEnd: a real kernel OOM kill inside a process sandbox
// (its cgroup's memory.max) is counted by the agent's berth_agent_oom_kills_total, and the
// counter does not drop when the sandbox is deleted (issue 15, C09): the old gauge summed the
// held sandboxes' kills and fell back to 0, which increase() misread. Needs root (cgroups).
func TestMetrics_OOMCounterSurvivesSandboxEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a kernel OOM kill in a sandbox needs the process runtime's cgroups: run as root")
	}
	st := bootDev(t, nil)
	code, _, sb, e := rawCreate(t, st, `{"template":"python","memory_mb":128}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %+v", code, e)
	}
	oom := func() float64 {
		v, ok := value(scrapeAgents(t, st), "berth_agent_oom_kills_total", map[string]string{"agent": sb.AgentID})
		if !ok {
			t.Fatalf("agent %s exports no berth_agent_oom_kills_total", sb.AgentID)
		}
		return v
	}
	if v := oom(); v != 0 {
		t.Fatalf("before: %v OOM kills, want 0", v)
	}
	// 512 MiB touched in a 128 MiB sandbox: the kernel kills the python process, not the init.
	res, err := adminClient(st).Exec(context.Background(), sb.ID, berth.ExecRequest{
		Cmd: []string{"python3", "-c", "b = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1"}})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if res.ExitCode == 0 {
		t.Fatalf("the allocation of 512 MiB in a 128 MiB sandbox succeeded: %+v", res)
	}
	var seen float64
	waitFor(t, 30*time.Second, "the agent to count the OOM kill", func() (bool, string) {
		seen = oom()
		return seen >= 1, fmt.Sprint(seen)
	})
	if err := adminClient(st).DeleteSandbox(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if v := oom(); v < seen {
		t.Fatalf("after the sandbox ended: %v OOM kills, down from %v: a counter never decreases", v, seen)
	}
}
