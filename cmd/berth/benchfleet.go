package main

// `berth bench fleet` (issue 16, goals 1 and 4): one command that starts a whole control plane
// on loopback — server replicas over one store, agents on the no-op runtime — drives creates
// through it for a bounded time, and reports creates/s, the control-plane latency of a create
// (the no-op runtime starts nothing, so a create's latency is Berth's own overhead), the
// store round trips per create and, on PostgreSQL, pgbench's single-row insert rate on the
// same database for the ratio.

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/noop"
	"github.com/berth-dev/berth/internal/cpustat"
	"github.com/berth-dev/berth/server"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
)

// fleetConfig drives `berth bench fleet`.
type fleetConfig struct {
	Store     string // postgres://… on loopback; "" for a SQLite file in a temp directory
	Replicas  int
	Agents    int
	Heartbeat time.Duration
	Clients   int
	Duration  time.Duration
	PGBench   bool
	Log       *slog.Logger
	// SimAgents heartbeat every SimInterval beside the real agents (goal 2: heartbeat
	// ingest while creates run); they take no placements.
	SimAgents   int
	SimInterval time.Duration
	// CPUProfile, when set, is a file the creates' CPU profile of this process is written
	// to (go tool pprof reads it).
	CPUProfile string
}

// refusalList words refusals by code for a person: "no_capacity 3, transport 1", sorted by
// code, or "none".
func refusalList(byCode map[string]int) string {
	if len(byCode) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(byCode))
	for _, code := range slices.Sorted(maps.Keys(byCode)) {
		parts = append(parts, fmt.Sprintf("%s %d", code, byCode[code]))
	}
	return strings.Join(parts, ", ")
}

// fleetReport is what one `bench fleet` run measured.
type fleetReport struct {
	Cfg        fleetConfig
	Create     benchResult
	RoundTrips int64 // every replica's requests to the store during the creates
	PGBenchTPS float64
	// ReplayPerSec is pgbench replaying one create's SQL (createReplay): creates/s of the
	// store alone on these cores.
	ReplayPerSec float64
	PGBenchErr   error
	// The simulated agents' heartbeats during the creates: acknowledged, resyncs, failures,
	// and the agents that went longer than 30 s (StaleAfter) between two acks.
	SimAcked, SimResyncs, SimFailed int64
	SimStale                        int
	SimMaxGap                       time.Duration
	// Where the cores went during the creates: this process (replicas, agents, simulated
	// agents and the load generator) and PostgreSQL's postmaster tree, over Wall; PGCPUErr
	// says why PostgreSQL's is unknown (a SQLite run, or a server not visible here).
	SelfCPU, PGCPU, Wall time.Duration
	PGCPUErr             error
}

func newBenchFleetCmd() *cobra.Command {
	cfg := fleetConfig{Agents: 4, Heartbeat: time.Second, Clients: 32, Duration: 10 * time.Second, PGBench: true}
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Start replicas and no-op agents on loopback, drive creates for a bounded time; print creates/s, latency, round trips per create and pgbench's rates on the same database",
		Long: "Start R server replicas over one store (--store postgres://… on this machine: a throwaway database, it is written to;\n" +
			"default: SQLite in a temp directory, one replica) and N agents on the no-op runtime, all on 127.0.0.1, then drive\n" +
			"POST /v1/sandboxes with --clients clients for --duration (at most 10m) and report. The no-op runtime starts nothing,\n" +
			"so a create's latency is the control plane's own (issue 16, goal 4).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("replicas") {
				cfg.Replicas = 1
				if cfg.Store != "" {
					cfg.Replicas = 2
				}
			}
			cfg.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelError}))
			rep, err := runBenchFleet(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			rep.print(cmd.OutOrStdout())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Store, "store", "", "postgres:// URL of a throwaway database on this machine (default: SQLite in a temp directory)")
	f.IntVar(&cfg.Replicas, "replicas", 0, "server replicas (default 2 on PostgreSQL, 1 on SQLite, which allows only 1)")
	f.IntVar(&cfg.Agents, "agents", cfg.Agents, "no-op agents (1–1000)")
	f.DurationVar(&cfg.Heartbeat, "heartbeat-interval", cfg.Heartbeat, "the agents' heartbeat period")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long to send creates (at most 10m)")
	f.IntVar(&cfg.SimAgents, "sim-agents", 0, "simulated agents (0–20000) heartbeating beside the no-op ones, each holding 10 sandboxes (written to the store as running rows first) and sending deltas; they take no placements")
	f.DurationVar(&cfg.SimInterval, "sim-interval", 10*time.Second, "the simulated agents' heartbeat period")
	f.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of this process while the creates run to this file (go tool pprof)")
	f.BoolVar(&cfg.PGBench, "pgbench", cfg.PGBench, "on PostgreSQL, also run pgbench for --duration with --clients (when it is installed): a single-row insert, then a create's SQL replayed")
	return cmd
}

