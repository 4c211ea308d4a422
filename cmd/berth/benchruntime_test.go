package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/gvisor"
	"github.com/berth-dev/berth/client"
)

// TestBenchRuntimes measures the gvisor and process runtimes side by side, through the real
// HTTP API of two `berth dev` stacks running in this process (one agent each, dev defaults
// otherwise: 2 s heartbeats, working-set admission, SQLite), for docs/PERFORMANCE.md
// (issue 12). In one invocation it measures, interleaved so that both runtimes see the same
// machine load:
//
//   - create latency (SDK CreateSandbox, then DeleteSandbox) of `shell` and `python` on each
//     runtime, and beside them a bare `runsc run` of the bundle Berth writes, once running
//     /bin/true to its exit and once running Berth's own init until its "ok" line;
//   - exec latency of `python3 -c 'print(2+2)'` and of `true` on each runtime;
//   - the idle resident memory of a sandbox on each runtime, as the agent measures it;
//   - pause and resume on gvisor of guests holding 64 MiB, 512 MiB and 2 GiB in a python
//     bytearray, incompressible (os.urandom) or touched but mostly zero (one byte per page):
//     pause and resume time through the API, image and stored bytes, and the guest's data
//     checksum before the pause and after the resume.
//
// It reports figures and asserts nothing about speed; it runs only with BERTH_BENCH=1, as
// root with runsc installed:
//
//	BERTH_BENCH=1 go test ./cmd/berth -run TestBenchRuntimes -v -count=1 -timeout 60m
//
// Knobs: BERTH_BENCH_N (creates and execs per series, default 100), BERTH_BENCH_PAUSE_MB
// (guest sizes, default 64,512,2048), BERTH_BENCH_PAUSE_REPS (pauses per size and variant,
// default 3), BERTH_BENCH_PLATFORM (the gVisor platform of the gvisor stack and of the bare
// runsc runs; default: the runtime's own pick), BERTH_REPORT (also write the report to this
// file). Every sandbox, container and stack it starts is stopped when it ends, pass or fail.
func TestBenchRuntimes(t *testing.T) {
	if os.Getenv("BERTH_BENCH") != "1" {
		t.Skip("a measurement, not a test: set BERTH_BENCH=1")
	}
	runsc, err := gvisor.Find("")
	if err != nil || os.Geteuid() != 0 {
		t.Skipf("needs root and runsc: %v (euid %d)", err, os.Geteuid())
	}
	n := benchEnvInt(t, "BERTH_BENCH_N", 100)
	reps := benchEnvInt(t, "BERTH_BENCH_PAUSE_REPS", 3)
	var sizes []int64
	for _, s := range strings.Split(rtOr(os.Getenv("BERTH_BENCH_PAUSE_MB"), "64,512,2048"), ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || v <= 0 || v > 8192 {
			t.Fatalf("BERTH_BENCH_PAUSE_MB: bad size %q", s)
		}
		sizes = append(sizes, v)
	}

	var rep strings.Builder
	logf := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		rep.WriteString(line + "\n")
		t.Log(line)
	}
	defer func() {
		if path := os.Getenv("BERTH_REPORT"); path != "" {
			_ = os.WriteFile(path, []byte(rep.String()), 0o644)
		}
	}()
	platform := rtPlatform(runsc, os.Getenv("BERTH_BENCH_PLATFORM"))
	logf("machine: %s", benchMachine(runsc, platform))

	tap := &rtLogTap{}
	gv := benchStack(t, runtimeGVisor, platform, tap)
	pr := benchStack(t, runtimeProcess, "", tap)
	stacks := []*benchRT{gv, pr}
	for _, s := range stacks {
		a := agentByID(t, s.c, "dev-agent-1")
		logf("%s stack: %s, agent runtime %q, checkpoint %t", s.name, s.st.URL, a.Runtime, a.Checkpoint)
	}

	// Idle sandboxes: their resident memory, a bundle to copy for the bare runsc runs, and
	// the python sandboxes the exec series run in.
	ctx := context.Background()
	idle := map[string]berth.Sandbox{}
	for _, s := range stacks {
		for _, tpl := range []string{"shell", "python"} {
			sb, err := s.c.CreateSandbox(ctx, berth.CreateRequest{Template: tpl})
			if err != nil {
				t.Fatalf("%s: create %s: %v", s.name, tpl, err)
			}
			s.cleanupSandbox(t, sb.ID)
			idle[s.name+"/"+tpl] = sb
		}
	}
	time.Sleep(3 * time.Second) // a measurement (1 s) and a heartbeat (2 s) see them
	tw := newRTTable(&rep, t)
	fmt.Fprintln(tw, "idle sandbox\tresident MiB (agent's measure)\t")
	for _, s := range stacks {
		for _, tpl := range []string{"shell", "python"} {
			mib, _ := s.resident(t, idle[s.name+"/"+tpl].ID)
			fmt.Fprintf(tw, "%s %s\t%d\t\n", s.name, tpl, mib)
		}
	}
	tw.flush()

	bare := newRTBareRunsc(t, runsc, platform, gv.bundleConfig(t, idle["gvisor/python"].ID))

	// Creates, interleaved: each round runs every series once, starting from a different one.
	type series struct {
		name string
		run  func() (took, teardown time.Duration, err error)
	}
	var all []series
	for _, s := range stacks {
		for _, tpl := range []string{"shell", "python"} {
			all = append(all, series{s.name + " API create " + tpl, func() (time.Duration, time.Duration, error) {
				return s.createDelete(tpl)
			}})
		}
	}
	all = append(all,
		series{"bare runsc run /bin/true (to exit)", bare.runTrue},
		series{"bare runsc run Berth's init (to \"ok\")", bare.runInit})
	lat := make([][]time.Duration, len(all))
	down := make([][]time.Duration, len(all))
	fails := make([]int, len(all))
	var lastErr = make([]error, len(all))
	for i := range n {
		for k := range all {
			j := (i + k) % len(all)
			took, td, err := all[j].run()
			if err != nil {
				fails[j]++
				lastErr[j] = err
				if fails[j] > n/10+1 {
					t.Fatalf("%s: %d failures, last: %v", all[j].name, fails[j], err)
				}
				continue
			}
			lat[j] = append(lat[j], took)
			down[j] = append(down[j], td)
		}
	}
	logf("")
	logf("create latency, %d rounds, interleaved (teardown = DELETE through the API, or runsc kill + delete)", n)
	tw = newRTTable(&rep, t)
	fmt.Fprintln(tw, "series\tn\tp50\tp99\tmax\tteardown p50\tfailures\t")
	for j, s := range all {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t\n", s.name, len(lat[j]), rtMS(rtPct(lat[j], .5)), rtMS(rtPct(lat[j], .99)),
			rtMS(rtPct(lat[j], 1)), rtMS(rtPct(down[j], .5)), fails[j])
	}
	tw.flush()
	for j, err := range lastErr {
		if err != nil {
			logf("  %s, last failure: %v", all[j].name, err)
		}
	}
	p50 := func(j int) float64 { return float64(rtPct(lat[j], .5)) }
	logf("ratios of p50: gvisor/process create: shell %.1fx, python %.1fx; gvisor create / bare runsc run /bin/true: shell %.2fx, python %.2fx; gvisor create / bare runsc to \"ok\": shell %.2fx, python %.2fx",
		p50(0)/p50(2), p50(1)/p50(3), p50(0)/p50(4), p50(1)/p50(4), p50(0)/p50(5), p50(1)/p50(5))
	logf("gvisor API create − bare runsc to \"ok\" (p50): shell %s, python %s; process API create p50 (API, store, ledger, agent and the process runtime's own start): shell %s, python %s",
		rtMS(time.Duration(p50(0)-p50(5))), rtMS(time.Duration(p50(1)-p50(5))), rtMS(time.Duration(p50(2))), rtMS(time.Duration(p50(3))))

	// Concurrent creates: 4 clients, each creating and deleting shell sandboxes in a loop.
	const clients = 4
	logf("")
	logf("concurrent create + delete cycles, %d clients, %d cycles per runtime (the agent starts at most 8 at once, ADM-10)", clients, n)
	tw = newRTTable(&rep, t)
	fmt.Fprintln(tw, "runtime\tcycles\tcycles/s\tcreate p50\tcreate p99\tcreate max\tfailures\t")
	for _, s := range stacks {
		l, elapsed, failed := s.burst(clients, n)
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%s\t%s\t%s\t%d\t\n", s.name, len(l), float64(len(l))/elapsed.Seconds(),
			rtMS(rtPct(l, .5)), rtMS(rtPct(l, .99)), rtMS(rtPct(l, 1)), failed)
	}
	tw.flush()

	// Execs, interleaved between the runtimes.
	cmds := []struct {
		name string
		cmd  []string
		want string
	}{{"python3 -c 'print(2+2)'", []string{"python3", "-c", "print(2+2)"}, "4\n"}, {"true", []string{"true"}, ""}}
	execLat := map[string][]time.Duration{}
	for i := range n {
		for k := range stacks {
			s := stacks[(i+k)%len(stacks)]
			for _, c := range cmds {
				start := time.Now()
				res, err := s.c.Exec(ctx, idle[s.name+"/python"].ID, berth.ExecRequest{Cmd: c.cmd, TimeoutS: 60})
				took := time.Since(start)
				if err != nil || res.ExitCode != 0 || res.Stdout != c.want {
					t.Fatalf("%s: exec %s: %+v, %v", s.name, c.name, res, err)
				}
				execLat[s.name+"\t"+c.name] = append(execLat[s.name+"\t"+c.name], took)
			}
		}
	}
	logf("")
	logf("exec latency (POST /v1/sandboxes/{id}/exec through the SDK), %d rounds, interleaved", n)
	tw = newRTTable(&rep, t)
	fmt.Fprintln(tw, "runtime\tcommand\tn\tp50\tp99\tmax\t")
	for _, c := range cmds {
		for _, s := range stacks {
			l := execLat[s.name+"\t"+c.name]
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t\n", s.name, c.name, len(l), rtMS(rtPct(l, .5)), rtMS(rtPct(l, .99)), rtMS(rtPct(l, 1)))
		}
	}
	tw.flush()
	for _, c := range cmds {
		g, p := execLat["gvisor\t"+c.name], execLat["process\t"+c.name]
		logf("exec %s: gvisor/process p50 %.1fx, gvisor − process p50 %s", c.name,
			float64(rtPct(g, .5))/float64(rtPct(p, .5)), rtMS(rtPct(g, .5)-rtPct(p, .5)))
	}
	for _, s := range stacks {
		for _, tpl := range []string{"shell", "python"} {
			s.delete(t, idle[s.name+"/"+tpl].ID)
		}
	}

	// Pause and resume on gvisor.
	logf("")
	logf("pause and resume on gvisor (python bytearray kept alive in the guest; %d per row; resident, image and stored MiB and the checkpoint/upload split from the pause event's reason; fetch and restore from the agent's log; after = from the agent's restore to the server's answer: store transition and image deletion)", reps)
	tw = newRTTable(&rep, t)
	fmt.Fprintln(tw, "guest\tmemory_mb\tresident MiB\timage MiB\tstored MiB\tstored ÷ resident\tpause p50 (min–max)\tcheckpoint + upload ms\tresume p50 (min–max)\tfetch + restore + after ms\thost MiB freed by pause\tchecksum\t")
	for _, size := range sizes {
		for _, mode := range []string{"random", "sparse"} {
			var rs []rtPauseRun
			for r := range reps {
				pr, err := gv.pauseResume(t, tap, size, mode, r == 0)
				if err != nil {
					logf("  %d MiB %s, run %d: %v", size, mode, r+1, err)
					continue
				}
				rs = append(rs, pr)
			}
			if len(rs) == 0 {
				fmt.Fprintf(tw, "%d MiB %s\t%d\tfailed\t\t\t\t\t\t\t\t\t\t\n", size, mode, rtPauseMemory(size))
				continue
			}
			med := func(f func(rtPauseRun) float64) float64 {
				v := make([]float64, len(rs))
				for i, r := range rs {
					v[i] = f(r)
				}
				slices.Sort(v)
				return v[len(v)/2]
			}
			span := func(f func(rtPauseRun) time.Duration) string {
				v := make([]time.Duration, len(rs))
				for i, r := range rs {
					v[i] = f(r)
				}
				slices.Sort(v)
				return fmt.Sprintf("%s (%s–%s)", rtMS(v[len(v)/2]), rtMS(v[0]), rtMS(v[len(v)-1]))
			}
			sums := "same"
			for _, r := range rs {
				if !r.sameSum {
					sums = "DIFFERENT"
				}
			}
			resident := med(func(r rtPauseRun) float64 { return float64(r.residentMiB) })
			stored := med(func(r rtPauseRun) float64 { return r.storedMiB })
			fmt.Fprintf(tw, "%d MiB %s\t%d\t%.0f\t%.1f\t%.1f\t%.2f\t%s\t%.0f + %.0f\t%s\t%.0f + %.0f + %.0f\t%.0f\t%s (%d/%d)\t\n",
				size, mode, rtPauseMemory(size), resident, med(func(r rtPauseRun) float64 { return r.imageMiB }), stored, stored/resident,
				span(func(r rtPauseRun) time.Duration { return r.pause }),
				med(func(r rtPauseRun) float64 { return float64(r.checkpointMS) }), med(func(r rtPauseRun) float64 { return float64(r.uploadMS) }),
				span(func(r rtPauseRun) time.Duration { return r.resume }),
				med(func(r rtPauseRun) float64 { return float64(r.fetchMS) }), med(func(r rtPauseRun) float64 { return float64(r.restoreMS) }),
				med(func(r rtPauseRun) float64 { return float64(r.afterRestoreMS) }),
				med(func(r rtPauseRun) float64 { return float64(r.freedMiB) }), sums, len(rs), reps)
		}
	}
	tw.flush()
	for _, l := range gv.notes {
		logf("  %s", l)
	}
}

