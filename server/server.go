// Package server is Berth's HTTP API and scheduler (SPEC §2, §3, §5, §13). It is stateless
// beyond caches: everything it knows lives in the store, so any number of replicas may share
// one (PostgreSQL) store. It imports the root package, admission, placement and the store
// interfaces of the root package — never a store implementation.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/conf"
	"github.com/berth-dev/berth/internal/inflight"
	"github.com/prometheus/client_golang/prometheus"
	"gocloud.dev/blob"
)

// Config holds the server's knobs; cmd/berth fills it (DefaultConfig first, then flags).
type Config struct {
	// ReplicaID names this replica as the owner of the reservations it takes (LED-1).
	ReplicaID string
	// NodeToken authenticates agents' heartbeats and the server's calls to agents.
	NodeToken string
	// StaleAfter is the placement staleness cutoff (PLC-1, default 30 s).
	StaleAfter time.Duration
	// HeartbeatInterval is the agents' heartbeat period, used by the Retry-After estimate.
	HeartbeatInterval time.Duration
	// ReservationTTL bounds every ledger entry (LED-2, default 60 s); SweepInterval is how
	// often expired ones are swept (default 5 s).
	ReservationTTL time.Duration
	SweepInterval  time.Duration
	// UnheldEvery is how often a sweep also looks for running rows their live agent no longer
	// holds (settleUnheld; default 30 s, 0: every sweep, negative: never): that read grows
	// with the running sandboxes of live hosts (docs/DECISIONS.md), so with a positive
	// period one replica a period does it for all (Store.ClaimSweep).
	UnheldEvery time.Duration
	// HeldSweepEvery is how often, per agent and replica, a heartbeat's AGT-6 check reads
	// every sandbox the store says the agent holds, not only those the heartbeat lists
	// (stopEnded; default 1 min): a sandbox the store ended while its agent kept it unchanged
	// is stopped within this and one heartbeat interval. A replica forgets an agent not swept
	// for ten times this (forgetStopRounds).
	HeldSweepEvery time.Duration
	// CacheTTL is how long the cached agent table may be used before a re-read (PLC-5,
	// default 1 s; heartbeats this replica receives update it in between).
	CacheTTL time.Duration
	// MaxHostsPerCreate is how many hosts a create tries (PLC-7, default 3).
	MaxHostsPerCreate int
	// Strategy is placement.Spread (default) or placement.Pack (PLC-2).
	Strategy string
	// DefaultTTL and MaxTTL bound ttl_seconds of creates (defaults 1 h and 7 days).
	DefaultTTL time.Duration
	MaxTTL     time.Duration
	// MaxSandboxMiB is the largest memory_mb a create may ask for (default 1 TiB).
	MaxSandboxMiB int64
	// AgentTimeout bounds one create, delete, drain or file call to an agent (default 30 s);
	// an exec is bounded by its own timeout_s plus 10 s instead.
	AgentTimeout time.Duration
	// DeadAfter is when a silent agent is dead rather than stale (LIF-1, default 5 min):
	// reported so, and whatever it still held is settled (lost) even if its pool's lease
	// is longer.
	DeadAfter time.Duration
	// LeaseEphemeral and LeaseStateful are the lease TTLs per pool (LIF-2, defaults 90 s and
	// 10 min): when an agent has not heartbeated for its pool's TTL, the sweeper marks its
	// live sandboxes lost.
	LeaseEphemeral time.Duration
	LeaseStateful  time.Duration
	// DrainDeadline is how long a drain may wait for the host's sandboxes to end before its
	// status reports them as blockers (AGT-5, C12; default 10 min).
	DrainDeadline time.Duration
	// Quarantine takes a host that keeps failing creates out of placement (PLC-9; default
	// after 3 consecutive failures, for 30 s doubling to 10 min).
	Quarantine berth.QuarantinePolicy
	// StartingGrace is how long a sandbox may stay starting before the sweeper fails it
	// (its replica died mid-create and its agent never listed it). Default AgentTimeout + 30 s.
	StartingGrace time.Duration
	// Retention is how long terminal sandboxes, their events and the events of ended
	// reservations are kept after they end (issue 15, point 5; default 7 days); the sweeper
	// deletes older ones in batches of RetentionBatch (default 500) rows. Negative keeps
	// them forever (the --retention=0 flag).
	Retention      time.Duration
	RetentionBatch int
	// Apps (APP-1, APP-2). AppReconcileInterval is the reconciler's period (default 1 s; it
	// also runs at once after any app change). AppStartTimeout is how long a started app's
	// command has to answer on its port (default 30 s); AppStartFailures how many starts in
	// a row whose command exits before serving make the app error (default 3). AppWakeTimeout
	// is how long a request to a hibernated app is held while it wakes (default 30 s).
	// AppBackoffBase and AppBackoffCap are the full-jitter window added to a refusal's
	// Retry-After (SDK-1's defaults, 0.25 s and 8 s). AppsDomain, when set, routes requests
	// whose Host is <app>.<AppsDomain> to the app (besides /apps/<app>/ on any host).
	AppReconcileInterval time.Duration
	AppStartTimeout      time.Duration
	AppStartFailures     int
	AppWakeTimeout       time.Duration
	AppBackoffBase       time.Duration
	AppBackoffCap        time.Duration
	// AppDrainGrace is how long the sandbox an app switched away from (a deploy, a
	// reconstruction) keeps running for the requests already routed to it (default 5 s).
	AppDrainGrace time.Duration
	// AppHeaderTimeout bounds how long a request to an app waits for the app's response
	// headers through its host's agent (default 60 s, nginx's proxy_read_timeout); the body
	// of a stream or an upgraded connection is not bounded by it (C28).
	AppHeaderTimeout time.Duration
	AppsDomain       string
	// Snapshots is the snapshot store the agents checkpoint into (SPOT-4, PAUSE-1): the
	// server removes a paused sandbox's image when it is deleted or resumed. Nil: images are
	// left to the store's own lifecycle rules. PauseTimeout bounds one checkpoint and its
	// upload (default 10 min).
	Snapshots    *blob.Bucket
	PauseTimeout time.Duration
	Logger       *slog.Logger
	// Clock is the time source; tests may replace it.
	Clock func() time.Time
	// Registry receives the server's metrics; nil creates a private registry.
	Registry *prometheus.Registry
	// TenantRate is each tenant's request rate limit, requests per second (token bucket,
	// TenantBurst deep; 0 = no limit); over it a call gets 429 rate_limited with Retry-After
	// (issue 15). DefaultConfig: 100/s, bursts of 200. The admin key and node token are exempt.
	TenantRate  float64
	TenantBurst int
	// TenantExecMiB bounds the exec requests each key's tenant has in flight on this replica,
	// MiB of what the replica holds of each: the larger of its body and its decoded stdin and
	// arguments, counted once the body is read and the sandbox found (the admin key is
	// bounded as one more tenant). An exec holds its request until its command ends, so the
	// bound is on memory held, not on rate; over it: 429 rate_limited, retry after 1 s
	// (docs/DECISIONS.md "Execs in flight"). DefaultConfig: 64; 0 = no bound.
	TenantExecMiB int64
	// ExecInflightMiB bounds the exec requests this replica holds at once for everyone, MiB
	// (counted as TenantExecMiB is); over it: 429 rate_limited. DefaultConfig: 256; 0 = no
	// bound.
	ExecInflightMiB int64
	// MaxJoins bounds the agent joins (POST /v1/agents/join) this replica runs at once, and
	// JoinWait how long a join waits for one of those slots before it is refused with 503
	// unavailable (the agent joins again at its next heartbeat). Without a bound, 10,000
	// agents starting together queued thousands of joins on the store's few connections,
	// every join's 10 s waited out in the queue and was cancelled mid-transaction, each
	// cancel cost a connection, and 2,003 of 10,000 had joined after 200 s while the joined
	// ones' heartbeats waited behind (docs/DECISIONS.md "A fleet that starts at once").
	// DefaultConfig: 8 and 1 s.
	MaxJoins int
	JoinWait time.Duration
	// AgentTLS is the TLS configuration of calls to agents whose address is https:// (issue
	// 15, point 2): its RootCAs is the CA that signed the agents' certificates (nil: the
	// system's roots). RequireAgentTLS refuses heartbeats announcing an http:// address
	// (400 invalid_request), so the node token and tenants' files never cross the network in
	// clear; `berth server` sets it when it serves TLS itself.
	AgentTLS        *tls.Config
	RequireAgentTLS bool
}