// check refuses a fleet that cannot run as asked, or that would leave loopback: an
// invalid_request (exit 2) naming the flag, before anything starts.
func (c fleetConfig) check() error {
	switch {
	case c.Replicas < 1 || c.Replicas > 16:
		return berth.Errorf(berth.EInvalidRequest, "--replicas must be 1–16")
	case c.Store == "" && c.Replicas > 1:
		return berth.Errorf(berth.EInvalidRequest, "SQLite serves one replica: give --store postgres://… for %d", c.Replicas)
	case c.Agents < 1 || c.Agents > 1000:
		return berth.Errorf(berth.EInvalidRequest, "--agents must be 1–1000")
	case c.Heartbeat <= 0:
		return berth.Errorf(berth.EInvalidRequest, "--heartbeat-interval must be positive")
	case c.SimAgents < 0 || c.SimAgents > 20000 || (c.SimAgents > 0 && c.SimInterval <= 0):
		return berth.Errorf(berth.EInvalidRequest, "--sim-agents must be 0–20000, with a positive --sim-interval")
	}
	if err := checkLoad(c.Clients, c.Duration); err != nil {
		return err
	}
	if c.Store != "" {
		u, err := url.Parse(c.Store)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return berth.Errorf(berth.EInvalidRequest, "--store must be a postgres:// URL")
		}
		host := u.Hostname()
		if ip := net.ParseIP(host); host != "" && host != "localhost" && (ip == nil || !ip.IsLoopback()) && !strings.HasPrefix(host, "/") {
			return berth.Errorf(berth.EInvalidRequest, "--store %s is not on this machine: bench fleet talks to loopback only", host)
		}
	}
	return nil
}