// benchRT is one `berth dev` stack of the benchmark and its admin client.
type benchRT struct {
	name  string
	st    *devStack
	c     *client.Client
	notes []string
}

// benchStack starts `berth dev` on runtime with one agent, dev defaults otherwise, and
// stops it (and every sandbox) when the test ends.
func benchStack(t *testing.T, runtime, platform string, tap *rtLogTap) *benchRT {
	t.Helper()
	cfg := defaultDevConfig()
	cfg.Listen, cfg.Data, cfg.Agents, cfg.AgentMemoryMiB = "127.0.0.1:0", t.TempDir(), 1, 8192
	cfg.Runtime.Runtime, cfg.Runtime.Platform = runtime, platform
	var next slog.Handler = slog.NewTextHandler(io.Discard, nil)
	if testing.Verbose() {
		next = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	cfg.Logger = slog.New(tap.with(next))
	st, err := startDev(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start %s stack: %v", runtime, err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("close %s stack: %v", runtime, err)
		}
	})
	return &benchRT{name: runtime, st: st, c: adminClient(st, client.WithDeadline(5*time.Minute))}
}

// cleanupSandbox deletes sandbox id when the test ends (if it still exists).
func (s *benchRT) cleanupSandbox(t *testing.T, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = s.c.DeleteSandbox(ctx, id)
	})
}

