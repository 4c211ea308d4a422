package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/internal/tlsconf"
	"github.com/berth-dev/berth/server"
	"github.com/berth-dev/berth/store/sqlite"
	"github.com/spf13/cobra"
	"gocloud.dev/blob"
)

// devConfig is `berth dev`'s configuration (SPEC §13 pins the first seven flags).
type devConfig struct {
	Listen            string
	Data              string
	Agents            int
	AgentMemoryMiB    int64
	HeadroomMiB       int64
	Admission         string
	HeartbeatInterval time.Duration
	StaleAfter        time.Duration
	ReservationTTL    time.Duration
	DrainDeadline     time.Duration
	EvictFloorMiB     int64
	Runtime           runtimeFlags
	AppsDomain        string
	// AppWakeTimeout and AppStartTimeout are --app-wake-timeout and --app-start-timeout, as on
	// `berth server` (0: the server's default).
	AppWakeTimeout, AppStartTimeout time.Duration
	// Bounds is the server listener's bounds (issue 15): timeouts, connection cap, and
	// each tenant's request rate (TenantRate per second, bursts of TenantBurst; 0 = none).
	Bounds serverBounds
	// Retention is --retention (0: keep forever; issue 15, point 5).
	Retention time.Duration
	Logger    *slog.Logger
	// agentHook, for tests, adjusts agent i's config (0-based) before it starts, e.g. to
	// watch a loopback metadata server for notices.
	agentHook func(i int, c *agent.Config)
	// serverHook, for tests, adjusts the server's config before it starts.
	serverHook func(c *server.Config)
	// lockHook, for tests, runs just before the data directory is locked: what another
	// stack writes there while this one starts.
	lockHook func()
	// dataWatchEvery is how often the running stack checks that --data still names the
	// directory it locked (0: every 2 s).
	dataWatchEvery time.Duration

	// WarmPool is each agent's --warm-pool (issue 16, goal 5; default none).
	WarmPool []agent.WarmPoolEntry
}

func defaultDevConfig() devConfig {
	return devConfig{
		Listen:            "127.0.0.1:7070",
		Data:              defaultDataDir(),
		Agents:            2,
		AgentMemoryMiB:    4096,
		HeadroomMiB:       256,
		Admission:         berth.AdmissionWorkingSet,
		HeartbeatInterval: 2 * time.Second,
		StaleAfter:        30 * time.Second,
		ReservationTTL:    60 * time.Second,
		Runtime:           defaultRuntimeFlags(),
		Bounds:            defaultServerBounds(),
		Retention:         defaultRetention,
		AppWakeTimeout:    server.DefaultConfig().AppWakeTimeout,
		AppStartTimeout:   server.DefaultConfig().AppStartTimeout,
	}
}

func newDevCmd() *cobra.Command {
	cfg := defaultDevConfig()
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a server and N agents in one process on SQLite (gVisor sandboxes where runsc is installed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Logger = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil))
			st, err := startDev(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			try := os.Args[0]
			if cfg.Listen != defaultDevConfig().Listen {
				try += " --url " + st.URL // the CLI's default URL is not this server
			}
			if cfg.Data != defaultDevConfig().Data {
				try += " --key-file " + filepath.Join(cfg.Data, "admin.key")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Berth dev is up at %s\n  admin key: %s\n  agents: %d × %d MiB (%s admission)\n  sandboxes: %s\n  try: %s sandbox create python\n",
				st.URL, filepath.Join(cfg.Data, "admin.key"), cfg.Agents, cfg.AgentMemoryMiB, cfg.Admission, st.Runtime, try)
			var lost error
			select {
			case <-cmd.Context().Done():
			case lost = <-st.DataLost():
				cfg.Logger.Error("berth dev stopping", "err", lost)
			}
			cfg.Logger.Info("berth dev stopping: agents stop every sandbox they run")
			err = st.Close()
			cfg.Logger.Info("berth dev stopped")
			return errors.Join(lost, err)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "server address")
	f.StringVar(&cfg.Data, "data", cfg.Data, "directory for the SQLite store, admin.key and sandboxes")
	f.IntVar(&cfg.Agents, "agents", cfg.Agents, "number of in-process agents")
	f.Int64Var(&cfg.AgentMemoryMiB, "agent-memory-mb", cfg.AgentMemoryMiB, "memory budget of each agent, MiB")
	f.Int64Var(&cfg.HeadroomMiB, "headroom-mb", cfg.HeadroomMiB, "memory each agent keeps back, MiB")
	f.StringVar(&cfg.Admission, "admission", cfg.Admission, "memory admission: committed, working-set or none (ADM-1)")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "agent heartbeat period")
	f.DurationVar(&cfg.StaleAfter, "stale-after", cfg.StaleAfter, "heartbeat age after which an agent gets no placements (PLC-1)")
	f.DurationVar(&cfg.ReservationTTL, "reservation-ttl", cfg.ReservationTTL, "ledger entry and reserve TTL (ADM-5, LED-2)")
	registerRetention(f, &cfg.Retention)
	cfg.Runtime.register(f)
	cfg.Bounds.register(f)
	registerAppFlags(f, &cfg.AppsDomain, &cfg.AppWakeTimeout, &cfg.AppStartTimeout)
	f.Int64Var(&cfg.EvictFloorMiB, "evict-floor-mb", 0, "evict stateless sandboxes when an agent's available memory stays under this, MiB (ADM-9; default 5 % of its budget)")
	registerWarmPool(f, &cfg.WarmPool)
	return cmd
}