// runBenchFleet starts the fleet, runs the creates and pgbench, and stops everything it
// started before it returns (the store's rows stay: it is the caller's database).
func runBenchFleet(ctx context.Context, cfg fleetConfig) (fleetReport, error) {
	rep := fleetReport{Cfg: cfg}
	if err := cfg.check(); err != nil {
		return rep, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dir, err := os.MkdirTemp("", "berth-bench-fleet-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	spec := cmp.Or(cfg.Store, filepath.Join(dir, "berth.db"))
	ctx, stop := context.WithCancel(ctx)
	agentsCtx, stopAgents := context.WithCancel(ctx)
	var wg, agents sync.WaitGroup
	var servers []*http.Server // shut down before the wait: their Serve returns then
	var closers []func()       // after it: the stores
	defer func() {
		stopAgents() // first, while the replicas still take their last heartbeats
		agents.Wait()
		stop()
		// Shutdown, not Close: a handler still running (a heartbeat whose client gave up)
		// finishes before its store closes, instead of failing with "closed pool".
		shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, hs := range servers {
			if hs.Shutdown(shut) != nil {
				_ = hs.Close()
			}
		}
		wg.Wait()
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	seed, err := openStore(ctx, spec, dir)
	if err != nil {
		return rep, err
	}
	closers = append(closers, func() { seed.Close() })
	if err := seedTemplates(ctx, seed); err != nil {
		return rep, err
	}
	adminKey, err := ensureAdminKey(ctx, seed, filepath.Join(dir, "admin.key"))
	if err != nil {
		return rep, err
	}
	nodeToken := server.NewKeySecret()
	var urls []string
	var counters []interface{ RoundTrips() int64 }
	for i := range cfg.Replicas {
		st := seed
		if i > 0 {
			if st, err = openStore(ctx, spec, dir); err != nil {
				return rep, err
			}
			closers = append(closers, func() { st.Close() })
		}
		u, err := benchReplica(ctx, &wg, st, nodeToken, cfg, &servers)
		if err != nil {
			return rep, err
		}
		urls = append(urls, u)
		if c, ok := st.(interface{ RoundTrips() int64 }); ok {
			counters = append(counters, c)
		}
	}
	for i := range cfg.Agents {
		ac := agent.DefaultConfig()
		ac.ID, ac.MemoryMiB, ac.HeadroomMiB = fmt.Sprintf("bench-noop-%d", i+1), 1<<30, 0
		ac.HeartbeatInterval, ac.MaxStarts = cfg.Heartbeat, 1024
		ac.ServerURL, ac.NodeToken, ac.Logger = urls[i%len(urls)], nodeToken, cfg.Log
		a, err := agent.New(ac, &noop.Runtime{})
		if err != nil {
			return rep, err
		}
		agents.Go(func() { _ = a.Run(agentsCtx) })
	}
	if err := waitAgents(ctx, seed, cfg.Agents, 60*time.Second); err != nil {
		return rep, err
	}
	var sim simStats
	// The simulated agents stop once the creates are measured: the clean-up's deletes would
	// otherwise queue behind their heartbeats for the store's connections (at 10,000 agents
	// on 2 cores, over ten minutes of deletes).
	simCtx, stopSim := context.WithCancel(agentsCtx)
	defer stopSim()
	if cfg.SimAgents > 0 {
		if err := seedSimSandboxes(ctx, seed, cfg.SimAgents); err != nil {
			return rep, err
		}
		ready := make(chan struct{})
		agents.Go(func() { runSimAgents(simCtx, urls, nodeToken, cfg.SimAgents, cfg.SimInterval, &sim, ready) })
		select { // every simulated agent has heartbeated once: their whole lists are in
		case <-ready:
		case <-time.After(cfg.SimInterval + 2*time.Minute):
			return rep, fmt.Errorf("the simulated agents did not all heartbeat within %s", cfg.SimInterval+2*time.Minute)
		}
	}
	acked, resyncs, failed := sim.Acked.Load(), sim.Resyncs.Load(), sim.Failed.Load()
	trips := func() (n int64) {
		for _, c := range counters {
			n += c.RoundTrips()
		}
		return n
	}
	postmaster, err := postmasterOf(ctx, cfg.Store)
	rep.PGCPUErr = err
	pgCPU := func() time.Duration {
		if rep.PGCPUErr != nil {
			return 0
		}
		d, err := cpustat.Tree(postmaster)
		if err != nil {
			rep.PGCPUErr = err
		}
		return d
	}
	stopProfile, err := startCPUProfile(cfg.CPUProfile)
	if err != nil {
		return rep, err
	}
	defer stopProfile()
	before, self0, pg0, wall0 := trips(), cpustat.Self(), pgCPU(), time.Now()
	rep.Create, err = runBenchCreate(ctx, benchConfig{URLs: urls, Key: adminKey, Clients: cfg.Clients,
		Duration: cfg.Duration, MaxCreates: 10_000_000, Template: "shell", Cleanup: true,
		AfterCreates: func() {
			stopProfile()
			rep.SelfCPU, rep.PGCPU, rep.Wall = cpustat.Self()-self0, pgCPU()-pg0, time.Since(wall0)
			rep.RoundTrips = trips() - before
			rep.SimAcked, rep.SimResyncs, rep.SimFailed = sim.Acked.Load()-acked, sim.Resyncs.Load()-resyncs, sim.Failed.Load()-failed
			if cfg.SimAgents > 0 {
				rep.SimStale, rep.SimMaxGap = sim.staleAgents(30 * time.Second)
			}
			stopSim()
		}})
	if err != nil {
		return rep, err
	}
	if cfg.PGBench && cfg.Store != "" {
		rep.PGBenchTPS, rep.PGBenchErr = pgbenchInsertTPS(ctx, cfg.Store, cfg.Clients, cfg.Duration, dir)
		if rep.PGBenchErr == nil {
			rep.ReplayPerSec, rep.PGBenchErr = pgbenchCreatesPerSecond(ctx, cfg.Store, cfg.Agents, cfg.Clients, cfg.Duration, dir)
		}
	}
	return rep, nil
}

// startCPUProfile starts writing this process's CPU profile to path ("": nothing) and returns
// what stops it; calling that more than once stops it once.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}, nil
}

// postmasterOf is the process id of the PostgreSQL server behind db, when it runs on this
// machine and is visible here: the parent of the backend that serves a connection. Errors:
// SQLite (db empty), a failed connection, a backend not in this machine's /proc.
func postmasterOf(ctx context.Context, db string) (int, error) {
	if db == "" {
		return 0, errors.New("not PostgreSQL")
	}
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, err
	}
	ppid, comm, err := cpustat.Parent(backend)
	if err != nil {
		return 0, fmt.Errorf("the server's processes are not visible here: %w", err)
	}
	if !strings.HasPrefix(comm, "postgres") {
		return 0, fmt.Errorf("backend %d's parent %d is %q, not a postmaster", backend, ppid, comm)
	}
	return ppid, nil
}

// benchReplica serves one replica over st on 127.0.0.1:0 until ctx ends and returns its URL.
func benchReplica(ctx context.Context, wg *sync.WaitGroup, st berth.Store, nodeToken string, cfg fleetConfig, servers *[]*http.Server) (string, error) {
	scfg := server.DefaultConfig()
	scfg.NodeToken, scfg.Logger, scfg.HeartbeatInterval = nodeToken, cfg.Log, cfg.Heartbeat
	scfg.TenantRate = 0 // the bench is one tenant on purpose
	srv := server.New(scfg, st)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() { _ = hs.Serve(ln) })
	wg.Go(func() { _ = srv.Run(ctx) })
	*servers = append(*servers, hs)
	return "http://" + ln.Addr().String(), nil
}

