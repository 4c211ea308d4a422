// Package agent is the host agent (SPEC §4): it runs sandboxes through a runtime driver,
// measures them, enforces the local admission gate (AGT-2) with the one formula of package
// admission (ADM-6), bounds concurrent starts (ADM-10), stops sandboxes past their TTL
// (AGT-7), serves the internal API the scheduler calls, and heartbeats (AGT-1).
package agent

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/conf"
	"github.com/berth-dev/berth/internal/httpbound"
	"github.com/berth-dev/berth/internal/inflight"
	"github.com/berth-dev/berth/internal/tlsconf"
	"github.com/berth-dev/berth/preempt"
	"gocloud.dev/blob"
)

// Runtime is what the agent needs from a runtime driver (AGT-3). Implementations:
// agent/runtime/gvisor (the default where runsc is installed), agent/runtime/process and
// agent/runtime/noop (benchmarks). The drivers import this package, never the reverse
// (TestAgentImportsNoDriver); cmd/berth picks one and passes it to New.
type Runtime interface {
	// Start starts a sandbox and returns once it serves.
	Start(ctx context.Context, s Spec) error
	// Stop stops a sandbox and frees what it held; an unknown id is not an error.
	Stop(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error)
	// WriteFile streams content into path as the sandbox sees it (ISO-3); ReadFile streams a
	// file's content and returns its size in bytes; the caller closes it.
	WriteFile(ctx context.Context, id, path string, content io.Reader) error
	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error)
	Measure(id string) (Measurement, error)
}

// Spec is a sandbox to start: its id, template (which names its root file system), memory
// limit in MiB, vCPUs and, when set, the host directory of its volume (POOL-2).
type Spec struct {
	ID        string
	Template  string
	MemoryMiB int64
	VCPUs     int
	VolumeDir string
}

// Checkpointer is what a runtime offers when it can snapshot a running guest (ISO-4,
// PAUSE-1, SPOT-3): the agent finds it by type assertion and publishes the capability on its
// heartbeat. Checkpoint saves sandbox id — memory, processes and its /tmp — as files in the
// empty directory dir and stops it; Restore starts sandbox s from such a directory, with its
// processes and memory as they were; Ping checks that the sandbox's init answers (the health
// check before a snapshot, PAUSE-2). A runtime refuses (conflict) an image it cannot
// rebuild: one another runtime version or init build made.
type Checkpointer interface {
	Checkpoint(ctx context.Context, id, dir string) error
	Restore(ctx context.Context, s Spec, dir string) error
	Ping(ctx context.Context, id string) error
}

// RuntimeInfo names a runtime for the heartbeat and the logs (ISO-4): "gvisor", "process" or
// "noop", and for gVisor its platform ("systrap", "ptrace").
type RuntimeInfo struct {
	Name     string
	Platform string
	// Isolated is false for a runtime that is no boundary (the process runtime started with
	// --insecure).
	Isolated bool
}

// Measurement is one reading of a guest (AGT-3): its working set in MiB, whether the reading
// saw it (ADM-5), whether it exited, and how many of its processes the kernel OOM killer
// killed so far (C09).
type Measurement struct {
	ResidentMiB int64
	Seen        bool
	Exited      bool
	OOMKills    int64
}