func (s *benchRT) delete(t *testing.T, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.c.DeleteSandbox(ctx, id); err != nil {
		t.Errorf("%s: delete %s: %v", s.name, id, err)
	}
}

// createDelete times one create of tpl through the API and the delete that follows.
func (s *benchRT) createDelete(tpl string) (time.Duration, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	sb, err := s.c.CreateSandbox(ctx, berth.CreateRequest{Template: tpl})
	took := time.Since(start)
	if err != nil {
		return 0, 0, err
	}
	start = time.Now()
	if err := s.c.DeleteSandbox(ctx, sb.ID); err != nil {
		return 0, 0, fmt.Errorf("delete %s: %w", sb.ID, err)
	}
	return took, time.Since(start), nil
}

// burst runs total create + delete cycles of a shell sandbox from clients goroutines and
// returns the create latencies, the elapsed time and the number of failed cycles.
func (s *benchRT) burst(clients, total int) ([]time.Duration, time.Duration, int) {
	var mu sync.Mutex
	var lat []time.Duration
	next, failed := 0, 0
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				mu.Lock()
				if next >= total {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				took, _, err := s.createDelete("shell")
				mu.Lock()
				if err != nil {
					failed++
				} else {
					lat = append(lat, took)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lat, time.Since(start), failed
}

// resident returns the agent's latest measure of sandbox id (GET /v1/agents), and whether
// the agent has measured it yet.
func (s *benchRT) resident(t *testing.T, id string) (int64, bool) {
	t.Helper()
	for _, h := range agentByID(t, s.c, "dev-agent-1").Sandboxes {
		if h.ID == id {
			return h.ResidentMiB, h.Measured
		}
	}
	return 0, false
}

// bundleConfig reads the OCI config Berth wrote for the running gvisor sandbox id.
func (s *benchRT) bundleConfig(t *testing.T, id string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.st.dataDir, "agents", "dev-agent-1", "bundles", id, "config.json"))
	if err != nil {
		t.Fatalf("the bundle Berth wrote: %v", err)
	}
	return b
}