// DefaultConfig returns every knob at its documented default.
func DefaultConfig() Config {
	return Config{
		StaleAfter:        30 * time.Second,
		HeartbeatInterval: 10 * time.Second,
		ReservationTTL:    60 * time.Second,
		SweepInterval:     5 * time.Second,
		UnheldEvery:       30 * time.Second,
		HeldSweepEvery:    time.Minute,
		CacheTTL:          time.Second,
		MaxHostsPerCreate: 3,
		Strategy:          "spread",
		DefaultTTL:        time.Hour,
		MaxTTL:            7 * 24 * time.Hour,
		MaxSandboxMiB:     1 << 20,
		AgentTimeout:      30 * time.Second,
		DeadAfter:         5 * time.Minute,
		LeaseEphemeral:    90 * time.Second,
		LeaseStateful:     10 * time.Minute,
		DrainDeadline:     10 * time.Minute,
		Quarantine:        berth.QuarantinePolicy{After: 3, Backoff: 30 * time.Second, MaxBackoff: 10 * time.Minute},

		AppReconcileInterval: time.Second,
		AppStartTimeout:      30 * time.Second,
		AppStartFailures:     3,
		AppWakeTimeout:       30 * time.Second,
		AppBackoffBase:       berth.BackoffBase,
		AppBackoffCap:        berth.BackoffCap,
		AppDrainGrace:        5 * time.Second,
		AppHeaderTimeout:     60 * time.Second,
		PauseTimeout:         10 * time.Minute,
		TenantRate:           100,
		TenantBurst:          200,
		TenantExecMiB:        64,
		ExecInflightMiB:      256,
		MaxJoins:             8,
		JoinWait:             time.Second,
	}
}