// Config is the agent's configuration; cmd/berth fills it from flags (DefaultConfig first).
type Config struct {
	ID          string
	Region      string
	Pool        string // "stateful" (default) or "ephemeral" (POOL-1)
	Preemptible bool
	// Admission is the memory-admission mode (ADM-1): committed, working-set or none.
	Admission string
	// MemoryMiB is the memory budget in MiB; 0 means the host's MemTotal. HeadroomMiB is
	// kept back from it; New refuses (invalid_request) a headroom that is negative or not
	// below the budget, which would leave nothing to admit.
	MemoryMiB   int64
	HeadroomMiB int64
	// WarmPool lists the templates this agent keeps warm guests of, started ahead of demand
	// and handed to matching creates (issue 16, goal 5; empty, the default: no pool). The
	// pool is charged like any guest but left out of the published admittable: a create
	// that needs its room stops warm guests first. New refuses (invalid_request) a template
	// named twice, a non-positive memory size or a size outside 0..64.
	WarmPool []WarmPoolEntry
	// HeartbeatInterval is the heartbeat period (AGT-1, default 10 s).
	HeartbeatInterval time.Duration
	// MeasureInterval is how often guests are measured and TTLs checked (default 1 s).
	MeasureInterval time.Duration
	// ReserveTTL bounds how long an unmeasured guest is charged its reserve (ADM-5, 60 s).
	ReserveTTL time.Duration
	// MaxStarts bounds concurrent starts (ADM-10, default 8); StartSlotWait is how long a
	// create waits for a slot before host_starts_saturated (default 250 ms).
	MaxStarts     int
	StartSlotWait time.Duration
	// ExecInflightMiB bounds the exec requests this agent holds at once, MiB of forwarded
	// request body (one without a Content-Length counts as the most one may be); an exec
	// holds its request until its command ends. Over it: 429 rate_limited, which the replica
	// passes on (docs/DECISIONS.md "Execs in flight"). 0: the default, 256; negative: no bound.
	ExecInflightMiB int64
	// ServerURL and NodeToken: where heartbeats go and the token both sides present. The
	// agent uses NodeToken towards the server only to join (TRUST-1); its heartbeats and
	// evacuation plans carry the credential the join returned, which it keeps in
	// CredentialFile (mode 0600; "" keeps it in memory, so a restart joins again).
	ServerURL      string
	NodeToken      string
	CredentialFile string
	// ServerCAFile is the PEM file of the CA that signed an https:// ServerURL's certificate
	// (issue 15, point 2); "" trusts the system's roots.
	ServerCAFile string
	// VolumeDir holds volumes, durable and pinned to this host (POOL-2, POOL-4): never under
	// a cache directory, never removed when a sandbox ends. "" refuses volume creates.
	VolumeDir string
	// EvictFloorMiB and EvictPressure are the critical lines of ADM-9: when the host's
	// available memory (total − Σ resident) stays under the floor, or pressure above the
	// line, for two measurements in a row, the agent evicts stateless sandboxes (defaults:
	// 5 % of total, at least 64 MiB; 40 %).
	EvictFloorMiB int64
	EvictPressure float64
	// Notices watches the cloud for preemption notices (SPOT-1); nil means none. A notice
	// cordons the host at once (SPOT-2); a soft one (AWS rebalance) cordons it for
	// SoftCordon (default 30 min; `berth agent --soft-cordon`; negative is refused) and then
	// lets it back into service (C15).
	Notices    preempt.Watcher
	SoftCordon time.Duration
	// LinkMiBps is the host's link rate for the evacuation budget (SPOT-3; default 119 MiB/s,
	// 1 Gbps).
	LinkMiBps float64
	// Pressure is the ADM-8 gate's lines and hold (default close 10 %, open 2 %, hold 15 s);
	// PressureSource reads the host's memory pressure (default ProcPressure).
	Pressure       admission.PressureGate
	PressureSource func() (float64, bool)
	// SnapshotStore is where checkpoint images go and come from (SPOT-4; gocloud.dev/blob:
	// file://, s3://, gs://, azblob://), shared by every agent that may restore another's
	// guest; SnapshotDir is this host's scratch directory for images on their way (a cache
	// directory, POOL-4). Without a store the agent neither checkpoints nor restores.
	SnapshotStore *blob.Bucket
	SnapshotDir   string
	// Listen is the internal API address (default 127.0.0.1:0).
	Listen string
	// Advertise is the address the servers dial for the internal API, HOST:PORT or HOST
	// (then the port Listen got); "" means the listener's own address, which only a server
	// on this host can reach when Listen is a loopback or wildcard address.
	Advertise string
	// Bounds bounds the internal API listener (issue 15): header, body and idle timeouts and
	// a connection cap (zero fields: internal/httpbound's defaults). Its answers get no write
	// deadline: only servers call it, and creates, execs and checkpoints run long.
	Bounds httpbound.Limits
	// TLS, when not nil, serves the internal API over TLS (internal/tlsconf.ServerConfig)
	// and announces an https:// address; nil serves it in clear, with a warning in the log
	// when Listen is reachable from the network (issue 15, point 2).
	TLS *tls.Config

	Version string
	Logger  *slog.Logger
}

