package main

import (
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
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
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
	Logger            *slog.Logger
	// agentHook, for tests, adjusts agent i's config (0-based) before it starts, e.g. to
	// watch a loopback metadata server for notices.
	agentHook func(i int, c *agent.Config)
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
			<-cmd.Context().Done()
			cfg.Logger.Info("berth dev stopping: agents stop every sandbox they run")
			err = st.Close()
			cfg.Logger.Info("berth dev stopped")
			return err
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
	cfg.Runtime.register(f)
	f.StringVar(&cfg.AppsDomain, "apps-domain", "", "route requests for Host <app>.<domain> to the app (APP-1; /apps/<app>/ always works)")
	f.Int64Var(&cfg.EvictFloorMiB, "evict-floor-mb", 0, "evict stateless sandboxes when an agent's available memory stays under this, MiB (ADM-9; default 5 % of its budget)")
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
	closeOnce sync.Once
	closeErr  error
}

// startDev boots the dev stack and returns once the server listens and every agent has
// sent its first heartbeat. Close stops it and every sandbox it started.
func startDev(ctx context.Context, cfg devConfig) (_ *devStack, err error) {
	if cfg.Agents < 1 || cfg.Agents > 64 {
		return nil, berth.Errorf(berth.EInvalidRequest, "--agents must be 1..64")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Data, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	data, err := filepath.Abs(cfg.Data)
	if err != nil {
		return nil, err
	}
	st, err := sqlite.Open(ctx, filepath.Join(data, "berth.db"))
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &devStack{Store: st, stop: cancel, dataDir: data}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if err := seedTemplates(ctx, st); err != nil {
		return s, err
	}
	if s.AdminKey, err = ensureAdminKey(ctx, st, filepath.Join(data, "admin.key")); err != nil {
		return s, err
	}

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
	scfg.AppsDomain = cfg.AppsDomain
	scfg.Snapshots = snapshots
	scfg.Logger = cfg.Logger
	srv := server.New(scfg, st)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return s, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	s.URL = "http://" + ln.Addr().String()
	s.httpSrv = &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	s.wg.Add(2)
	go func() { defer s.wg.Done(); _ = s.httpSrv.Serve(ln) }()
	go func() { defer s.wg.Done(); _ = srv.Run(ctx) }()

	// The runtime scopes its cgroups by its directory, so two dev stacks never share (or
	// clean up) each other's sandboxes, while a restart of the same stack finds its leftovers.
	for i := 1; i <= cfg.Agents; i++ {
		id := fmt.Sprintf("dev-agent-%d", i)
		rt, closeRT, about, err := cfg.Runtime.open(filepath.Join(data, "agents", id), cfg.Logger.With("agent", id))
		if err != nil {
			return s, fmt.Errorf("runtime for %s: %w", id, err)
		}
		s.runtimes = append(s.runtimes, closeRT)
		s.Runtime = about
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
		acfg.SnapshotStore = snapshots
		acfg.SnapshotDir = filepath.Join(data, "cache", id, "snapshots") // a cache: rebuildable (POOL-4)
		acfg.ServerURL = s.URL
		acfg.NodeToken = nodeToken
		acfg.Logger = cfg.Logger
		if cfg.agentHook != nil {
			cfg.agentHook(i-1, &acfg)
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
	if err := s.waitAgents(ctx, cfg.Agents); err != nil {
		return s, err
	}
	return s, nil
}

// waitAgents waits (bounded) until n agents have heartbeated.
func (s *devStack) waitAgents(ctx context.Context, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		as, err := s.Store.Agents(ctx)
		if err != nil {
			return err
		}
		seen := 0
		for _, a := range as {
			if strings.HasPrefix(a.AgentID, "dev-agent-") && time.Since(a.LastSeen) < 5*time.Second {
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
	})
	return s.closeErr
}

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
	if err := st.PutTenant(ctx, berth.Tenant{Name: "default", CreatedAt: time.Now().UTC()}); err != nil {
		return "", fmt.Errorf("seed tenant: %w", err)
	}
	secret := ""
	if b, err := os.ReadFile(path); err == nil {
		secret = strings.TrimSpace(string(b))
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read admin key: %w", err)
	}
	if secret == "" {
		secret = server.NewKeySecret()
		if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("write admin key: %w", err)
		}
	}
	h := server.HashKey(secret)
	if _, err := st.APIKeyByHash(ctx, h); errors.Is(err, berth.ErrNotFound) {
		k := berth.APIKey{ID: "key-admin-" + h[:8], Tenant: "default", Role: berth.RoleAdmin, Hash: h, CreatedAt: time.Now().UTC()}
		if err := st.PutAPIKey(ctx, k); err != nil {
			return "", fmt.Errorf("store admin key: %w", err)
		}
	} else if err != nil {
		return "", fmt.Errorf("look up admin key: %w", err)
	}
	return secret, nil
}