// Server is the API and scheduler of one replica.
type Server struct {
	cfg       Config
	store     berth.Store
	sched     *scheduler
	agents    *agentCaller
	auth      *authenticator
	templates *templateCache
	quotas    *ttlCache[berth.Quota] // per tenant, a few seconds (ADM-11)
	limits    *tenantLimits          // per-tenant request rate (nil: none)
	joinSlots inflight.Slots         // agent joins running at once (Config.MaxJoins)
	execs     *inflight.Bytes        // exec request bytes in flight, per principal and in all
	metrics   *metrics
	retained  *prometheus.CounterVec // berth_retention_rows_deleted_total{table}
	stopSwept sync.Map               // agent id → when stopEnded last checked all it holds (time.Time)
	stopLive  sync.Map               // agent id → *liveHeld: what stopEnded last found live in the store
	// stopForgotAt is when forgetStopRounds last dropped departed agents' entries (unix ns).
	stopForgotAt atomic.Int64
	// slowImages holds the images the snapshot store could not answer for in the sweeper's
	// last round of settleCheckpoints: the next round asks about them last. Replaced whole
	// each round, so it holds at most one round's worth.
	slowImages atomic.Pointer[map[string]bool]
	// heartbeatCreds maps the hashes of credentials heartbeats came with, read live from the
	// store, to their agent ids (heartbeatCredential); the heartbeat's transaction re-checks
	// them.
	heartbeatCreds *ttlCache[string]
	unheldAt       atomic.Int64 // when settleUnheld last ran (unix ns), for UnheldEvery
	log            *slog.Logger
	// Apps: a kick runs a reconciler round now; appBusy holds the apps being worked on by
	// this replica; appSeen when each app last had a request open here (its start, while
	// open, and its end), appFlushed when that was last written to the store, appFlushing
	// the apps with a trailing write pending, appOpen each app's requests and upgraded
	// connections open here (idle hibernation across replicas, C25).
	appKick     chan struct{}
	appBusy     sync.Map // name → true
	appWritten  sync.Map // name → int64, the newest revision this replica wrote (appAsOfNow)
	appSeen     sync.Map // name → time.Time
	appFlushed  sync.Map // name → time.Time
	appFlushing sync.Map // name → true
	appOpen     sync.Map // name → *appActivity
	// appDone counts finished reconcileApp calls, so a test can wait for rounds, not time.
	appDone atomic.Int64
	// appTransport carries app requests to agents, keeping connections to each agent warm
	// (the default keeps 2 idle per host: every burst above that would reconnect).
	appTransport *http.Transport
	appWatchMu   sync.Mutex
	appWatchers  map[string]chan struct{} // name → closed at this replica's next write of it
	// stopRounds are the AGT-6 rounds (stopEnded) in flight, sweepDeletes the sweeper's
	// deletes (sweepDelete): each one per agent, maxStopRounds in all.
	stopRounds, sweepDeletes *agentCalls
	// lastForget is when keyed calls were last forgotten (unix ms, C26).
	lastForget atomic.Int64
	// hearing is since when this replica could record heartbeats: lease expiry counts
	// silence from then (LIF-2).
	hearing hearing
}