// rtBareRunsc runs runsc by hand on copies of a bundle Berth wrote, with Berth's global flags,
// its own --root and its own cgroup parent.
type rtBareRunsc struct {
	runsc    string
	platform string
	root     string
	cgroup   string // cgroup parent, e.g. /berth-bench-runsc-123
	trueDir  string // args: /bin/true
	initDir  string // args unchanged: Berth's init, which says "ok" and serves
	seq      int
}

func newRTBareRunsc(t *testing.T, runsc, platform string, config []byte) *rtBareRunsc {
	t.Helper()
	b := &rtBareRunsc{runsc: runsc, platform: platform, root: t.TempDir(), cgroup: fmt.Sprintf("/berth-bench-runsc-%d", os.Getpid())}
	dir := t.TempDir()
	b.trueDir, b.initDir = filepath.Join(dir, "true"), filepath.Join(dir, "init")
	for _, d := range []string{b.trueDir, b.initDir} {
		var spec specs.Spec
		if err := json.Unmarshal(config, &spec); err != nil {
			t.Fatalf("bundle config: %v", err)
		}
		if d == b.trueDir {
			spec.Process.Args = []string{"/bin/true"}
		}
		spec.Linux.CgroupsPath = "" // set per run
		out, _ := json.MarshalIndent(&spec, "", "  ")
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "config.json"), out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Whatever a failed run left: its containers, then the (empty) cgroup parents.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ents, _ := os.ReadDir(b.root)
		for _, e := range ents {
			if id, ok := strings.CutSuffix(e.Name(), ".state"); ok && strings.HasPrefix(id, "bare-") {
				b.cmd(ctx, "kill", id, "KILL").Run()
				b.cmd(ctx, "delete", "--force", id).Run()
			}
		}
		ctrls, _ := filepath.Glob("/sys/fs/cgroup/*" + b.cgroup)
		ctrls = append(ctrls, "/sys/fs/cgroup"+b.cgroup)
		for _, c := range ctrls {
			_ = os.Remove(c)
		}
	})
	return b
}

