package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/sim"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// simFlags are `berth sim`'s knobs with their documented defaults (STYLE 9): the defaults
// reproduce the seed arithmetic on one 32 GiB host.
type simFlags struct {
	scen       sim.Scenario
	idle       sim.IdleModel
	workload   string
	traceDir   string
	traceStep  time.Duration
	policies   string
	burst      bool
	csvPath    string
	plotsDir   string
	retry      bool
	retryAfter bool
}

func defaultSimFlags() simFlags {
	return simFlags{
		scen: sim.Scenario{Hosts: 1, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, Replicas: 4, Seed: 1,
			Heartbeat: 10 * time.Second, RefreshEvery: time.Second, CordonDelay: 500 * time.Millisecond,
			Failures: sim.Failures{NoticeFrac: 1, Notices: []time.Duration{30 * time.Second, 120 * time.Second},
				LinkMiBps: 100, CanSnapshot: true}},
		idle: sim.IdleModel{Creates: 1000, MemoryMiB: 4 << 10, TouchMiB: 300, LifetimeSigma: 1,
			SpikeFrac: 0.8, SpikeFor: 2 * time.Minute, GrowthOver: 10 * time.Minute, ReconstructibleFrac: 0.5},
		workload: "idle", traceStep: 5 * time.Minute,
		policies: "committed,working-set,none", burst: true, retry: true, retryAfter: true,
	}
}

// The most `berth sim` (SIM-1) takes of its flags whose large values printed nonsense; a value
// above one is invalid_request (exit 2) naming the flag.
const (
	// maxSimHostMiB is 1 PiB (2^30 MiB) per host, as `berth plan` takes for a guest: the
	// largest single machines hold tens of TiB. At 2^63 MiB the ledger burst's room
	// overflowed ("burst of 40 over 4 replicas, room for 2251799813685246"). --headroom-mb
	// is bounded by --host-mb: more headroom than memory printed a negative room.
	maxSimHostMiB = 1 << 30
	// maxSimLifetimeSigma is a lognormal σ of 10 for lifetimes: one σ is then a factor of
	// 22,000 about the median, already past any measured fleet (about 1–3). Far above it
	// (1e300) every draw is 0 or +Inf, which the run printed as guests living 1 s.
	maxSimLifetimeSigma = 10
	// maxSimSpanSeconds is 100 years of Poisson arrivals on average (--creates ÷ --rate): past
	// 292 years a run's clock (int64 ns) overflows, and `--rate 1e-300` put every create before
	// the run's start.
	maxSimSpanSeconds = 100 * 365 * 86400
)

