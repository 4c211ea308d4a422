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
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/internal/httpbound"
	"github.com/berth-dev/berth/internal/tlsconf"
	"github.com/berth-dev/berth/preempt"
	"github.com/berth-dev/berth/server"
	"github.com/berth-dev/berth/store/postgres"
	"github.com/berth-dev/berth/store/sqlite"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// newServerCmd is `berth server`: one API/scheduler replica over a store. Agents join with
// the node token (env BERTH_NODE_TOKEN).
func newServerCmd() *cobra.Command {
	cfg := server.DefaultConfig()
	bounds := defaultServerBounds()
	listen, data, storeSpec, snapshotURL := "127.0.0.1:7070", defaultDataDir(), "", ""
	retention := defaultRetention
	var tf tlsFlags
	agentCA := ""
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the API and scheduler (one replica)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Logger = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil))
			if err := checkRetention(retention); err != nil {
				return err
			}
			if err := bounds.check(); err != nil {
				return err
			}
			if err := checkListen(listen, data); err != nil {
				return err
			}
			cfg.Retention = retentionConfig(retention)
			cfg.NodeToken = os.Getenv("BERTH_NODE_TOKEN")
			if cfg.NodeToken == "" {
				return berth.Errorf(berth.EInvalidRequest, "set BERTH_NODE_TOKEN: agents authenticate with it")
			}
			if err := cfg.Validate(); err != nil { // C31: before anything is written
				return err
			}
			tlsCfg, err := tf.config(cfg.Logger)
			if err != nil {
				return err
			}
			if cfg.AgentTLS, err = agentTLS(agentCA); err != nil {
				return err
			}
			cfg.RequireAgentTLS = tlsCfg != nil || agentCA != "" // serving TLS, or told whom agents' certificates come from
			ctx := cmd.Context()
			// The address first: a replica that cannot serve writes nothing (no admin.key,
			// no berth.db) that a CLI would then send to whatever holds the port.
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return listenError(listen, data, err)
			}
			defer ln.Close()
			if err := os.MkdirAll(data, 0o700); err != nil {
				return err
			}
			st, err := openStore(ctx, storeSpec, data)
			if err != nil {
				return err
			}
			defer st.Close()
			if err := seedTemplates(ctx, st); err != nil {
				return err
			}
			keyAt, err := serverAdminKey(ctx, st, os.Getenv("BERTH_ADMIN_KEY"), filepath.Join(data, "admin.key"))
			if err != nil {
				return err
			}
			if cfg.Snapshots, err = openSnapshotStore(ctx, snapshotURL); err != nil {
				return err
			}
			if cfg.Snapshots != nil {
				defer cfg.Snapshots.Close()
			}
			bounds.server(&cfg)
			srv := server.New(cfg, st)
			hs, bln := bounds.Limits.Serve(ln, srv.Handler(), srv.LongLived)
			go func() { _ = srv.Run(ctx) }()
			go func() {
				<-ctx.Done()
				shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = hs.Shutdown(shut)
			}()
			tlsconf.WarnPlaintext(cfg.Logger, tlsCfg, ln.Addr(), "the API")
			fmt.Fprintf(cmd.OutOrStdout(), "Berth server at %s://%s (admin key %s)\n", map[bool]string{false: "http", true: "https"}[tlsCfg != nil], ln.Addr(), keyAt)
			if err := tlsconf.Serve(hs, bln, tlsCfg, cfg.Logger); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", listen, "API address")
	f.StringVar(&data, "data", data, "directory for admin.key, the admin key this replica makes unless env BERTH_ADMIN_KEY gives one (and the SQLite store by default)")
	f.StringVar(&storeSpec, "store", os.Getenv("BERTH_STORE"), "store: postgres://… (any number of replicas) or a SQLite file path (one replica; default <data>/berth.db)")
	f.StringVar(&cfg.ReplicaID, "replica-id", cfg.ReplicaID, "this replica's name, the owner of its reservations (default: random)")
	f.DurationVar(&cfg.StaleAfter, "stale-after", cfg.StaleAfter, "heartbeat age after which an agent gets no placements (PLC-1)")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "the agents' heartbeat period, at least their real one (Retry-After, the grace before a running sandbox its agent stops listing is lost; --reservation-ttl must be at least twice it)")
	f.DurationVar(&cfg.ReservationTTL, "reservation-ttl", cfg.ReservationTTL, "ledger entry TTL, renewed while its create is in flight; at least twice --heartbeat-interval (LED-2)")
	f.StringVar(&cfg.Strategy, "strategy", cfg.Strategy, "placement strategy: spread or pack (PLC-2)")
	f.DurationVar(&cfg.LeaseEphemeral, "lease-ephemeral", cfg.LeaseEphemeral, "a silent ephemeral-pool agent's sandboxes are lost after this (LIF-2)")
	f.DurationVar(&cfg.LeaseStateful, "lease-stateful", cfg.LeaseStateful, "a silent stateful-pool agent's sandboxes are lost after this (LIF-2)")
	registerAppFlags(f, &cfg.AppsDomain, &cfg.AppWakeTimeout, &cfg.AppStartTimeout)
	f.StringVar(&snapshotURL, "snapshot-store", "", "the agents' snapshot store (the same URL as theirs): paused sandboxes' images are removed from it when they are deleted or resumed (PAUSE-1)")
	registerRetention(f, &retention)
	bounds.register(f)
	tf.register(f, "the API")
	f.StringVar(&agentCA, "agent-ca", "", "PEM file of the CA that signed the agents' --tls-cert certificates (default: the system's roots). With it, or with --tls-cert, this server calls agents over TLS only")
	return cmd
}