func (b *rtBareRunsc) cmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, b.runsc, append([]string{"--root", b.root, "--platform", b.platform, "--network", "none"}, args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	return cmd
}

// prepare sets a fresh container id and cgroup in the bundle dir.
func (b *rtBareRunsc) prepare(dir string) (string, error) {
	b.seq++
	id := fmt.Sprintf("bare-%d-%d", os.Getpid(), b.seq)
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return "", err
	}
	var spec specs.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return "", err
	}
	spec.Linux.CgroupsPath = b.cgroup + "/" + id
	spec.Hostname = id
	out, _ := json.MarshalIndent(&spec, "", "  ")
	return id, os.WriteFile(filepath.Join(dir, "config.json"), out, 0o600)
}

// runTrue times `runsc run` of /bin/true, from the command's start to its exit (the
// container is deleted by then).
func (b *rtBareRunsc) runTrue() (time.Duration, time.Duration, error) {
	id, err := b.prepare(b.trueDir)
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := b.cmd(ctx, "run", "--bundle", b.trueDir, id).CombinedOutput()
	took := time.Since(start)
	if err != nil {
		return 0, 0, fmt.Errorf("runsc run /bin/true: %v: %s", err, rtTail(out))
	}
	return took, 0, nil
}

// runInit times `runsc run` of the bundle as Berth writes it until its init prints "ok"
// (what the runtime's Start waits for), then times the teardown Berth's Stop does: runsc
// kill, the run's exit, runsc delete.
func (b *rtBareRunsc) runInit() (time.Duration, time.Duration, error) {
	id, err := b.prepare(b.initDir)
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := b.cmd(ctx, "run", "--bundle", b.initDir, id)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	line, rerr := bufio.NewReader(out).ReadString('\n')
	took := time.Since(start)
	go io.Copy(io.Discard, out)
	start = time.Now()
	b.cmd(ctx, "kill", id, "KILL").Run()
	werr := cmd.Wait()
	dout, derr := b.cmd(ctx, "delete", "--force", id).CombinedOutput()
	td := time.Since(start)
	switch {
	case strings.TrimSpace(line) != "ok":
		return 0, 0, fmt.Errorf("runsc run init: first line %q (%v), exit %v: %s", line, rerr, werr, rtTail([]byte(stderr.String())))
	case derr != nil && !strings.Contains(string(dout), "does not exist"):
		return 0, 0, fmt.Errorf("runsc delete: %v: %s", derr, rtTail(dout))
	}
	return took, td, nil
}

func rtTail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 600 {
		s = s[len(s)-600:]
	}
	return s
}