// maxStopRounds is how many AGT-6 rounds (stopEnded: a store read, then deletes to one
// agent) a replica runs at once. Unbounded, a replica meeting 10,000 agents started 10,000
// of them and their queries took every pooled store connection from creates (issue 16,
// goal 2's fleet run: creates waited over 30 s).
const maxStopRounds = 4

// New returns a server over st. Zero fields of cfg take their defaults.
func New(cfg Config, st berth.Store) *Server {
	cfg = cfg.withDefaults()
	if el, ok := st.(berth.EventLogger); ok {
		// LIF-3: every committed event is also a structured log line.
		log := cfg.Logger
		el.LogEvents(func(e berth.Event) {
			log.Info("event", "at", e.At, "entity", e.Entity, "from", e.From, "to", e.To, "reason", e.Reason, "actor", e.Actor)
		})
	}
	m := newMetrics(cfg.Registry, st, cfg.StaleAfter, cfg.DeadAfter, cfg.Clock)
	ac := newAgentCaller(cfg.NodeToken, cfg.AgentTimeout, cfg.AgentTLS, cfg.RequireAgentTLS)
	return &Server{
		cfg:            cfg,
		store:          st,
		sched:          newScheduler(st, cfg, ac, m),
		agents:         ac,
		auth:           newAuthenticator(st, cfg.NodeToken),
		templates:      newTemplateCache(st, cfg.Clock),
		quotas:         &ttlCache[berth.Quota]{ttl: 5 * time.Second, max: 10000},
		heartbeatCreds: &ttlCache[string]{ttl: heartbeatCredTTL, max: 1 << 16},
		limits:         newTenantLimits(cfg.TenantRate, cfg.TenantBurst, time.Now),
		execs:          inflight.New(inflight.MiB(cfg.ExecInflightMiB)),
		metrics:        m,
		retained:       newRetentionCounter(cfg.Registry),
		log:            cfg.Logger,
		appKick:        make(chan struct{}, 1),
		joinSlots:      inflight.NewSlots(cfg.MaxJoins),
		stopRounds:     newAgentCalls(maxStopRounds, 3*cfg.HeartbeatInterval, cfg.Clock),
		sweepDeletes:   newAgentCalls(maxStopRounds, 3*cfg.HeartbeatInterval, cfg.Clock),
		appWatchers:    map[string]chan struct{}{},
		appTransport:   newAppTransport(cfg.AppHeaderTimeout, cfg.AgentTLS, cfg.RequireAgentTLS),
	}
}

// newAppTransport carries app requests to agents, keeping connections to each agent warm;
// headerTimeout bounds the wait for an app's response headers (AppHeaderTimeout); agentTLS
// and requireTLS are Config.AgentTLS and Config.RequireAgentTLS (agentDial).
func newAppTransport(headerTimeout time.Duration, agentTLS *tls.Config, requireTLS bool) *http.Transport {
	t := &http.Transport{
		Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
		// C28: a host that never accepts, or accepts and never answers, does not hold
		// the request (and a connection) until the client gives up.
		ResponseHeaderTimeout: headerTimeout,
	}
	agentDial(t, agentTLS, requireTLS)
	return t
}