// waitAgents waits (bounded) until n agents are in the store.
func waitAgents(ctx context.Context, st berth.Store, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		as, err := st.Agents(ctx)
		if err == nil && len(as) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d agents heartbeated within %s (last error: %v)", len(as), n, limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// createReplay is one create's SQL for pgbench (see the file): the store's ceiling on this
// machine, with a client that costs almost nothing.
//
//go:embed benchfleet_create.pgbench
var createReplay string

// pgbenchInsertTPS runs pgbench with a one-row INSERT script against db (into a table of its
// own, dropped after) and returns its TPS; an error when pgbench is not installed or fails.
func pgbenchInsertTPS(ctx context.Context, db string, clients int, dur time.Duration, dir string) (float64, error) {
	run := func(sql string) error {
		conn, err := pgx.Connect(ctx, db)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := run(`CREATE TABLE IF NOT EXISTS berth_bench_insert (id bigserial PRIMARY KEY, v bigint, at timestamptz DEFAULT now())`); err != nil {
		return 0, err
	}
	defer func() { _ = run(`DROP TABLE IF EXISTS berth_bench_insert`) }()
	return pgbenchTPS(ctx, db, "INSERT INTO berth_bench_insert (v) VALUES (1);\n", nil, clients, dur, dir)
}

// pgbenchCreatesPerSecond replays one create's SQL (createReplay) with pgbench against db,
// whose agents bench-noop-1…agents exist, and returns the creates per second; its rows stay in
// the throwaway database under the tenant "pgbench".
func pgbenchCreatesPerSecond(ctx context.Context, db string, agents, clients int, dur time.Duration, dir string) (float64, error) {
	return pgbenchTPS(ctx, db, createReplay, []string{"-M", "prepared", "-D", "agents=" + strconv.Itoa(agents)}, clients, dur, dir)
}

// pgbenchTPS runs pgbench's script with clients for dur (at least 1 s) against db and returns
// its transactions (runs of the script) per second; an error when pgbench is not installed or
// fails.
func pgbenchTPS(ctx context.Context, db, script string, args []string, clients int, dur time.Duration, dir string) (float64, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	bin := "pgbench"
	if len(bins) > 0 {
		bin = bins[len(bins)-1]
	} else if _, err := exec.LookPath(bin); err != nil {
		return 0, errors.New("pgbench is not installed")
	}
	f, err := os.CreateTemp(dir, "pgbench-*.sql")
	if err != nil {
		return 0, err
	}
	_, err = f.WriteString(script)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, dur+time.Minute)
	defer cancel()
	args = append(args, "-n", "-f", f.Name(), "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(max(1, int(dur.Seconds()))), db)
	out, err := exec.CommandContext(cctx, bin, args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %w: %s", err, out)
	}
	if m := regexp.MustCompile(`number of failed transactions: ([1-9][0-9]*)`).FindSubmatch(out); m != nil {
		return 0, fmt.Errorf("pgbench: %s transactions failed: %s", m[1], out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no tps in pgbench's output: %s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

func (r fleetReport) print(w io.Writer) {
	c := r.Create
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	store := "SQLite (temp)"
	if r.Cfg.Store != "" {
		store = "PostgreSQL"
	}
	fmt.Fprintf(tw, "fleet\t%d replica(s) on %s, %d no-op agents (heartbeat %s), %d clients\n", r.Cfg.Replicas, store, r.Cfg.Agents, r.Cfg.Heartbeat, r.Cfg.Clients)
	fmt.Fprintf(tw, "elapsed\t%s\n", c.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "created\t%d of %d attempts (refused: %s)\n", c.Created, c.Attempts, refusalList(c.ByCode))
	creates := float64(c.Created) / c.Elapsed.Seconds()
	fmt.Fprintf(tw, "creates/s\t%.0f\n", creates)
	fmt.Fprintf(tw, "control-plane latency p50 / p99\t%s / %s (no-op runtime: no start time)\n",
		pct(c.Latency, .5).Round(10*time.Microsecond), pct(c.Latency, .99).Round(10*time.Microsecond))
	if c.Attempts > 0 {
		fmt.Fprintf(tw, "store round trips per create\t%.1f (every replica's, heartbeats and sweeps included)\n", float64(r.RoundTrips)/float64(c.Attempts))
	}
	if r.Cfg.SimAgents > 0 {
		fmt.Fprintf(tw, "simulated agents\t%d, heartbeat every %s, 10 sandboxes each\n", r.Cfg.SimAgents, r.Cfg.SimInterval)
		fmt.Fprintf(tw, "heartbeats acknowledged/s\t%.0f of %.0f due (resyncs %d, failures %d)\n", float64(r.SimAcked)/c.Elapsed.Seconds(),
			float64(r.Cfg.SimAgents)/r.Cfg.SimInterval.Seconds(), r.SimResyncs, r.SimFailed)
		fmt.Fprintf(tw, "agents > 30 s between two acks\t%d (longest gap %s)\n", r.SimStale, r.SimMaxGap.Round(time.Millisecond))
	}
	if r.Wall > 0 && c.Attempts > 0 {
		perCreate := func(d time.Duration) string {
			return fmt.Sprintf("%.2f cores, %.2f ms per create", d.Seconds()/r.Wall.Seconds(), float64(d.Milliseconds())/float64(c.Attempts))
		}
		who := "replicas, agents, load generator"
		if r.Cfg.SimAgents > 0 {
			who += ", simulated agents"
		}
		fmt.Fprintf(tw, "CPU: this process\t%s (%s)\n", perCreate(r.SelfCPU), who)
		if r.PGCPUErr != nil {
			fmt.Fprintf(tw, "CPU: PostgreSQL\tunknown (%v)\n", r.PGCPUErr)
		} else {
			fmt.Fprintf(tw, "CPU: PostgreSQL\t%s (its postmaster and backends)\n", perCreate(r.PGCPU))
		}
	}
	switch {
	case r.PGBenchErr != nil:
		fmt.Fprintf(tw, "pgbench\t%v\n", r.PGBenchErr)
	case r.PGBenchTPS > 0:
		fmt.Fprintf(tw, "pgbench single-row insert TPS\t%.0f (creates/s ÷ TPS = %.3f)\n", r.PGBenchTPS, creates/r.PGBenchTPS)
		fmt.Fprintf(tw, "pgbench replaying a create's SQL\t%.0f creates/s, the store alone (creates/s ÷ it = %.2f)\n", r.ReplayPerSec, creates/r.ReplayPerSec)
	}
	_ = tw.Flush()
}