// rtHoldPy keeps a bytearray of argv[1] MiB alive: "random" fills it from os.urandom,
// "sparse" writes one byte per 4 KiB page (every page touched, mostly zero). It writes its
// pid to /tmp/hold.pid and the SHA-256 of the array to /tmp/sum-before, then waits; on
// SIGUSR1 it writes the SHA-256 of the same array again to /tmp/sum-after.
const rtHoldPy = `import hashlib, os, signal, sys
n = int(sys.argv[1]) << 20
b = bytearray(n)
if sys.argv[2] == "random":
    step = 1 << 20
    for i in range(0, n, step):
        b[i:i + step] = os.urandom(step)
else:
    b[::4096] = b"\x01" * len(range(0, n, 4096))

def put(name):
    with open("/tmp/sum.tmp", "w") as f:
        f.write(hashlib.sha256(b).hexdigest())
    os.rename("/tmp/sum.tmp", name)

signal.signal(signal.SIGUSR1, lambda *_: put("/tmp/sum-after"))
with open("/tmp/hold.pid", "w") as f:
    f.write(str(os.getpid()))
put("/tmp/sum-before")
while True:
    signal.pause()
`

// rtPauseMemory is the sandbox size for a guest holding size MiB.
func rtPauseMemory(size int64) int64 {
	switch {
	case size <= 64:
		return 256
	case size <= 512:
		return 1024
	}
	return size + 1024
}

type rtPauseRun struct {
	residentMiB            int64
	imageMiB, storedMiB    float64
	checkpointMS, uploadMS int64
	fetchMS, restoreMS     int64
	afterRestoreMS         int64
	pause, resume          time.Duration
	freedMiB               int64
	sameSum                bool
}

var rtPauseReason = regexp.MustCompile(`(\d+) MiB resident, a ([0-9.]+) MiB image \(([0-9.]+) MiB stored\) in (\d+) ms \+ (\d+) ms upload`)