// withDefaults returns cfg with every zero knob at its default (DefaultConfig), a random
// ReplicaID, StartingGrace AgentTimeout + 30 s, and a logger, clock and registry.
func (cfg Config) withDefaults() Config {
	def := DefaultConfig()
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = "replica-" + randomHex(4)
	}
	cfg.StaleAfter = conf.Or(cfg.StaleAfter, def.StaleAfter)
	cfg.HeartbeatInterval = conf.Or(cfg.HeartbeatInterval, def.HeartbeatInterval)
	cfg.ReservationTTL = conf.Or(cfg.ReservationTTL, def.ReservationTTL)
	cfg.SweepInterval = conf.Or(cfg.SweepInterval, def.SweepInterval)
	cfg.CacheTTL = conf.Or(cfg.CacheTTL, def.CacheTTL)
	cfg.MaxJoins = conf.Or(cfg.MaxJoins, def.MaxJoins)
	cfg.JoinWait = conf.Or(cfg.JoinWait, def.JoinWait)
	cfg.HeldSweepEvery = conf.Or(cfg.HeldSweepEvery, def.HeldSweepEvery)
	cfg.MaxHostsPerCreate = conf.Or(cfg.MaxHostsPerCreate, def.MaxHostsPerCreate)
	if cfg.Strategy == "" {
		cfg.Strategy = def.Strategy
	}
	cfg.DefaultTTL = conf.Or(cfg.DefaultTTL, def.DefaultTTL)
	cfg.MaxTTL = conf.Or(cfg.MaxTTL, def.MaxTTL)
	cfg.MaxSandboxMiB = conf.Or(cfg.MaxSandboxMiB, def.MaxSandboxMiB)
	cfg.AgentTimeout = conf.Or(cfg.AgentTimeout, def.AgentTimeout)
	cfg.DeadAfter = conf.Or(cfg.DeadAfter, def.DeadAfter)
	cfg.LeaseEphemeral = conf.Or(cfg.LeaseEphemeral, def.LeaseEphemeral)
	cfg.LeaseStateful = conf.Or(cfg.LeaseStateful, def.LeaseStateful)
	cfg.DrainDeadline = conf.Or(cfg.DrainDeadline, def.DrainDeadline)
	if cfg.Quarantine.After <= 0 {
		cfg.Quarantine = def.Quarantine
	}
	if cfg.StartingGrace <= 0 {
		cfg.StartingGrace = cfg.AgentTimeout + 30*time.Second
	}
	if cfg.Retention == 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	cfg.RetentionBatch = conf.Or(cfg.RetentionBatch, 500)
	cfg.AppReconcileInterval = conf.Or(cfg.AppReconcileInterval, def.AppReconcileInterval)
	cfg.AppStartTimeout = conf.Or(cfg.AppStartTimeout, def.AppStartTimeout)
	cfg.AppStartFailures = conf.Or(cfg.AppStartFailures, def.AppStartFailures)
	cfg.AppWakeTimeout = conf.Or(cfg.AppWakeTimeout, def.AppWakeTimeout)
	cfg.AppBackoffBase = conf.Or(cfg.AppBackoffBase, def.AppBackoffBase)
	cfg.AppBackoffCap = conf.Or(cfg.AppBackoffCap, def.AppBackoffCap)
	cfg.AppDrainGrace = conf.Or(cfg.AppDrainGrace, def.AppDrainGrace)
	cfg.AppHeaderTimeout = conf.Or(cfg.AppHeaderTimeout, def.AppHeaderTimeout)
	cfg.PauseTimeout = conf.Or(cfg.PauseTimeout, def.PauseTimeout)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	return cfg
}

// Run sweeps expired reservations (LED-2) and abandoned starting sandboxes, and follows the
// store's agent changes when it can push them (PLC-5), until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	s.hearing.start(s.cfg.Clock())
	if w, ok := s.store.(berth.AgentWatcher); ok {
		go s.watchAgents(ctx, w)
	}
	go s.runApps(ctx)
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	// Leases end at a heartbeat's time plus the pool's TTL, not at the next sweep: a silent
	// host's sandboxes (and apps) move within the lease TTL, not up to a sweep later (LIF-2).
	lease := time.NewTimer(s.untilLeaseEnd())
	defer lease.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.sweep(ctx)
		case <-lease.C:
			if err := s.sched.refreshIfStale(ctx); err == nil {
				s.expireLeases(ctx)
			}
		}
		lease.Reset(s.untilLeaseEnd())
	}
}