// DefaultConfig returns every knob at its documented default.
func DefaultConfig() Config {
	return Config{
		Pool:              berth.PoolStateful,
		Admission:         berth.AdmissionWorkingSet,
		HeadroomMiB:       1024,
		HeartbeatInterval: 10 * time.Second,
		MeasureInterval:   time.Second,
		ReserveTTL:        60 * time.Second,
		MaxStarts:         8,
		StartSlotWait:     250 * time.Millisecond,
		ExecInflightMiB:   256,
		Listen:            "127.0.0.1:0",
		Version:           "dev",
		Pressure:          admission.DefaultPressureGate(),
		EvictPressure:     40,
		SoftCordon:        30 * time.Minute,
		LinkMiBps:         1e9 / 8 / (1 << 20),
		Bounds:            agentBounds(),
	}
}

// agentBounds are the internal API's default bounds: the server's, with 1024 connections
// (only the servers call an agent).
func agentBounds() httpbound.Limits {
	l := httpbound.DefaultLimits()
	l.MaxConns = 1024
	return l
}

// guest is one sandbox the agent holds.
type guest struct {
	spec       berth.AgentCreate
	admittedAt time.Time
	expires    time.Time // its TTL end on this agent's clock (ttlEnd); zero for none
	started    bool
	resident   int64
	measured   bool // a measurement saw it, or its reserve expired (ADM-5)
	oomKills   int64
	// checkpointing is set while a checkpoint runs: the runtime stops the guest at its end,
	// which is not an exit, and no TTL or eviction may end it meanwhile.
	checkpointing bool
	// deleting is set while a delete, or the agent ending it, stops it: likewise not an exit
	// (claimLocked); stopWhy says which.
	deleting bool
	stopWhy  string
	// incarnation is this copy's number (berth.HeldSandbox.Incarnation): set when it is
	// booked, moved on when a create re-confirms it (reconfirmLocked).
	incarnation int64
	// claim is the latest stop of this copy (claimLocked); deletes that find it in flight
	// wait for its answer (DeleteIncarnation).
	claim *stopClaim
	// startDone is set when Create is done with a copy a delete claimed while it started: it
	// stopped what it started, and the copy leaves the books once both are done.
	startDone bool
}

// stopClaim is one stop of a copy: done closes once the runtime answered, with err.
type stopClaim struct {
	done     chan struct{}
	finished bool // done is closed (read under Agent.mu)
	err      error
}

// Agent is one host agent. Create it with New, then Run it.
type Agent struct {
	cfg    Config
	rt     Runtime
	log    *slog.Logger
	credMu sync.Mutex     // guards cred
	cred   *client.Client // speaks as this agent (TRUST-1); nil until joined
	bootID string
	starts inflight.Slots // starts running at once (Config.MaxStarts, ADM-10)
	// execs counts the exec request bytes in flight (Config.ExecInflightMiB).
	execs *inflight.Bytes

	mu                        sync.Mutex
	guests                    map[string]*guest
	ended                     []berth.EndedSandbox
	draining                  bool   // an operator's drain (AGT-5); see drainingLocked
	drainReason               string // the operator's reason for draining
	shuttingDown              bool   // the agent is stopping (AGT-5): closed for good
	noticeReason              string // the latest notice that cordoned the host ("aws rebalance notice", …)
	measureErrs               int64
	oomKillsTotal             int64 // OOM kills in this boot's guests, ended ones included (C09)
	pressure                  float64
	criticalTicks             int                    // consecutive measurements past the ADM-9 line
	notices                   map[string]bool        // notice ids already acted on (C13)
	hardNotice                bool                   // a real interruption is coming: no soft cordon expiry
	softUntil                 time.Time              // end of a soft cordon (C15); zero when none
	gate                      admission.PressureGate // ADM-8 hysteresis over pressure
	cpuUsed                   float64
	lastCPUBusy, lastCPUTotal uint64
	kick                      chan struct{} // asks the heartbeat loop to send now
	heartbeatSeq              int64         // the Seq of this boot's latest heartbeat (C32)
	hbBase                    heartbeatBase // what the server acknowledged holding: deltas go against it (issue 16, goal 2)
	incarnations              int64         // the latest incarnation given a copy (nextIncarnationLocked)

	ln   net.Listener
	addr string

	// appTransport carries proxied app requests into sandboxes (APP-1), keeping
	// connections alive per sandbox and port.
	appTransport *http.Transport

	ckpt Checkpointer // nil when the runtime cannot checkpoint or there is no snapshot store
	info RuntimeInfo

	warm warmState // the warm pool (warmpool.go); a.mu guards it
}