// serverBounds are the flags bounding one API listener (issue 15, point 3; docs/DECISIONS.md
// "Bounded servers"): connections, timeouts and each tenant's request rate.
type serverBounds struct {
	Limits        httpbound.Limits
	TenantRate    float64
	TenantBurst   int
	TenantExecMiB int64
	// ExecInflightMiB is the replica's bound on exec requests in flight for everyone; `berth
	// dev` gives its agents the same (each agent's own in `berth agent`).
	ExecInflightMiB int64
}

func defaultServerBounds() serverBounds {
	d := server.DefaultConfig()
	return serverBounds{Limits: httpbound.DefaultLimits(), TenantRate: d.TenantRate, TenantBurst: d.TenantBurst, TenantExecMiB: d.TenantExecMiB, ExecInflightMiB: d.ExecInflightMiB}
}

func (b *serverBounds) register(f *pflag.FlagSet) {
	f.IntVar(&b.Limits.MaxConns, "max-conns", b.Limits.MaxConns, "connections the API listener holds open at once; at the cap the longest-idle one is closed (0: the default; -1: no cap)")
	f.DurationVar(&b.Limits.IdleTimeout, "idle-timeout", b.Limits.IdleTimeout, "a keep-alive connection with no request for this long is closed")
	f.DurationVar(&b.Limits.BodyTimeout, "body-timeout", b.Limits.BodyTimeout, "time a request body has, plus one second per --body-min-rate bytes received (slow uploads that keep flowing are not cut)")
	f.Int64Var(&b.Limits.BodyMinRate, "body-min-rate", b.Limits.BodyMinRate, "bytes per second a request body must keep up after --body-timeout")
	f.Float64Var(&b.TenantRate, "tenant-rate", b.TenantRate, "requests per second each tenant's keys may make (token bucket; 0: no limit); over it: 429 rate_limited with Retry-After")
	f.IntVar(&b.TenantBurst, "tenant-burst", b.TenantBurst, "requests a tenant may make at once above --tenant-rate (0 counts as 1)")
	f.Int64Var(&b.TenantExecMiB, "tenant-exec-mb", b.TenantExecMiB, "MiB of exec requests each tenant may have in flight on this replica (an exec holds its stdin until its command ends; 0: no bound); over it: 429 rate_limited")
	f.Int64Var(&b.ExecInflightMiB, "exec-inflight-mb", b.ExecInflightMiB, "MiB of exec requests this replica holds at once for everyone (berth dev: each of its agents too; 0: no bound); over it: 429 rate_limited")
}

// maxExecInflightMiB is the largest --tenant-exec-mb and --exec-inflight-mb taken, MiB (1 TiB).
const maxExecInflightMiB = 1 << 20

// checkExecMiB refuses (invalid_request) an exec bound flag outside 0 (no bound) ..
// maxExecInflightMiB, for `berth server`, `berth dev` and `berth agent` alike.
func checkExecMiB(flag string, v int64) error {
	if v < 0 || v > maxExecInflightMiB {
		return berth.Errorf(berth.EInvalidRequest, "%s must be 0 (no bound) or 1..%d, not %d", flag, maxExecInflightMiB, v)
	}
	return nil
}

// server copies the bounds a server.Config carries into cfg.
func (b serverBounds) server(cfg *server.Config) {
	cfg.TenantRate, cfg.TenantBurst, cfg.TenantExecMiB = b.TenantRate, b.TenantBurst, b.TenantExecMiB
	cfg.ExecInflightMiB = b.ExecInflightMiB
}