// newSimCmd is `berth sim` (SIM-1): a discrete-event simulation of a fleet through Berth's own
// admission, placement, ledger and evacuation code, comparing policies side by side.
func newSimCmd() *cobra.Command {
	o := defaultSimFlags()
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate a fleet with Berth's own admission, placement and ledger code, policies side by side (SIM-1)",
		Long: `berth sim runs a deterministic discrete-event simulation of a fleet: agents heartbeat the
admission verdict of their books every --heartbeat, scheduler replicas pick over caches refreshed
every --refresh, reservations live in a shared or per-replica ledger, guests' resident memory
follows a workload, and refused creates retry like the SDK. It calls the same admission and
placement functions the server and agents run (ADM-6). Same --seed, same output.

Workloads: idle (Poisson arrivals at --rate, lognormal lifetimes, guests touching --touch-mb and
growing by --growth-frac, a --spike-prob share spiking to --spike-frac of their size) or
alibaba (the Alibaba openb pod list, each pod's resident memory following one of the measured
GenAI memory-utilisation series; a compact copy is built into this binary, --trace-dir reads the
original CSVs instead).

Policies (--policies, comma-separated): an admission mode (committed, working-set, none) with
options :spread|:pack (placement), :shared|:per-replica (ledger), :gate|:nogate (pressure gate
and ADM-9 eviction, on by default), :trust (agents' local gate off), and for working-set the
reserve's knobs (ADM-4) :reserve=F (share of the configured size charged until a measurement,
in (0, 1], default 0.25) and :floor=MiB (≥ 0, default 512): an unmeasured stateless guest is
charged min(configured, max(ceil(configured × F), floor)). The spec is the policy's name in
the summary and the CSV.
Example: --policies committed,working-set,working-set:pack,working-set:per-replica,working-set:nogate
Example: --policies working-set,working-set:reserve=0.1:floor=256,working-set:reserve=0.5:floor=1024

Output: a summary per policy (sandboxes per host, refusals by code and host reason, kernel OOM
kills, evictions, p50/p99 seconds from first refusal to success, evacuation saved %), the
ledger burst (--burst), CSV (--csv) and PNG plots of density and refusals (--plots).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSim(cmd, o) },
	}
	f := cmd.Flags()
	s, w := &o.scen, &o.idle
	f.IntVar(&s.Hosts, "hosts", s.Hosts, "hosts")
	f.Int64Var(&s.HostMiB, "host-mb", s.HostMiB, "memory per host, MiB")
	f.Int64Var(&s.HeadroomMiB, "headroom-mb", s.HeadroomMiB, "headroom per host, MiB")
	f.IntVar(&s.Replicas, "replicas", s.Replicas, "scheduler replicas (the fleet run and the ledger burst)")
	f.Uint64Var(&s.Seed, "seed", s.Seed, "random seed (same seed, same output)")
	f.StringVar(&o.policies, "policies", o.policies, "policies to compare, comma-separated (see above)")
	f.StringVar(&o.workload, "workload", o.workload, "idle or alibaba")
	f.IntVar(&w.Creates, "creates", w.Creates, "idle workload: creates")
	f.Int64Var(&w.MemoryMiB, "guest-mb", w.MemoryMiB, "idle workload: configured memory per guest, MiB")
	f.Int64Var(&w.TouchMiB, "touch-mb", w.TouchMiB, "idle workload: memory a guest touches once started, MiB")
	f.Float64Var(&w.TouchJitter, "touch-jitter", w.TouchJitter, "idle workload: ± share of --touch-mb per guest")
	f.Float64Var(&w.RatePerSec, "rate", w.RatePerSec, "idle workload: Poisson arrivals per second (0: one create every 11 s per host)")
	f.DurationVar(&w.LifetimeMedian, "lifetime", w.LifetimeMedian, "idle workload: median lifetime, lognormal (0: guests live to the end)")
	f.Float64Var(&w.LifetimeSigma, "lifetime-sigma", w.LifetimeSigma, "idle workload: lognormal σ of lifetimes")
	f.Float64Var(&w.GrowthFrac, "growth-frac", w.GrowthFrac, "idle workload: touched memory grows by this share of the configured size…")
	f.DurationVar(&w.GrowthOver, "growth-over", w.GrowthOver, "idle workload: …over this long, in 4 steps")
	f.Float64Var(&w.SpikeProb, "spike-prob", w.SpikeProb, "idle workload: share of guests that spike once")
	f.Float64Var(&w.SpikeFrac, "spike-frac", w.SpikeFrac, "idle workload: a spike's resident as a share of the configured size")
	f.DurationVar(&w.SpikeFor, "spike-for", w.SpikeFor, "idle workload: how long a spike lasts")
	f.Float64Var(&w.StatefulFrac, "stateful-frac", w.StatefulFrac, "idle workload: share of stateful guests (charged in full, never evicted)")
	f.Float64Var(&w.ReconstructibleFrac, "reconstructible-frac", w.ReconstructibleFrac, "share of guests an evacuation recreates from their template")
	f.StringVar(&o.traceDir, "trace-dir", o.traceDir, "alibaba workload: read the original CSVs "+alibabaPodList+" and "+alibabaUtil+
		" from this directory (Alibaba Cluster Trace Program, github.com/alibaba/clusterdata) instead of the copy built into this binary")
	f.DurationVar(&o.traceStep, "trace-step", o.traceStep, "alibaba workload: one utilisation sample per this much time")
	f.DurationVar(&s.Heartbeat, "heartbeat", s.Heartbeat, "agent heartbeat period (AGT-1)")
	f.DurationVar(&s.RefreshEvery, "refresh", s.RefreshEvery, "replica cache refresh period (PLC-5 allows up to 30s)")
	f.DurationVar(&s.CordonDelay, "cordon-delay", s.CordonDelay, "time for a cordon to reach every replica (negative: only at the next refresh)")
	f.Float64Var(&s.PressureKnee, "pressure-knee", 0.9, "share of host memory in use where modelled memory pressure (PSI) starts, rising to 100 % at a full host")
	f.BoolVar(&o.retry, "retry", o.retry, "refused creates retry like the SDK until its 90 s deadline (SDK-1)")
	f.BoolVar(&o.retryAfter, "retry-after", o.retryAfter, "the SDK honours the server's Retry-After estimate (false: full jitter, base 0.25 s, cap 8 s)")
	f.Float64Var(&s.Failures.LossPerHostHour, "loss-rate", s.Failures.LossPerHostHour, "host losses per host per hour")
	f.Float64Var(&s.Failures.NoticeFrac, "notice-frac", s.Failures.NoticeFrac, "share of host losses that come with a preemption notice")
	f.DurationSliceVar(&s.Failures.Notices, "notices", s.Failures.Notices, "notice windows, taken in turn")
	f.Float64Var(&s.Failures.LinkMiBps, "link-mbps", s.Failures.LinkMiBps, "host link rate for evacuation, MiB/s")
	f.BoolVar(&s.Failures.CanSnapshot, "can-snapshot", s.Failures.CanSnapshot, "the runtime can snapshot guests (SPOT-4)")
	f.BoolVar(&o.burst, "burst", o.burst, "also run the ledger burst: shared vs per-replica ledgers (LED-1)")
	f.StringVar(&o.csvPath, "csv", "", "write the summary as CSV to this file")
	f.StringVar(&o.plotsDir, "plots", "", "write density.png and refusals.png to this directory")
	return cmd
}

func runSim(cmd *cobra.Command, o simFlags) error {
	s := o.scen
	if s.Hosts < 1 || s.Hosts > 100000 || o.idle.Creates < 0 || o.idle.Creates > 10_000_000 || s.HostMiB <= 0 ||
		o.idle.MemoryMiB <= 0 || s.HeadroomMiB < 0 || s.Replicas < 1 || s.Replicas > 64 {
		return berth.Errorf(berth.EInvalidRequest, "need 1–100000 hosts, ≤ 10M creates, 1–64 replicas and positive sizes")
	}
	if err := checkUpTo(upTo{"--host-mb", float64(s.HostMiB), maxSimHostMiB, "MiB"},
		upTo{"--headroom-mb", float64(s.HeadroomMiB), float64(s.HostMiB), "MiB (--host-mb)"},
		upTo{"--lifetime-sigma", o.idle.LifetimeSigma, maxSimLifetimeSigma, ""}); err != nil {
		return err
	}
	for _, x := range []float64{o.idle.TouchJitter, o.idle.GrowthFrac, o.idle.SpikeProb, o.idle.SpikeFrac,
		o.idle.StatefulFrac, o.idle.ReconstructibleFrac, s.Failures.NoticeFrac} {
		if x < 0 || x > 1 {
			return berth.Errorf(berth.EInvalidRequest, "shares and fractions must lie in [0, 1]")
		}
	}
	if o.idle.RatePerSec < 0 || s.Failures.LossPerHostHour < 0 || s.Failures.LinkMiBps < 0 || o.idle.LifetimeSigma < 0 {
		return berth.Errorf(berth.EInvalidRequest, "rates and σ must be non-negative")
	}
	if r := o.idle.RatePerSec; r > 0 && float64(o.idle.Creates)/r > maxSimSpanSeconds {
		return berth.Errorf(berth.EInvalidRequest, "--rate %s: want --creates ÷ --rate at most %s s (100 years), not %s s",
			number(r), number(maxSimSpanSeconds), number(float64(o.idle.Creates)/r))
	}
	if !(s.PressureKnee > 0 && s.PressureKnee < 1) { // the engine would quietly take 0.9 instead
		return berth.Errorf(berth.EInvalidRequest, "--pressure-knee must lie in (0, 1): a share of host memory")
	}
	policies, err := sim.ParsePolicies(o.policies)
	if err != nil {
		return err
	}
	if o.csvPath != "" { // before the run, not after it: the run may take minutes
		if err := checkOutputFile(o.csvPath); err != nil {
			return berth.Errorf(berth.EInvalidRequest, "--csv %s: %v; nothing was simulated", o.csvPath, err)
		}
	}
	if o.plotsDir != "" {
		if err := checkOutputDir(o.plotsDir); err != nil {
			return berth.Errorf(berth.EInvalidRequest, "--plots %s: %v; nothing was simulated", o.plotsDir, err)
		}
	}
	s.Retry, s.RetryAfter = o.retry, o.retryAfter
	var newWorkload func() sim.Workload
	switch o.workload {
	case "idle":
		m := o.idle
		m.Seed = s.Seed
		if m.RatePerSec == 0 {
			m.Interval = max((11*time.Second)/time.Duration(s.Hosts), time.Microsecond)
		}
		newWorkload = func() sim.Workload { return sim.NewIdle(m) }
	case "alibaba":
		pods, util, err := loadAlibaba(o.traceDir)
		if err != nil {
			return err
		}
		tw := sim.TraceWorkload{Pods: pods, Util: util, Step: o.traceStep, ReconstructibleFrac: o.idle.ReconstructibleFrac, Seed: s.Seed}
		newWorkload = func() sim.Workload { return sim.NewTrace(tw) }
	default:
		return berth.Errorf(berth.EInvalidRequest, "--workload must be idle or alibaba")
	}

	start := time.Now()
	reports := sim.Compare(s, policies, newWorkload)
	fmt.Fprintf(cmd.ErrOrStderr(), "simulated %d policies in %s (wall clock)\n", len(policies), time.Since(start).Round(time.Millisecond))
	out := cmd.OutOrStdout()
	if err := sim.WriteTable(out, reports); err != nil {
		return err
	}
	if o.burst {
		room := (s.HostMiB - s.HeadroomMiB) / o.idle.MemoryMiB * o.idle.MemoryMiB
		creates := int(min(max(10, 2*room/o.idle.MemoryMiB), 10000)) * s.Replicas
		br := sim.BurstReports(sim.BurstConfig{Replicas: s.Replicas, AdmittableMiB: room, Mode: berth.AdmissionCommitted,
			GuestMiB: o.idle.MemoryMiB, Creates: creates})
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "\nLEDGER (burst of %d over %d replicas, room for %d)\tADMITTED\tOVER_GRANTS\tOOM_KILLS\n",
			creates, s.Replicas, room/o.idle.MemoryMiB)
		for _, r := range br {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", r.Policy, r.Admitted, r.OverGrants, r.OOMKills)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if o.csvPath != "" {
		f, err := os.Create(o.csvPath)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		err = sim.WriteCSV(f, reports)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("sim: %s: %w", o.csvPath, err)
		}
	}
	if o.plotsDir != "" {
		files, err := sim.WritePlots(o.plotsDir, reports)
		if err != nil {
			return err
		}
		for _, f := range files {
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", f)
		}
	}
	return nil
}

// checkOutputFile says why a file cannot be created or replaced at path, or returns nil,
// without touching it: path must not be a directory, an existing file must be writable,
// and a new one needs its directory to exist and take new files (access(2), so a
// read-only file system counts; root passes any permission bits, as it does when writing).
func checkOutputFile(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return errors.New("is a directory; want a file path")
	case err == nil:
		if err := unix.Access(path, unix.W_OK); err != nil {
			return fmt.Errorf("cannot be written: %w", err)
		}
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return statProblem(err)
	}
	return writableDir(filepath.Dir(path), false)
}

// checkOutputDir says why files cannot be written into dir, or returns nil, without creating
// anything: an existing dir must be a directory that takes new files; a missing one (it is
// created with its parents when written, as sim.WritePlots does) needs its nearest existing
// ancestor to be one.
func checkOutputDir(dir string) error { return writableDir(dir, true) }

// writableDir checks that dir is a directory in which files can be created; with missingOK, a
// dir that does not exist is checked through its nearest existing ancestor.
func writableDir(dir string, missingOK bool) error {
	d := filepath.Clean(dir)
	for {
		fi, err := os.Stat(d)
		switch {
		case err == nil && !fi.IsDir():
			return fmt.Errorf("%s is not a directory", d)
		case err == nil:
			if err := unix.Access(d, unix.W_OK|unix.X_OK); err != nil {
				return fmt.Errorf("cannot create files in %s: %w", d, err)
			}
			return nil
		case !errors.Is(err, fs.ErrNotExist):
			return statProblem(err)
		case !missingOK:
			return fmt.Errorf("directory %s does not exist (create it first)", d)
		}
		parent := filepath.Dir(d)
		if parent == d {
			return fmt.Errorf("%s does not exist", d)
		}
		d = parent
	}
}

// statProblem words an error of os.Stat other than "does not exist" for a person.
func statProblem(err error) error {
	if errors.Is(err, syscall.ENOTDIR) {
		return errors.New("a part of the path is a file, not a directory")
	}
	return errors.New(pathProblem(err))
}

// The original Alibaba CSVs --trace-dir reads (docs/PERFORMANCE.md; sim/traces/README.md).
const (
	alibabaPodList = "alibaba-2023-openb-pod-list.csv"
	alibabaUtil    = "alibaba-2026-genai-pod-memory-util.csv.gz"
)

// loadAlibaba returns the Alibaba workload: the copy built into the binary when dir is "",
// else the original CSVs in dir. A missing or unreadable file is an invalid_request naming
// it and the way out.
func loadAlibaba(dir string) ([]sim.Pod, [][]float64, error) {
	if dir == "" {
		return sim.Alibaba()
	}
	hint := " (--trace-dir wants the directory holding " + alibabaPodList + " and " + alibabaUtil +
		" from github.com/alibaba/clusterdata; leave it out to use the copy built into berth)"
	pods, _, err := sim.LoadPods(filepath.Join(dir, alibabaPodList))
	if err != nil {
		return nil, nil, berth.Errorf(berth.EInvalidRequest, "pod list: %v%s", err, hint)
	}
	util, err := sim.LoadUtil(filepath.Join(dir, alibabaUtil))
	if err != nil {
		return nil, nil, berth.Errorf(berth.EInvalidRequest, "utilisation series: %v%s", err, hint)
	}
	return pods, util, nil
}