// New validates cfg, opens the internal API listener and returns an agent ready to Run.
// Errors: an invalid mode or pool, a headroom not below the memory budget (invalid_request,
// naming both in MiB), or a listener that cannot be opened.
func New(cfg Config, rt Runtime) (*Agent, error) {
	if !admission.ValidMode(cfg.Admission) {
		return nil, fmt.Errorf("agent: invalid admission mode %q", cfg.Admission)
	}
	if cfg.Pool == "" {
		cfg.Pool = berth.PoolStateful
	}
	if cfg.Pool != berth.PoolStateful && cfg.Pool != berth.PoolEphemeral {
		return nil, fmt.Errorf("agent: invalid pool %q", cfg.Pool)
	}
	if cfg.Preemptible && cfg.Pool != berth.PoolEphemeral {
		return nil, fmt.Errorf("agent: a preemptible agent must be in the ephemeral pool (POOL-1)")
	}
	def := DefaultConfig()
	cfg.HeartbeatInterval = conf.Or(cfg.HeartbeatInterval, def.HeartbeatInterval)
	if cfg.MeasureInterval <= 0 {
		cfg.MeasureInterval = min(def.MeasureInterval, cfg.HeartbeatInterval)
	}
	cfg.ReserveTTL = conf.Or(cfg.ReserveTTL, def.ReserveTTL)
	cfg.MaxStarts = conf.Or(cfg.MaxStarts, def.MaxStarts)
	cfg.StartSlotWait = conf.Or(cfg.StartSlotWait, def.StartSlotWait)
	if cfg.ExecInflightMiB == 0 {
		cfg.ExecInflightMiB = def.ExecInflightMiB
	}
	if cfg.Listen == "" {
		cfg.Listen = def.Listen
	}
	if cfg.EvictFloorMiB <= 0 {
		cfg.EvictFloorMiB = max(cfg.MemoryMiB/20, 64)
	}
	cfg.LinkMiBps = conf.Or(cfg.LinkMiBps, def.LinkMiBps)
	if len(cfg.Region) > berth.MaxRegionBytes {
		return nil, berth.Errorf(berth.EInvalidRequest, "agent: region %q is longer than %d bytes: no create could name it", cfg.Region, berth.MaxRegionBytes)
	}
	if cfg.SoftCordon < 0 {
		return nil, berth.Errorf(berth.EInvalidRequest, "agent: soft cordon %s is negative (want a duration such as 30m; 0 means the default)", cfg.SoftCordon)
	}
	cfg.SoftCordon = conf.Or(cfg.SoftCordon, def.SoftCordon)
	cfg.EvictPressure = conf.Or(cfg.EvictPressure, def.EvictPressure)
	if cfg.Pressure.Close <= 0 {
		cfg.Pressure = def.Pressure
	}
	if cfg.PressureSource == nil {
		cfg.PressureSource = ProcPressure
	}
	if cfg.MemoryMiB <= 0 {
		cfg.MemoryMiB = hostMemoryMiB()
	}
	if cfg.HeadroomMiB < 0 || cfg.HeadroomMiB >= cfg.MemoryMiB {
		// Admittable would be 0 for ever (ADM-6): an agent that can never admit is a mistake.
		return nil, berth.Errorf(berth.EInvalidRequest, "agent: headroom %d MiB leaves nothing of the memory budget of %d MiB to admit "+
			"(want 0 <= headroom < budget: lower --headroom-mb or raise the budget)", cfg.HeadroomMiB, cfg.MemoryMiB)
	}
	if err := validWarmPool(cfg.WarmPool); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ID == "" {
		h, _ := os.Hostname()
		cfg.ID = h
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("agent: listen %s: %w", cfg.Listen, err)
	}
	a := &Agent{
		cfg:    cfg,
		warm:   newWarmState(),
		log:    cfg.Logger.With("agent", cfg.ID),
		bootID: randomID(),
		starts: inflight.NewSlots(cfg.MaxStarts),
		execs:  inflight.New(inflight.MiB(cfg.ExecInflightMiB)),
		guests: map[string]*guest{},
		kick:   make(chan struct{}, 1),
		gate:   cfg.Pressure,
		ln:     ln,
		addr:   scheme(cfg.TLS) + "://" + advertised(cfg.Advertise, ln.Addr()),
	}
	// Every call by sandbox id goes through the aliases: a sandbox handed out of the warm
	// pool runs as the warm guest's runtime id.
	a.rt = aliasRuntime{Runtime: rt, ids: a.warm.ids}
	a.appTransport = a.newAppTransport()
	if c, ok := rt.(Checkpointer); ok && cfg.SnapshotStore != nil {
		a.ckpt = aliasCheckpointer{Checkpointer: c, ids: a.warm.ids}
		if a.cfg.SnapshotDir == "" {
			a.cfg.SnapshotDir = filepath.Join(os.TempDir(), "berth-snapshots-"+a.bootID)
		}
	}
	if d, ok := rt.(interface{ Info() RuntimeInfo }); ok {
		a.info = d.Info()
	}
	return a, nil
}

