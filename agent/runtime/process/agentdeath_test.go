package process

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/cgroups"
)

// The test binary plays an agent when these are set (see TestMain).
const (
	fakeAgentEnv    = "BERTH_PROCESS_TEST_FAKE_AGENT" // isolation mode
	fakeAgentDirEnv = "BERTH_PROCESS_TEST_FAKE_AGENT_DIR"
)

// fakeAgent starts one sandbox with a background process, prints the host pids of the
// sandbox's processes on one line and waits to be killed.
func fakeAgent(mode, dir string) int {
	r, err := New(Config{Dir: dir, Isolate: mode, Insecure: mode == IsolateOff})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	if err := r.Start(ctx, Spec{ID: "sb-agent", MemoryMiB: 128}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := r.Exec(ctx, "sb-agent", berth.ExecRequest{Cmd: []string{"sh", "-c", "sleep 1000 &"}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sb := held(r, "sb-agent")
	pids := processTree("/proc", sb.proc.Pid)
	if sb.cgroup != "" {
		pids, _ = cgroups.Procs(sb.cgroup)
	}
	fmt.Println(strings.Trim(fmt.Sprint(pids), "[]"))
	select {}
}

// When the agent dies without stopping its sandboxes, they die with it: the init gets a
// parent-death signal, and the whole tree goes (the namespace with isolation, a tree walk
// without). New on the same Dir then removes what is left.
func TestAgentDeathKillsSandboxes(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			if mode == IsolateOn && os.Geteuid() != 0 {
				t.Skip("isolation needs root")
			}
			dir := t.TempDir()
			agent := exec.Command(os.Args[0], "-test.run=^$")
			agent.Env = append(os.Environ(), fakeAgentEnv+"="+mode, fakeAgentDirEnv+"="+dir)
			agent.Stderr = os.Stderr
			out, err := agent.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := agent.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				t.Fatalf("fake agent printed %q: %v", line, err)
			}
			starts := map[int]string{}
			for _, f := range strings.Fields(line) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatalf("fake agent printed %q", line)
				}
				starts[pid] = startTime(pid)
			}
			if len(starts) != 2 {
				t.Fatalf("sandbox pids = %v, want the init and the background sleep", line)
			}

			agent.Process.Kill()
			agent.Wait()
			waitFor(t, "the sandbox processes to die with the agent", func() bool {
				for pid, st := range starts {
					if startTime(pid) == st {
						return false
					}
				}
				return true
			})
			newRuntimeIn(t, dir, mode) // cleans the leftover dir and cgroups
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != "rootfs" { // the built-in root, kept
					t.Errorf("after New, Dir holds %s, want only rootfs", e.Name())
				}
			}
		})
	}
}