// pauseResume creates a stateful python sandbox of rtPauseMemory(size) MiB whose guest holds
// size MiB (mode random or sparse), waits until the agent measures it, pauses it, resumes
// it and compares the guest's checksums, then deletes it. With late, it also reads the
// resident memory 30 s after the resume.
func (s *benchRT) pauseResume(t *testing.T, tap *rtLogTap, size int64, mode string, late bool) (rtPauseRun, error) {
	t.Helper()
	var r rtPauseRun
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sb, err := s.c.CreateSandbox(ctx, berth.CreateRequest{Template: "python", MemoryMiB: rtPauseMemory(size), Stateful: true})
	if err != nil {
		return r, fmt.Errorf("create: %w", err)
	}
	s.cleanupSandbox(t, sb.ID)
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		_ = s.c.DeleteSandbox(dctx, sb.ID)
	}()
	if err := s.c.WriteFile(ctx, sb.ID, "/tmp/hold.py", []byte(rtHoldPy)); err != nil {
		return r, fmt.Errorf("write hold.py: %w", err)
	}
	res, err := s.c.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"sh", "-c",
		fmt.Sprintf("nohup python3 /tmp/hold.py %d %s >/tmp/hold.log 2>&1 &", size, mode)}})
	if err != nil || res.ExitCode != 0 {
		return r, fmt.Errorf("start the guest: %+v, %v", res, err)
	}
	fill := time.Now()
	before, err := s.waitFile(ctx, sb.ID, "/tmp/sum-before", "/tmp/hold.log", 10*time.Minute)
	if err != nil {
		log, _ := s.c.ReadFile(ctx, sb.ID, "/tmp/hold.log")
		return r, fmt.Errorf("%w (guest log: %s)", err, rtTail(log))
	}
	fillTook := time.Since(fill)
	pid, err := s.c.ReadFile(ctx, sb.ID, "/tmp/hold.pid")
	if err != nil {
		return r, err
	}
	// The agent measures every second: wait until its reading holds the array and is stable.
	s.settled(t, sb.ID, size)
	statBefore := rtCgroupStat(sb.ID)
	availLoaded := rtMemAvailableMiB()

	start := time.Now()
	paused, err := s.c.PauseSandbox(ctx, sb.ID)
	r.pause = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("pause: %w", err)
	}
	m := rtPauseReason.FindStringSubmatch(paused.Reason)
	if paused.State != berth.SandboxPaused || m == nil {
		return r, fmt.Errorf("pause: state %s, reason %q", paused.State, paused.Reason)
	}
	r.residentMiB, _ = strconv.ParseInt(m[1], 10, 64)
	r.imageMiB, _ = strconv.ParseFloat(m[2], 64)
	r.storedMiB, _ = strconv.ParseFloat(m[3], 64)
	r.checkpointMS, _ = strconv.ParseInt(m[4], 10, 64)
	r.uploadMS, _ = strconv.ParseInt(m[5], 10, 64)
	time.Sleep(2 * time.Second) // the kernel frees the sentry's memory as its cgroup goes
	r.freedMiB = rtMemAvailableMiB() - availLoaded
	onDisk := rtDirSize(filepath.Join(s.st.dataDir, "snapshots", sb.ID))

	start = time.Now()
	resumed, err := s.c.ResumeSandbox(ctx, sb.ID)
	r.resume = time.Since(start)
	if err != nil || resumed.State != berth.SandboxRunning {
		return r, fmt.Errorf("resume: %s, %w", resumed.State, err)
	}
	if rec, ok := tap.find("sandbox restored", sb.ID); ok {
		r.fetchMS, _ = strconv.ParseInt(rec["fetch_ms"], 10, 64)
		r.restoreMS, _ = strconv.ParseInt(rec["restore_ms"], 10, 64)
		// From the agent's "restored" to the server's "resumed": the store's transition and
		// the deletion of the image from the snapshot store, before the API answers.
		if srv, ok := tap.find("sandbox resumed", sb.ID); ok {
			a, _ := strconv.ParseInt(rec["time"], 10, 64)
			b, _ := strconv.ParseInt(srv["time"], 10, 64)
			r.afterRestoreMS = (b - a) / 1e6
		}
	}
	res, err = s.c.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"sh", "-c", "kill -USR1 " + strings.TrimSpace(string(pid))}})
	if err != nil || res.ExitCode != 0 {
		return r, fmt.Errorf("signal the guest after the resume: %+v, %v", res, err)
	}
	after, err := s.waitFile(ctx, sb.ID, "/tmp/sum-after", "/tmp/hold.log", 10*time.Minute)
	if err != nil {
		return r, fmt.Errorf("after the resume: %w", err)
	}
	r.sameSum = after == before && len(before) == 64
	resAfter := s.settled(t, sb.ID, 1)
	statAfter := rtCgroupStat(sb.ID)
	if late {
		// Does the restored sentry give back what the restore took? A reading 30 s on.
		time.Sleep(30 * time.Second)
		mib, _ := s.resident(t, sb.ID)
		statAfter += fmt.Sprintf("; 30 s later: resident %d MiB, %s", mib, rtCgroupStat(sb.ID))
	}
	s.notes = append(s.notes, fmt.Sprintf("%d MiB %s (%s): filled in %s; resident %d MiB before the pause, %d MiB after the resume; host MemAvailable +%d MiB after the pause; %.1f MiB on disk in the store; pause %s, resume %s; sha256 %s… %s; cgroup memory.stat MiB before the pause: %s; after the resume: %s",
		size, sb.ID, mode, fillTook.Round(10*time.Millisecond), r.residentMiB, resAfter, r.freedMiB, float64(onDisk)/(1<<20),
		rtMS(r.pause), rtMS(r.resume), before[:min(12, len(before))], map[bool]string{true: "same after the resume", false: "DIFFERS after the resume: " + after}[r.sameSum], statBefore, statAfter))
	return r, nil
}

// settled waits (at most 60 s) until the agent has measured sandbox id at least atLeast MiB
// with two equal readings in a row, and returns the reading.
func (s *benchRT) settled(t *testing.T, id string, atLeast int64) int64 {
	var last int64 = -1
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		mib, measured := s.resident(t, id)
		if measured && mib >= atLeast && mib == last {
			return mib
		}
		last = mib
		time.Sleep(1500 * time.Millisecond)
	}
	return last
}

// rtCgroupStat summarises the memory cgroup of gvisor sandbox id (cgroup v1 or v2), MiB.
func rtCgroupStat(id string) string {
	paths, _ := filepath.Glob("/sys/fs/cgroup/memory/berth-gvisor/*/" + id + "/memory.stat")
	if len(paths) == 0 {
		paths, _ = filepath.Glob("/sys/fs/cgroup/berth-gvisor/*/" + id + "/memory.stat")
	}
	if len(paths) == 0 {
		return "no cgroup"
	}
	b, err := os.ReadFile(paths[0])
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v1 := strings.Contains(string(b), "total_rss ")
		if v1 != strings.HasPrefix(f[0], "total_") {
			continue
		}
		switch strings.TrimPrefix(f[0], "total_") {
		case "rss", "anon", "cache", "file", "shmem", "active_file", "inactive_file":
			v, _ := strconv.ParseInt(f[1], 10, 64)
			out = append(out, fmt.Sprintf("%s %d", strings.TrimPrefix(f[0], "total_"), v>>20))
		}
	}
	return strings.Join(out, ", ")
}