// agentExecInflight is agent.Config.ExecInflightMiB for a flag's MiB, where the flag's 0
// means no bound and the config's 0 means its default.
func agentExecInflight(flagMiB int64) int64 {
	if flagMiB == 0 {
		return -1
	}
	return flagMiB
}

// check refuses bounds no listener can serve under (invalid_request, exit 2), before
// anything starts: a negative rate, burst, timeout or minimum body rate, a connection cap
// below -1, or an exec bound outside 0..1 TiB (checkExecMiB) — a negative value would
// otherwise silently mean "no limit" or "the default".
func (b serverBounds) check() error {
	if err := cmp.Or(checkExecMiB("--tenant-exec-mb", b.TenantExecMiB), checkExecMiB("--exec-inflight-mb", b.ExecInflightMiB)); err != nil {
		return err
	}
	l := b.Limits
	switch {
	case b.TenantRate < 0 || b.TenantBurst < 0:
		return berth.Errorf(berth.EInvalidRequest, "--tenant-rate and --tenant-burst must be 0 (no limit; a burst of 1) or positive, not %v and %d", b.TenantRate, b.TenantBurst)
	case l.MaxConns < -1:
		return berth.Errorf(berth.EInvalidRequest, "--max-conns must be -1 (no cap), 0 (the default) or positive, not %d", l.MaxConns)
	case l.IdleTimeout < 0 || l.BodyTimeout < 0 || l.BodyMinRate < 0:
		return berth.Errorf(berth.EInvalidRequest, "--idle-timeout, --body-timeout and --body-min-rate must not be negative")
	}
	return nil
}

// registerAppFlags registers the app flags `berth server` and `berth dev` share (APP-1): the
// apps domain, how long a request to a hibernated app is held while it wakes, and how long a
// started app has to answer on its port. Defaults are what domain, wake and start hold; a
// negative duration is refused as the flag is parsed (guardFlagValues).
func registerAppFlags(f *pflag.FlagSet, domain *string, wake, start *time.Duration) {
	f.StringVar(domain, "apps-domain", *domain, "route requests for Host <app>.<domain> to the app (APP-1; /apps/<app>/ always works)")
	f.DurationVar(wake, "app-wake-timeout", *wake, "how long a request to a hibernated app is held while it wakes; then 503 app_wake_timeout")
	f.DurationVar(start, "app-start-timeout", *start, "how long a started app has to answer on its port")
}

// openStore opens the store named by spec: a postgres:// or postgresql:// URL, or a SQLite
// file path ("" means <data>/berth.db).
func openStore(ctx context.Context, spec, data string) (berth.Store, error) {
	switch {
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return postgres.Open(ctx, spec)
	case spec == "":
		spec = filepath.Join(data, "berth.db")
	}
	return sqlite.Open(ctx, strings.TrimPrefix(spec, "sqlite://"))
}