// devStack is a running `berth dev`: the server, its store and its agents.
type devStack struct {
	URL      string
	AdminKey string
	dataDir  string // the absolute --data directory
	Runtime  string // which sandbox runtime the agents run, and why, for a person
	Store    berth.Store
	Agents   []*agent.Agent

	agentStop []context.CancelFunc
	agentDone []chan struct{}
	runtimes  []func() error // each agent's runtime's Close
	stop      context.CancelFunc
	snapshots *blob.Bucket
	httpSrv   *http.Server
	wg        sync.WaitGroup
	dataLock  *os.File   // the --data directory, flocked while the stack runs
	dataLost  chan error // gets one error if --data stops naming the locked directory
	closeOnce sync.Once
	closeErr  error
}

// startDev boots the dev stack and returns once the server listens and every agent has
// sent its first heartbeat. Close stops it and every sandbox it started.
//
// A start that fails leaves the data directory as it found it (issue 13: a start on a busy
// port wrote a fresh admin.key that the CLI then sent to whatever owned the port). What can
// fail without writing is checked first: the flags, the runtime choice, the data directory
// and the --listen address, which is bound here and kept. The runtimes, whose checks (root,
// runsc, isolation) are the likeliest failure of a first start, open before the store; a
// failure after something was written removes what this start created in the data
// directory; admin.key is written last, once every agent heartbeated, and an existing key
// is read, never rewritten.
func startDev(ctx context.Context, cfg devConfig) (_ *devStack, err error) {
	if cfg.Agents < 1 || cfg.Agents > 64 {
		return nil, berth.Errorf(berth.EInvalidRequest, "--agents must be 1..64")
	}
	if err := (server.Config{ReservationTTL: cfg.ReservationTTL, HeartbeatInterval: cfg.HeartbeatInterval, StaleAfter: cfg.StaleAfter}).Validate(); err != nil {
		return nil, err // C31
	}
	if err := checkRetention(cfg.Retention); err != nil {
		return nil, err
	}
	if err := cfg.Bounds.check(); err != nil {
		return nil, err
	}
	if !admission.ValidMode(cfg.Admission) {
		return nil, berth.Errorf(berth.EInvalidRequest, "--admission must be %s, %s or %s, not %q",
			berth.AdmissionCommitted, berth.AdmissionWorkingSet, berth.AdmissionNone, cfg.Admission)
	}
	if _, _, err := cfg.Runtime.pick(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	data, err := filepath.Abs(cfg.Data)
	if err != nil {
		return nil, err
	}
	if err := checkListen(cfg.Listen, data); err != nil {
		return nil, err
	}
	undo, err := noteDir(data)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, listenError(cfg.Listen, data, err)
	}

	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &devStack{stop: cancel, dataDir: data, URL: "http://" + ln.Addr().String()}
	inUse := false // another berth dev holds data: a failed start must not touch it
	defer func() {
		if err == nil {
			return
		}
		if s.httpSrv == nil {
			_ = ln.Close()
		}
		lock := s.dataLock // released after the undo, so no other start runs on what it removes
		s.dataLock = nil
		defer func() {
			if lock != nil {
				lock.Close()
			}
		}()
		if cerr := s.Close(); cerr != nil { // something may still run in there: leave it
			cfg.Logger.Warn("berth dev: start failed and did not stop cleanly; its files stay in "+data, "err", cerr)
			return
		}
		if inUse {
			return // what appeared there since noteDir is the running stack's, not this start's
		}
		if uerr := undo.undo(); uerr != nil {
			cfg.Logger.Warn("berth dev: start failed; could not remove what it created in "+data, "err", uerr)
		}
	}()
	if err := os.MkdirAll(data, 0o700); err != nil {
		return s, fmt.Errorf("data dir: %w", err)
	}
	if cfg.lockHook != nil {
		cfg.lockHook()
	}
	if s.dataLock, err = lockDevData(data); err != nil {
		inUse = berth.ErrorCode(err) == berth.EInvalidRequest
		return s, err
	}

	// The runtime scopes its cgroups by its directory, so two dev stacks never share (or
	// clean up) each other's sandboxes, while a restart of the same stack finds its leftovers.
	rts := make([]agent.Runtime, cfg.Agents)
	for i := range rts {
		id := devAgentID(i)
		rt, closeRT, about, err := cfg.Runtime.open(filepath.Join(data, "agents", id), cfg.Logger.With("agent", id))
		if err != nil {
			return s, fmt.Errorf("runtime for %s: %w", id, err)
		}
		rts[i] = rt
		s.runtimes = append(s.runtimes, closeRT)
		s.Runtime = about
	}

	st, err := sqlite.Open(ctx, filepath.Join(data, "berth.db"))
	if err != nil {
		return s, fmt.Errorf("open store: %w", err)
	}
	s.Store = st
	if err := checkDevAgentsAdmitted(ctx, st, cfg.Agents); err != nil {
		return s, err
	}
	if err := seedTemplates(ctx, st); err != nil {
		return s, err
	}
	keyPath := filepath.Join(data, "admin.key")
	secret, fresh, err := loadAdminKey(keyPath)
	if err != nil {
		return s, err
	}
	if err := registerAdminKey(ctx, st, secret); err != nil {
		return s, err
	}
	s.AdminKey = secret

	// One snapshot store for every agent: a guest paused on one resumes on another (PAUSE-1).
	snapshots, err := openSnapshotStore(ctx, "file://"+filepath.Join(data, "snapshots"))
	if err != nil {
		return s, err
	}
	s.snapshots = snapshots

	nodeToken := server.NewKeySecret()
	scfg := server.DefaultConfig()
	scfg.NodeToken = nodeToken
	scfg.StaleAfter = cfg.StaleAfter
	scfg.HeartbeatInterval = cfg.HeartbeatInterval
	scfg.ReservationTTL = cfg.ReservationTTL
	scfg.DrainDeadline = cfg.DrainDeadline
	scfg.AppsDomain, scfg.AppWakeTimeout, scfg.AppStartTimeout = cfg.AppsDomain, cfg.AppWakeTimeout, cfg.AppStartTimeout
	scfg.Snapshots = snapshots
	scfg.Logger = cfg.Logger
	cfg.Bounds.server(&scfg)
	scfg.Retention = retentionConfig(cfg.Retention)
	if cfg.serverHook != nil {
		cfg.serverHook(&scfg)
	}
	srv := server.New(scfg, st)
	var bounded net.Listener
	s.httpSrv, bounded = cfg.Bounds.Limits.Serve(ln, srv.Handler(), srv.LongLived)
	s.wg.Add(2)
	tlsconf.WarnPlaintext(cfg.Logger, nil, ln.Addr(), "the API")
	go func() { defer s.wg.Done(); _ = tlsconf.Serve(s.httpSrv, bounded, nil, cfg.Logger) }()
	go func() { defer s.wg.Done(); _ = srv.Run(ctx) }()

	agentsFrom := time.Now()
	for i, rt := range rts {
		id := devAgentID(i)
		acfg := agent.DefaultConfig()
		acfg.ID = id
		acfg.Admission = cfg.Admission
		acfg.MemoryMiB = cfg.AgentMemoryMiB
		acfg.HeadroomMiB = cfg.HeadroomMiB
		acfg.HeartbeatInterval = cfg.HeartbeatInterval
		acfg.MeasureInterval = min(time.Second, cfg.HeartbeatInterval)
		acfg.ReserveTTL = cfg.ReservationTTL
		acfg.VolumeDir = filepath.Join(data, "volumes", id) // beside, never under, the sandboxes' directory
		acfg.EvictFloorMiB = cfg.EvictFloorMiB
		acfg.WarmPool = cfg.WarmPool
		acfg.ExecInflightMiB = agentExecInflight(cfg.Bounds.ExecInflightMiB)
		acfg.SnapshotStore = snapshots
		acfg.SnapshotDir = filepath.Join(data, "cache", id, "snapshots") // a cache: rebuildable (POOL-4)
		acfg.ServerURL = s.URL
		acfg.NodeToken = nodeToken
		acfg.Logger = cfg.Logger
		if cfg.agentHook != nil {
			cfg.agentHook(i, &acfg)
		}
		a, err := agent.New(acfg, rt)
		if err != nil {
			return s, err
		}
		actx, astop := context.WithCancel(ctx)
		done := make(chan struct{})
		s.Agents = append(s.Agents, a)
		s.agentStop = append(s.agentStop, astop)
		s.agentDone = append(s.agentDone, done)
		go func() { defer close(done); _ = a.Run(actx) }()
	}
	if err := s.waitAgents(ctx, cfg.Agents, agentsFrom); err != nil {
		return s, err
	}
	if fresh { // last: a start that failed leaves no key for the CLI to send anywhere
		if err := os.WriteFile(keyPath, []byte(secret+"\n"), 0o600); err != nil {
			return s, fmt.Errorf("write admin key: %w", err)
		}
	}
	s.dataLost = make(chan error, 1)
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.watchData(ctx, cmp.Or(cfg.dataWatchEvery, 2*time.Second)) }()
	return s, nil
}