// untilLeaseEnd is how long until the next lease in the snapshot ends, within
// [10 ms, SweepInterval] (the sweep also checks leases).
func (s *Server) untilLeaseEnd() time.Duration {
	now := s.cfg.Clock()
	end, ok := s.sched.nextLeaseEnd(now, s.hearing.from(), s.leaseTTL(berth.PoolEphemeral), s.leaseTTL(berth.PoolStateful))
	if !ok {
		return s.cfg.SweepInterval
	}
	return min(max(end.Sub(now), 10*time.Millisecond), s.cfg.SweepInterval)
}

// sweep runs one round of the TTL sweepers.
func (s *Server) sweep(ctx context.Context) {
	now := s.cfg.Clock()
	n, err := s.store.SweepReservations(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			s.hearing.failed(now)
			s.log.Warn("reservation sweep failed", "err", err)
		}
		return
	}
	s.hearing.ok(now, s.cfg.Clock(), s.log)
	if n > 0 {
		// A non-zero rate means some release path leaks, or a replica died (LED-2).
		s.metrics.expirations.Add(float64(n))
		s.log.Warn("expired reservations swept", "count", n)
		_ = s.sched.refresh(ctx)
	}
	if err := s.sched.refreshIfStale(ctx); err == nil {
		s.expireLeases(ctx)
	}
	s.settleCheckpoints(ctx)
	s.settleStopping(ctx)
	s.settleUnheld(ctx)
	s.forgetStopRounds(s.cfg.Clock())
	s.purgeEnded(ctx)
	s.forgetCalls(ctx)
	cutoff := s.cfg.Clock().Add(-s.cfg.StartingGrace)
	_ = s.eachInState(ctx, berth.SandboxStarting, func(sb berth.Sandbox) bool {
		if sb.CreatedAt.After(cutoff) {
			return false // oldest first: every one after it is younger still
		}
		ok, err := s.store.TransitionSandbox(ctx, sb.ID, []berth.SandboxState{berth.SandboxStarting}, berth.SandboxFailed,
			"create abandoned: no replica finished it and its agent never listed it", "sweeper/"+s.cfg.ReplicaID, s.cfg.Clock())
		if err == nil && ok {
			s.log.Warn("abandoned create failed by the sweeper", "sandbox", sb.ID, "agent", sb.AgentID)
			sb.State = berth.SandboxFailed
			s.sweepDelete(ctx, sb, nil) // in case it runs after all (dropped: AGT-6 stops a failed row)
		}
		return true
	})
}

// maxLiveOnHost bounds the live sandboxes of one host read at once (a drain's status, lease
// expiry): far above what a host runs.
const maxLiveOnHost = 100000

// sweepDelete sends the delete the sweeper decided on for found (the row as it read it) to
// its agent in the background, through sweepDeletes: at most one call to each agent and
// maxStopRounds in all at once, each delete bounded by the agent call's own timeout; asked
// for while every slot is taken it waits its turn in the queue, and while its agent's call
// runs it is dropped (a later round asks again). Sent inline, a delete its agent never
// answered held the sweeper's loop for AgentTimeout (30 s) each, and lease expiry with it (an
// attack: an agent that kept ten stopping sandboxes listed and never answered their deletes
// held a dead host's sandbox running).
//
// The row may move while the delete waits or runs, so the delete is sent only while the row
// is still found — same state, agent and image, and for a resume not listed by its agent —
// and then (if not nil) runs only if the agent took the delete and the row is still found.
// Attacks: a resume that finished late and was promoted to running, or paused and resumed
// again to the same agent, was stopped by a delete asked for an earlier resume, and its row
// paused with the older image; a delete the agent failed still had the row paused, on no
// host, while its guest might run on.
func (s *Server) sweepDelete(ctx context.Context, found berth.Sandbox, then func()) {
	addr, err := s.agentAddress(ctx, found.AgentID)
	if err != nil {
		return
	}
	still := func() bool {
		sb, err := s.store.Sandbox(ctx, found.ID)
		return err == nil && sb.State == found.State && sb.AgentID == found.AgentID && sb.Image == found.Image &&
			(found.State != berth.SandboxResuming || !s.agentHolds(ctx, found.AgentID, found.ID))
	}
	send := func() {
		if !still() || s.agents.delete(ctx, addr, found.ID) != nil || then == nil || !still() {
			return
		}
		then()
	}
	s.sweepDeletes.run(found.AgentID, "delete "+found.ID, send, send)
}