// newAgentCmd is `berth agent`: one host agent with the gVisor runtime where runsc is
// installed, else the process runtime (ISO-4).
func newAgentCmd(cf *clientFlags) *cobra.Command {
	cfg := agent.DefaultConfig()
	var tf tlsFlags
	dir, rtf := filepath.Join(defaultDataDir(), "agent"), defaultRuntimeFlags()
	notices, metadataURL, snapshotURL := "none", "", ""
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run a host agent that joins a server (gVisor sandboxes where runsc is installed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Logger = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil))
			cfg.NodeToken = os.Getenv("BERTH_NODE_TOKEN")
			if err := checkExecMiB("--exec-inflight-mb", cfg.ExecInflightMiB); err != nil {
				return err
			}
			cfg.ExecInflightMiB = agentExecInflight(cfg.ExecInflightMiB)
			if cfg.NodeToken == "" || cfg.ServerURL == "" {
				return berth.Errorf(berth.EInvalidRequest, "set --server and BERTH_NODE_TOKEN")
			}
			var err error
			if cfg.TLS, err = tf.config(cfg.Logger); err != nil {
				return err
			}
			if err := checkAgentServerURL(cfg.ServerURL, cf.ca, cfg.TLS != nil, cfg.Logger); err != nil {
				return err
			}
			cfg.ServerCAFile = cf.ca
			// Multi-host checks and defaults (README "Many replicas on PostgreSQL"), before
			// anything starts: the servers must be able to dial us, and --dir is ours alone.
			if err := checkAgentReach(cfg.ServerURL, cfg.Listen, cfg.Advertise); err != nil {
				return err
			}
			release, err := lockAgentDir(dir)
			if err != nil {
				return err
			}
			defer release()
			cfg.CredentialFile = filepath.Join(dir, "agent-credential") // TRUST-1: re-used across restarts
			if cfg.ID == "" {
				host, _ := os.Hostname()
				if cfg.ID, err = defaultAgentID(host, dir); err != nil {
					return err
				}
			}
			if err := berth.CheckAgentID(cfg.ID); err != nil {
				return err
			}
			switch notices {
			case "auto":
				w, name := preempt.Detect(cmd.Context(), preempt.Probe{GCP: metadataURL, AWS: metadataURL, Azure: metadataURL, Log: cfg.Logger})
				cfg.Logger.Info("preemption notices", "provider", name)
				cfg.Notices = w
			case "none", "":
			case "gcp":
				cfg.Notices = preempt.GCP{BaseURL: metadataURL, Log: cfg.Logger}
			case "aws":
				cfg.Notices = preempt.AWS{BaseURL: metadataURL, Log: cfg.Logger}
			case "azure":
				cfg.Notices = preempt.Azure{BaseURL: metadataURL, Log: cfg.Logger}
			default:
				return berth.Errorf(berth.EInvalidRequest, "--notices must be none, auto, gcp, aws or azure")
			}
			rt, closeRT, _, err := rtf.open(dir, cfg.Logger)
			if err != nil {
				return err
			}
			defer closeRT()
			if cfg.SnapshotStore, err = openSnapshotStore(cmd.Context(), snapshotURL); err != nil {
				return err
			}
			if cfg.SnapshotStore != nil {
				defer cfg.SnapshotStore.Close()
			}
			a, err := agent.New(cfg, rt)
			if err != nil {
				return err
			}
			return a.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.ServerURL, "server", os.Getenv("BERTH_URL"), "server URL")
	f.StringVar(&cfg.ID, "id", cfg.ID, "agent id (default: <hostname>-<8 hex digits of the --dir path>: distinct per agent on a host, the same across restarts)")
	f.StringVar(&cfg.Region, "region", cfg.Region, "region")
	f.StringVar(&cfg.Pool, "pool", cfg.Pool, "pool: stateful or ephemeral (POOL-1)")
	f.BoolVar(&cfg.Preemptible, "preemptible", cfg.Preemptible, "host may be preempted (must be ephemeral)")
	f.StringVar(&cfg.Admission, "admission", cfg.Admission, "memory admission: committed, working-set or none (ADM-1)")
	f.Int64Var(&cfg.MemoryMiB, "memory-mb", cfg.MemoryMiB, "memory budget, MiB (0 = MemTotal)")
	f.Int64Var(&cfg.HeadroomMiB, "headroom-mb", cfg.HeadroomMiB, "memory kept back from the budget, MiB (must be below the budget: the agent refuses to start otherwise)")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "heartbeat period (AGT-1)")
	f.IntVar(&cfg.MaxStarts, "max-starts", cfg.MaxStarts, "concurrent starts (ADM-10)")
	f.Int64Var(&cfg.ExecInflightMiB, "exec-inflight-mb", cfg.ExecInflightMiB, "MiB of exec requests this agent holds at once (an exec holds its stdin until its command ends; 0: no bound); over it: 429 rate_limited")
	registerWarmPool(f, &cfg.WarmPool)
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "internal API address to listen on, HOST:PORT (0.0.0.0:PORT: every interface)")
	f.StringVar(&cfg.Advertise, "advertise", "", "HOST[:PORT] the servers dial to reach this agent (default: the --listen address; the port defaults to the listener's). Refused when loopback while --server is another machine")
	f.StringVar(&dir, "dir", dir, "directory for sandbox files")
	cfg.VolumeDir = filepath.Join(defaultDataDir(), "volumes")
	f.StringVar(&cfg.VolumeDir, "volume-dir", cfg.VolumeDir, "directory for durable volumes (POOL-4: not under --dir or any cache)")
	rtf.register(f)
	tf.register(f, "the internal API (the servers' calls)")
	f.StringVar(&snapshotURL, "snapshot-store", "", "where checkpoint images go, shared by every agent that may resume another's sandbox (file:///dir; none: no pause, resume or snapshot moves here)")
	f.StringVar(&cfg.SnapshotDir, "snapshot-dir", "", "scratch directory for images on their way (a cache, POOL-4; default under the system temp dir)")
	f.StringVar(&notices, "notices", notices, "preemption notices to watch: none, auto (probe the metadata services briefly), gcp, aws or azure (SPOT-1)")
	f.StringVar(&metadataURL, "metadata-url", "", "base URL of the cloud's metadata service (default: the provider's own)")
	f.DurationVar(&cfg.SoftCordon, "soft-cordon", cfg.SoftCordon, "how long an early warning (an AWS rebalance recommendation) keeps this host out of placement before it returns to service by itself, unless a real notice follows (C15)")
	return cmd
}