// DataLost delivers one error if the --data path stops naming the directory this stack
// locked — moved or removed while it runs. The lock is on the directory itself, so a second
// berth dev on the old path would start, share the agents' cgroup names and credentials and
// open its own store there (found by an attack: `mv` of a running stack's --data); the
// running stack stops instead (`berth dev` exits 1).
func (s *devStack) DataLost() <-chan error { return s.dataLost }

// watchData checks every interval, until ctx ends, that s.dataDir is still the locked
// directory, and reports on dataLost once when it is not.
func (s *devStack) watchData(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		locked, lerr := s.dataLock.Stat()
		now, err := os.Stat(s.dataDir)
		if lerr == nil && (err != nil || !os.SameFile(locked, now)) {
			s.dataLost <- fmt.Errorf("the data directory %s was moved or removed while berth dev ran; it stops, so no other berth dev shares its sandboxes", s.dataDir)
			return
		}
	}
}

// checkListen refuses, before anything is written, a --listen addr no bind can take
// (listenAddrProblem): invalid_request (exit 2) with net's reason and the form wanted.
// `berth dev` and `berth server` share it.
func checkListen(addr, data string) error {
	if err := listenAddrProblem(addr); err != nil {
		return berth.Errorf(berth.EInvalidRequest, "cannot listen on %s: %v; --listen wants HOST:PORT, e.g. 127.0.0.1:7070 (0.0.0.0:7070 for every interface); nothing was written to %s",
			addr, err, data)
	}
	return nil
}