// expireLeases turns the live sandboxes of agents silent for longer than their pool's lease
// TTL into lost, each with an event (LIF-2, SPOT-5: the silent case). Candidates come from
// the snapshot (no I/O); each is re-read from the store before anything is marked, and that
// read tells hearing how the store answers: a read that hung for deafAfter (a partition that
// began after the sweep's own store call) is deaf time, like a sweep's.
func (s *Server) expireLeases(ctx context.Context) {
	for _, id := range s.sched.silentAgents(s.cfg.Clock(), s.leaseTTL(berth.PoolEphemeral), s.leaseTTL(berth.PoolStateful)) {
		start := s.cfg.Clock()
		a, err := s.store.Agent(ctx, id)
		now := s.cfg.Clock()
		if err != nil {
			if !errors.Is(err, berth.ErrNotFound) && ctx.Err() == nil {
				s.hearing.failed(start)
			}
			continue
		}
		s.hearing.ok(start, now, s.log)
		ttl := s.leaseTTL(a.Pool)
		if s.hearing.countedSilence(now, a.LastSeen) < ttl {
			continue // silent, but not for a lease TTL that this replica could hear
		}
		silent := now.Sub(a.LastSeen)
		// Live, and all of them: the newest 1,000 of every state (the default limit) hid a
		// long-lived sandbox behind a busy host's ended ones, and it was never lost (an attack).
		sbs, err := s.store.Sandboxes(ctx, berth.SandboxFilter{AgentID: id, Live: true, Limit: maxLiveOnHost})
		if err != nil {
			continue
		}
		reason := fmt.Sprintf("lease expired: no heartbeat from agent/%s for %s (lease %s)", id, silent.Round(time.Second), ttl)
		for _, sb := range sbs {
			if sb.State.Terminal() {
				continue
			}
			ok, err := s.store.TransitionSandbox(ctx, sb.ID, nil, berth.SandboxLost, reason, "sweeper/"+s.cfg.ReplicaID, now)
			if err == nil && ok {
				s.log.Warn("sandbox lost", "sandbox", sb.ID, "agent", id, "reason", reason)
				if sb.Metadata["app"] != "" {
					s.kickApps() // its app is placed again now, not at the reconciler's next round
				}
			}
		}
	}
}

// leaseTTL returns the lease TTL of a pool (an agent with no pool is stateful, POOL-1),
// never longer than DeadAfter: a dead agent's sandboxes are settled (LIF-1).
func (s *Server) leaseTTL(pool string) time.Duration {
	if pool == berth.PoolEphemeral {
		return min(s.cfg.LeaseEphemeral, s.cfg.DeadAfter)
	}
	return min(s.cfg.LeaseStateful, s.cfg.DeadAfter)
}

// watchAgents folds pushed agent changes into the snapshot: one agent re-read for a lone
// change; for several queued at once (a burst of joins or drains, issue 16, goal 2: 10,000
// agents registering cost a read each on every replica) one refresh of what changed since
// the last read, which covers them all; a whole refresh when the watcher says it may have
// missed some ("").
func (s *Server) watchAgents(ctx context.Context, w berth.AgentWatcher) {
	changed := make(chan string, 1024)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case id := <-changed:
				ids := []string{id}
				for more := true; more; {
					select {
					case next := <-changed:
						ids = append(ids, next)
					default:
						more = false
					}
				}
				switch {
				case slices.Contains(ids, ""):
					_ = s.sched.refreshAll(ctx)
				case len(ids) > 1:
					_ = s.sched.refresh(ctx)
				default:
					if a, err := s.store.Agent(ctx, id); err == nil {
						s.sched.observe(a)
					}
				}
			}
		}
	}()
	_ = w.WatchAgents(ctx, func(id string) {
		select {
		case changed <- id:
		default:
			// Too many changes queued: drop this one, ask for a full refresh instead.
			select {
			case changed <- "":
			default:
			}
		}
	})
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newID(prefix string) string { return prefix + "-" + randomHex(8) }

// Handler returns the v1 HTTP API (SPEC §13) with /healthz, /readyz and /metrics.
func (s *Server) Handler() http.Handler { return s.routes() }