// scheme is the internal API's URL scheme: https when it serves TLS.
func scheme(t *tls.Config) string {
	if t != nil {
		return "https"
	}
	return "http"
}

// Run serves the internal API, measures guests and heartbeats until ctx ends, then stops
// every sandbox it holds and returns. Sandboxes never outlive their agent's Run.
func (a *Agent) Run(ctx context.Context) error {
	srv, ln := a.cfg.Bounds.Serve(a.ln, a.Handler(), func(*http.Request) bool { return true })
	tlsconf.WarnPlaintext(a.log, a.cfg.TLS, a.ln.Addr(), "the agent's internal API")
	errc := make(chan error, 1)
	go func() { errc <- tlsconf.Serve(srv, ln, a.cfg.TLS, a.log) }()
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); a.measureLoop(ctx) }()
	go func() { defer wg.Done(); a.heartbeatLoop(ctx) }()
	go func() { defer wg.Done(); a.warmLoop(ctx) }()
	if a.cfg.Notices != nil {
		notices := make(chan preempt.Notice, 16)
		wg.Add(2)
		go func() { defer wg.Done(); _ = a.cfg.Notices.Watch(ctx, notices) }()
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case n := <-notices:
					a.HandleNotice(n, time.Now())
				}
			}
		}()
	}
	a.log.Info("agent up", "address", a.addr, "admission", a.cfg.Admission,
		"memory_mb", a.cfg.MemoryMiB, "headroom_mb", a.cfg.HeadroomMiB, "runtime", a.info.Name,
		"platform", a.info.Platform, "isolated", a.info.Isolated, "checkpoint", a.ckpt != nil,
		"warm_pool", warmString(a.cfg.WarmPool))
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.beginShutdown()
	a.sendHeartbeat(shut)
	_ = srv.Shutdown(shut)
	a.appTransport.CloseIdleConnections()
	wg.Wait()
	a.mu.Lock()
	warm := a.releaseWarmLocked()
	a.mu.Unlock()
	a.stopWarm(shut, warm, "agent shutting down")
	a.stopAll(shut)
	// The last word: the sandboxes it stopped are stopped, not left running in the store
	// for the next boot to call lost.
	a.sendHeartbeat(shut)
	return err
}

