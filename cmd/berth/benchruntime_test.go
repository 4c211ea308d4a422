package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

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
	time.Sleep(3 * time.Second) // real: a measurement: the real agent's measure (1 s) and heartbeat (2 s) periods
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