// listenError says why --listen addr could not be bound, naming the address, and that the
// data directory was left alone; for a port in use, who may hold it. `berth dev` and `berth
// server` share it.
func listenError(addr, data string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err // "bind: address already in use", without repeating the address
	}
	hint := ""
	if errors.Is(err, syscall.EADDRINUSE) {
		hint = " (another process listens there, perhaps another berth dev or server: stop it or pick another address with --listen)"
	}
	return fmt.Errorf("cannot listen on %s: %w%s; nothing was written to %s", addr, err, hint, data)
}

// dirNote is what a directory held before a start, so a failed start can remove what it
// created there (and the directory, with any parents it made, when it did not exist).
type dirNote struct {
	dir     string // the directory, or the topmost missing ancestor when it did not exist
	existed bool
	before  map[string]bool // paths relative to dir, noteDepth levels deep
}

// noteDepth is how deep a note looks: data/agents/dev-agent-1/rootfs is level 3, deep
// enough for every directory a start makes, shallow enough never to walk sandboxes' files.
const noteDepth = 3

// noteDir notes what dir holds; it fails when dir exists and is not a readable directory.
func noteDir(dir string) (*dirNote, error) {
	n := &dirNote{dir: dir, before: map[string]bool{}}
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if _, err := os.Stat(dir); err != nil { // a dangling link: the undo would remove it
			return nil, fmt.Errorf("data dir %s is a symbolic link to what does not exist (%v): create its target or pick another --data; nothing was written", dir, err)
		}
	}
	if _, err := os.ReadDir(dir); errors.Is(err, os.ErrNotExist) {
		for parent := filepath.Dir(n.dir); parent != n.dir; parent = filepath.Dir(n.dir) {
			if _, err := os.Lstat(parent); err == nil {
				break
			}
			n.dir = parent
		}
		return n, nil
	} else if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	n.existed = true
	if err := n.walk("", 1, func(rel string, _ os.DirEntry) bool { n.before[rel] = true; return true }); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	return n, nil
}