// stopAll stops every guest and reports each as stopped ("agent shut down") on the next
// heartbeat.
func (a *Agent) stopAll(ctx context.Context) {
	a.mu.Lock()
	ids := make([]string, 0, len(a.guests))
	for id := range a.guests {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	for _, id := range ids {
		if err := a.rt.Stop(ctx, id); err != nil {
			a.log.Warn("stop on shutdown", "sandbox", id, "err", err)
			continue
		}
		a.mu.Lock()
		delete(a.guests, id)
		a.ended = append(a.ended, berth.EndedSandbox{ID: id, State: berth.SandboxStopped, Reason: "agent shut down", At: time.Now().UTC()})
		a.mu.Unlock()
	}
}

// intakeOpenLocked reports whether the agent takes creates: not draining (AGT-5) and the
// pressure gate open (ADM-8). The caller holds a.mu.
func (a *Agent) intakeOpenLocked() bool { return !a.drainingLocked() && !a.gate.Closed() }

// beginShutdown closes intake for good (AGT-5): a stopping agent drains first and says so at
// once, so no replica places on it while its sandboxes stop. It is a cause of its own, which
// an operator's undrain does not lift (found by an attack: an undrain in the seconds before
// the listener closed reopened the host, and its last heartbeat announced it open).
func (a *Agent) beginShutdown() {
	a.mu.Lock()
	a.shuttingDown = true
	a.mu.Unlock()
	a.log.Info("draining", "reason", "agent shutting down")
}

// drainingLocked reports whether intake is closed by a drain: an operator's (draining,
// AGT-5), the agent's own shutdown (shuttingDown), a real preemption notice (hardNotice) or
// a soft cordon not yet expired (softUntil, C15). Each is lifted on its own: an undrain does
// not open a host a notice cordoned or one shutting down, and a soft cordon's expiry does not
// open one an operator drained. The caller holds a.mu.
func (a *Agent) drainingLocked() bool {
	return a.draining || a.shuttingDown || a.hardNotice || !a.softUntil.IsZero()
}

// drainReasonLocked says why intake is closed by a drain (Heartbeat.StatusReason): the
// notice's cordon and the operator's drain, each while in force; "" when neither is. The
// caller holds a.mu.
func (a *Agent) drainReasonLocked() string {
	var why []string
	if a.shuttingDown {
		why = append(why, "agent shutting down")
	}
	if a.hardNotice || !a.softUntil.IsZero() {
		why = append(why, a.noticeReason)
	}
	if a.draining {
		why = append(why, a.drainReason)
	}
	return strings.Join(slices.DeleteFunc(why, func(s string) bool { return s == "" }), "; ")
}

// admittableLocked computes the host's admittable MiB with the one formula (ADM-6). The
// caller holds a.mu.
func (a *Agent) admittableLocked() int64 {
	h := admission.Host{
		Mode:        a.cfg.Admission,
		TotalMiB:    a.cfg.MemoryMiB,
		HeadroomMiB: a.cfg.HeadroomMiB,
		IntakeOpen:  a.intakeOpenLocked(),
		Guests:      make([]admission.Guest, 0, len(a.guests)),
	}
	for _, g := range a.guests {
		h.Guests = append(h.Guests, admission.Guest{
			ConfiguredMiB: g.spec.MemoryMiB,
			ResidentMiB:   g.resident,
			Stateful:      g.spec.Stateful,
			Measured:      g.measured,
		})
	}
	return admission.Admittable(h)
}

// advertised is the HOST:PORT the servers dial: adv, with the listener's port when adv names
// no port, or the listener's address when adv is "".
func advertised(adv string, ln net.Addr) string {
	if adv == "" {
		return ln.String()
	}
	if _, _, err := net.SplitHostPort(adv); err == nil {
		return adv
	}
	_, port, _ := net.SplitHostPort(ln.String())
	return net.JoinHostPort(strings.Trim(adv, "[]"), port)
}

func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func hostMemoryMiB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kb int64
	if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err != nil {
		return 0
	}
	return kb / 1024
}

func cpuTotal() float64 { return float64(runtime.NumCPU()) }