// waitFile polls until path exists in sandbox id and returns its content; it gives up early
// when the guest's log (errlog) shows a Python error.
func (s *benchRT) waitFile(ctx context.Context, id, path, errlog string, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		b, err := s.c.ReadFile(ctx, id, path)
		if err == nil {
			return strings.TrimSpace(string(b)), nil
		}
		if l, lerr := s.c.ReadFile(ctx, id, errlog); lerr == nil && strings.Contains(string(l), "Error") {
			return "", fmt.Errorf("the guest failed: %s", rtTail(l))
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %s after %s: %v", path, limit, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func rtMemAvailableMiB() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb >> 10
		}
	}
	return 0
}

func rtDirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// rtLogTap passes log records on and keeps the attributes of the few it is asked about.
type rtLogTap struct {
	mu   sync.Mutex
	recs []map[string]string
}

var rtTapped = map[string]bool{"sandbox restored": true, "sandbox checkpointed": true, "sandbox resumed": true}

func (t *rtLogTap) with(next slog.Handler) slog.Handler { return &rtTapHandler{tap: t, next: next} }

// find returns the latest record msg about sandbox id.
func (t *rtLogTap) find(msg, id string) (map[string]string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.recs) - 1; i >= 0; i-- {
		if t.recs[i]["msg"] == msg && t.recs[i]["sandbox"] == id {
			return t.recs[i], true
		}
	}
	return nil, false
}

type rtTapHandler struct {
	tap  *rtLogTap
	next slog.Handler
}

func (h *rtTapHandler) Enabled(ctx context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h *rtTapHandler) Handle(ctx context.Context, r slog.Record) error {
	if rtTapped[r.Message] {
		m := map[string]string{"msg": r.Message, "time": strconv.FormatInt(r.Time.UnixNano(), 10)}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		h.tap.mu.Lock()
		h.tap.recs = append(h.tap.recs, m)
		h.tap.mu.Unlock()
	}
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}
func (h *rtTapHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &rtTapHandler{tap: h.tap, next: h.next.WithAttrs(as)}
}
func (h *rtTapHandler) WithGroup(g string) slog.Handler {
	return &rtTapHandler{tap: h.tap, next: h.next.WithGroup(g)}
}

// rtPlatform is the gVisor platform of the benchmark: want when set, else what the gvisor
// runtime picks (systrap when this runsc has it, else ptrace).
func rtPlatform(runsc, want string) string {
	if want != "" {
		return want
	}
	out, _ := exec.Command(runsc, "help", "platforms").CombinedOutput()
	if slices.Contains(strings.Fields(string(out)), "systrap") {
		return "systrap"
	}
	return "ptrace"
}

// benchMachine describes the machine: cores, memory, CPU model, kernel, runsc and platform.
func benchMachine(runsc, platform string) string {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	var total int64
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
				total = kb >> 10
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	ver, _ := exec.Command(runsc, "--version").Output()
	line, _, _ := strings.Cut(string(ver), "\n")
	load, _ := os.ReadFile("/proc/loadavg")
	return fmt.Sprintf("%d cores (%s), %d MiB, kernel %s, %s, platform %s, load %s",
		goruntime.NumCPU(), cpu, total, strings.TrimSpace(string(kernel)), strings.TrimSpace(line), platform, strings.Join(strings.Fields(string(load))[:3], " "))
}

func benchEnvInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 10000 {
		t.Fatalf("%s=%q: want 1..10000", name, v)
	}
	return n
}

func rtOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// pctOf returns the p-th percentile (nearest rank below) of ds, which it sorts in place.
func rtPct(ds []time.Duration, p float64) time.Duration {
	slices.Sort(ds)
	return pct(ds, p)
}

func rtMS(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// table is a tabwriter whose output goes to the report and the test log.
type rtTable struct {
	*tabwriter.Writer
	buf strings.Builder
	rep *strings.Builder
	t   *testing.T
}

func newRTTable(rep *strings.Builder, t *testing.T) *rtTable {
	tb := &rtTable{rep: rep, t: t}
	tb.Writer = tabwriter.NewWriter(&tb.buf, 0, 4, 2, ' ', 0)
	return tb
}

func (tb *rtTable) flush() {
	tb.Writer.Flush()
	tb.rep.WriteString(tb.buf.String())
	tb.t.Log("\n" + tb.buf.String())
}