// walk calls fn for each entry under rel, noteDepth levels deep, descending into the
// directories (never symlinks) for which fn returns true.
func (n *dirNote) walk(rel string, depth int, fn func(rel string, e os.DirEntry) bool) error {
	ents, err := os.ReadDir(filepath.Join(n.dir, rel))
	if err != nil {
		return err
	}
	for _, e := range ents {
		r := filepath.Join(rel, e.Name())
		if fn(r, e) && e.IsDir() && depth < noteDepth {
			if err := n.walk(r, depth+1, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// undo removes what appeared in the directory since noteDir (all of it when the start made
// the directory). It is called only once everything this start ran has stopped.
func (n *dirNote) undo() error {
	if !n.existed {
		return os.RemoveAll(n.dir)
	}
	var errs error
	werr := n.walk("", 1, func(rel string, _ os.DirEntry) bool {
		if n.before[rel] {
			return true
		}
		errs = errors.Join(errs, os.RemoveAll(filepath.Join(n.dir, rel)))
		return false
	})
	return errors.Join(werr, errs)
}

// waitAgents waits (bounded) until agents dev-agent-1..n have heartbeated since the time
// they were started: a row an earlier run left, seen a moment before a restart, does not
// count (it did, and a restart whose agent could not join passed this wait).
func (s *devStack) waitAgents(ctx context.Context, n int, since time.Time) error {
	since = since.Truncate(time.Millisecond) // the store keeps milliseconds
	want := map[string]bool{}
	for i := range n {
		want[devAgentID(i)] = true
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		as, err := s.Store.Agents(ctx)
		if err != nil {
			return err
		}
		seen := 0
		for _, a := range as {
			if want[a.AgentID] && !a.LastSeen.Before(since) {
				seen++
			}
		}
		if seen >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d agents heartbeated within 30 s", seen, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StopAgent ends agent i's Run as a shutdown does: its sandboxes stop (reported stopped on
// its last heartbeat) and its heartbeats end, so the server sees the host go stale. It waits
// until the agent is gone.
func (s *devStack) StopAgent(i int) {
	s.agentStop[i]()
	<-s.agentDone[i]
}

// Close stops the agents (and so every sandbox), the server and the store. It is idempotent.
func (s *devStack) Close() error {
	s.closeOnce.Do(func() {
		for i := range s.agentStop {
			s.StopAgent(i)
		}
		for _, closeRT := range s.runtimes {
			if err := closeRT(); err != nil {
				s.closeErr = errors.Join(s.closeErr, err)
			}
		}
		if s.snapshots != nil {
			s.closeErr = errors.Join(s.closeErr, s.snapshots.Close())
		}
		s.stop()
		if s.httpSrv != nil {
			shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.httpSrv.Shutdown(shut)
			cancel()
		}
		s.wg.Wait()
		if s.Store != nil {
			s.closeErr = errors.Join(s.closeErr, s.Store.Close())
		}
		if s.dataLock != nil {
			_ = s.dataLock.Close() // last: nothing of this stack runs on the directory now
		}
	})
	return s.closeErr
}

// lockDevData takes an exclusive flock on the --data directory itself (no file is written,
// so a start that fails leaves the directory as it was) and returns it open; closing it, or
// the process ending, releases the lock. A second berth dev on the same directory — which
// would remove the first's sandboxes as leftovers of an earlier run and fight it for its
// agents' credentials — is refused with invalid_request, as `berth agent` refuses a --dir in
// use (found by a new user).
func lockDevData(data string) (*os.File, error) {
	f, err := os.Open(data)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if busy, err := tryLock(f); err != nil {
		f.Close()
		if busy {
			return nil, berth.Errorf(berth.EInvalidRequest,
				"another berth dev runs with --data %s; stop it, or give this one its own --data", data)
		}
		return nil, fmt.Errorf("data dir: lock %s: %w", data, err)
	}
	return f, nil
}

// checkDevAgentsAdmitted refuses a start whose agents dev-agent-1..n include one an admin
// revoked (`berth agents revoke`): a revoked id stays out (TRUST-1), so that agent could never
// join and the start would serve for 30 s and then fail saying only that it did not
// heartbeat. Errors: forbidden, naming the agent and the ways on.
func checkDevAgentsAdmitted(ctx context.Context, st berth.AgentCredentialStore, n int) error {
	creds, err := st.AgentCredentials(ctx)
	if err != nil {
		return fmt.Errorf("read agent credentials: %w", err)
	}
	revoked := map[string]bool{} // as the store's join reads it: any credential an admin revoked
	for _, c := range creds {
		if c.RevokedBy == berth.RevokedByAdmin {
			revoked[c.AgentID] = true
		}
	}
	for i := range n {
		id := devAgentID(i)
		if revoked[id] {
			way := "start with a new --data directory"
			if i > 0 {
				way = fmt.Sprintf("start with --agents %d (the agents before it) or with a new --data directory", i)
			}
			return berth.Errorf(berth.EForbidden,
				"%s was revoked by an admin (berth agents revoke), and a revoked agent id stays out (TRUST-1): %s", id, way)
		}
	}
	return nil
}

// devAgentID is the id of dev's agent i (0-based): dev-agent-1, dev-agent-2…
func devAgentID(i int) string { return fmt.Sprintf("dev-agent-%d", i+1) }

// devTemplates are always present in dev (SPEC §13).
var devTemplates = []berth.Template{
	{Name: "python", MemoryMiB: 512, VCPUs: 1},
	{Name: "shell", MemoryMiB: 256, VCPUs: 1},
}

func seedTemplates(ctx context.Context, st berth.TemplateStore) error {
	for _, t := range devTemplates {
		if err := st.PutTemplate(ctx, t); err != nil {
			return fmt.Errorf("seed template %s: %w", t.Name, err)
		}
	}
	return nil
}

// ensureAdminKey returns the admin key kept in path, creating the key (and the "default"
// tenant it belongs to) on first run. Only the key's hash goes into the store.
func ensureAdminKey(ctx context.Context, st berth.TenantStore, path string) (string, error) {
	secret, fresh, err := loadAdminKey(path)
	if err != nil {
		return "", err
	}
	if fresh {
		if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("write admin key: %w", err)
		}
	}
	if err := registerAdminKey(ctx, st, secret); err != nil {
		return "", err
	}
	return secret, nil
}

// loadAdminKey returns the admin key kept in path, or a new one (fresh) when path is missing
// or empty. It writes nothing.
func loadAdminKey(path string) (secret string, fresh bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("read admin key: %w", err)
	}
	if secret = strings.TrimSpace(string(b)); secret != "" {
		return secret, false, nil
	}
	return server.NewKeySecret(), true, nil
}

// registerAdminKey makes sure the "default" tenant exists and holds secret as an admin key.
// Only the key's hash goes into the store.
func registerAdminKey(ctx context.Context, st berth.TenantStore, secret string) error {
	if _, err := st.PutTenant(ctx, berth.Tenant{Name: "default", CreatedAt: time.Now().UTC()}); err != nil {
		return fmt.Errorf("seed tenant: %w", err)
	}
	h := server.HashKey(secret)
	if _, err := st.APIKeyByHash(ctx, h); errors.Is(err, berth.ErrNotFound) {
		k := berth.APIKey{ID: "key-admin-" + h[:8], Tenant: "default", Role: berth.RoleAdmin, Hash: h, CreatedAt: time.Now().UTC()}
		if err := st.PutAPIKey(ctx, k); err != nil {
			return fmt.Errorf("store admin key: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("look up admin key: %w", err)
	}
	return nil
}
