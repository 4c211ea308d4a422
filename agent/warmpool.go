package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
)

// WarmPoolEntry asks the agent to keep Size sandboxes of Template, MemoryMiB each, started
// ahead of demand (issue 16, goal 5). A create of that template and memory size, with no
// volume and no restore image, is handed one of them instead of waiting for a start.
type WarmPoolEntry struct {
	Template  string
	MemoryMiB int64
	Size      int
}

// warmIDPrefix starts the runtime id of every warm guest. The agent refuses creates whose
// id starts with it, so a sandbox id can never name a warm guest in the runtime.
const warmIDPrefix = "berth-warm-"

// maxWarmPerTemplate bounds one entry's size: a pool is a few guests per template, not a
// fleet (a typo such as shell=200 is refused rather than filling the host).
const maxWarmPerTemplate = 64

// warmGuest is one guest of the pool: started (ready to hand out) or still starting. The
// pool's guests are charged by admission like any guest in admittableWithPoolLocked, and
// never listed on the heartbeat: the server does not know them.
type warmGuest struct {
	rtID       string
	entry      WarmPoolEntry
	started    bool
	admittedAt time.Time
	resident   int64
	measured   bool
}

// warmState is the pool's books; a.mu guards everything but ids (its own lock, read on
// every runtime call).
type warmState struct {
	guests    map[string]*warmGuest // by runtime id
	hits      map[string]int64      // by template, since boot
	misses    map[string]int64
	failures  map[string]int       // consecutive failed starts, by template
	failUntil map[string]time.Time // no start of the template before
	wake      chan struct{}        // asks the refill loop for a round now
	ids       *aliases
}

func newWarmState() warmState {
	return warmState{guests: map[string]*warmGuest{}, hits: map[string]int64{}, misses: map[string]int64{},
		failures: map[string]int{}, failUntil: map[string]time.Time{}, wake: make(chan struct{}, 1), ids: newAliases()}
}

// validWarmPool checks the pool's entries: a template named once, a positive memory size,
// a size in 0..64. Errors: invalid_request.
func validWarmPool(entries []WarmPoolEntry) error {
	seen := map[string]bool{}
	for _, e := range entries {
		switch {
		case e.Template == "":
			return berth.Errorf(berth.EInvalidRequest, "warm pool: a template name is required")
		case seen[e.Template]:
			return berth.Errorf(berth.EInvalidRequest, "warm pool: template %q named twice", e.Template)
		case e.MemoryMiB < berth.MinSandboxMiB:
			// No create may ask for less (the API's floor), so such a guest would never serve one.
			return berth.Errorf(berth.EInvalidRequest, "warm pool: template %q needs a memory size of at least %d MiB", e.Template, berth.MinSandboxMiB)
		case e.Size < 0 || e.Size > maxWarmPerTemplate:
			return berth.Errorf(berth.EInvalidRequest, "warm pool: template %q size %d is outside 0..%d", e.Template, e.Size, maxWarmPerTemplate)
		}
		seen[e.Template] = true
	}
	return nil
}

// warmMatch returns the pool entry that can serve create c: same template and memory size,
// no volume (mounted at start) and no restore image. ok is false otherwise.
func warmMatch(entries []WarmPoolEntry, c berth.AgentCreate) (WarmPoolEntry, bool) {
	if c.Volume != "" || c.RestoreImage != "" {
		return WarmPoolEntry{}, false
	}
	for _, e := range entries {
		if e.Size > 0 && e.Template == c.Template && e.MemoryMiB == c.MemoryMiB {
			return e, true
		}
	}
	return WarmPoolEntry{}, false
}

// pooled reports whether template has a pool on this agent (its creates count as hits or
// misses).
func pooled(entries []WarmPoolEntry, template string) bool {
	return slices.ContainsFunc(entries, func(e WarmPoolEntry) bool { return e.Size > 0 && e.Template == template })
}

// takeWarm serves create c from the pool when it can: a started warm guest of the same
// template and memory size becomes sandbox c.ID at once, with no start and no start slot,
// after the same local gate as any create (intake open, charge fits what the agent
// publishes). It reports whether c was served; false sends c down the cold path. Every
// create of a pooled template counts as a hit or a miss.
func (a *Agent) takeWarm(c berth.AgentCreate) bool {
	if len(a.cfg.WarmPool) == 0 || c.RestoreImage != "" {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !pooled(a.cfg.WarmPool, c.Template) {
		return false
	}
	e, ok := warmMatch(a.cfg.WarmPool, c)
	var w *warmGuest
	if ok && a.intakeOpenLocked() {
		if _, held := a.guests[c.ID]; !held {
			w = a.readyWarmLocked(e.Template)
		}
	}
	if w != nil && !admission.Fits(a.admittableLocked(), 0, admission.Charge(a.cfg.Admission, c.MemoryMiB, c.Stateful)) {
		w = nil // the cold path refuses it with the figures
	}
	if w == nil {
		a.warm.misses[c.Template]++
		return false
	}
	delete(a.warm.guests, w.rtID)
	now := time.Now()
	a.warm.ids.set(c.ID, w.rtID)
	a.guests[c.ID] = &guest{spec: c, admittedAt: now, expires: ttlEnd(c, now), started: true,
		resident: w.resident, measured: w.measured, incarnation: a.nextIncarnationLocked()}
	a.warm.hits[c.Template]++
	a.wakeWarm()
	a.log.Info("sandbox started from the warm pool", "sandbox", c.ID, "warm_guest", w.rtID, "template", c.Template, "memory_mb", c.MemoryMiB)
	return true
}

// readyWarmLocked returns the oldest started warm guest of template, or nil.
func (a *Agent) readyWarmLocked(template string) *warmGuest {
	var best *warmGuest
	for _, w := range a.warm.guests {
		if w.started && w.entry.Template == template && (best == nil || w.admittedAt.Before(best.admittedAt)) {
			best = w
		}
	}
	return best
}

// admittableWithPoolLocked is admittableLocked with the warm guests charged too (ADM-6's
// one formula): the room the host really has. The agent publishes admittableLocked, which
// leaves the pool out, because a create that needs the pool's room takes it
// (makeRoomFromPoolLocked). The caller holds a.mu.
func (a *Agent) admittableWithPoolLocked() int64 {
	h := admission.Host{
		Mode:        a.cfg.Admission,
		TotalMiB:    a.cfg.MemoryMiB,
		HeadroomMiB: a.cfg.HeadroomMiB,
		IntakeOpen:  a.intakeOpenLocked(),
		Guests:      make([]admission.Guest, 0, len(a.guests)+len(a.warm.guests)),
	}
	for _, g := range a.guests {
		h.Guests = append(h.Guests, admission.Guest{ConfiguredMiB: g.spec.MemoryMiB, ResidentMiB: g.resident,
			Stateful: g.spec.Stateful, Measured: g.measured})
	}
	for _, w := range a.warm.guests {
		h.Guests = append(h.Guests, w.admissionGuest())
	}
	return admission.Admittable(h)
}

func (w *warmGuest) admissionGuest() admission.Guest {
	return admission.Guest{ConfiguredMiB: w.entry.MemoryMiB, ResidentMiB: w.resident, Measured: w.measured}
}

// makeRoomFromPoolLocked takes warm guests off the books, largest charge first, until a
// create charged chargeMiB fits the host's real room, and returns their runtime ids for
// the caller to stop before it starts the create (issue 16, goal 5: the pool never makes a
// host refuse a real create). The caller holds a.mu and has already checked that the
// charge fits admittableLocked, so emptying the pool always makes it fit.
func (a *Agent) makeRoomFromPoolLocked(chargeMiB int64) []string {
	var victims []string
	for len(a.warm.guests) > 0 && !admission.Fits(a.admittableWithPoolLocked(), 0, chargeMiB) {
		var v *warmGuest
		for _, w := range a.warm.guests {
			if v == nil || a.warmCharge(w) > a.warmCharge(v) || (a.warmCharge(w) == a.warmCharge(v) && w.rtID < v.rtID) {
				v = w
			}
		}
		delete(a.warm.guests, v.rtID)
		victims = append(victims, v.rtID)
	}
	if len(victims) > 0 {
		a.wakeWarm() // it refills when room comes back
	}
	return victims
}

func (a *Agent) warmCharge(w *warmGuest) int64 {
	return admission.GuestCharge(a.cfg.Admission, w.admissionGuest(), a.cfg.MemoryMiB)
}

// releaseWarmLocked takes every warm guest off the books and returns their runtime ids to
// stop (pressure, drain, shutdown). The caller holds a.mu.
func (a *Agent) releaseWarmLocked() []string {
	ids := make([]string, 0, len(a.warm.guests))
	for id := range a.warm.guests {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	clear(a.warm.guests)
	return ids
}

// stopWarm stops warm guests already taken off the books. A guest still starting is
// stopped once its start ends (the runtime's Stop waits for it; a start not yet begun is
// stopped by warmStart when it sees its guest gone).
func (a *Agent) stopWarm(ctx context.Context, rtIDs []string, why string) {
	for _, id := range rtIDs {
		if err := a.rawRT().Stop(ctx, id); err != nil && berth.ErrorCode(err) != berth.ESandboxNotFound {
			a.log.Warn("stop warm guest", "warm_guest", id, "why", why, "err", err)
			continue
		}
		a.log.Info("warm guest released", "warm_guest", id, "why", why)
	}
}

// wakeWarm asks the refill loop for a round now; it never blocks.
func (a *Agent) wakeWarm() {
	select {
	case a.warm.wake <- struct{}{}:
	default:
	}
}

// warmLoop keeps the pool full (issue 16, goal 5): a round after every hit or release and
// every measurement interval. It refills one guest at a time, asynchronously to creates.
func (a *Agent) warmLoop(ctx context.Context) {
	if len(a.cfg.WarmPool) == 0 {
		return
	}
	t := time.NewTicker(a.cfg.MeasureInterval)
	defer t.Stop()
	for {
		a.warmRound(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.warm.wake:
		}
	}
}

// warmRound measures the pool, releases it while intake is closed (draining, ADM-8) or
// memory is critical (ADM-9), and otherwise starts the missing guests one by one while the
// host has room for them beside everything it holds.
func (a *Agent) warmRound(ctx context.Context, now time.Time) {
	a.measureWarm(ctx)
	a.mu.Lock()
	var release []string
	if !a.intakeOpenLocked() || a.criticalTicks > 0 {
		release = a.releaseWarmLocked()
	}
	a.mu.Unlock()
	if len(release) > 0 {
		a.stopWarm(ctx, release, "intake closed or memory critical (ADM-8, ADM-9)")
		return
	}
	for range maxWarmPerTemplate * len(a.cfg.WarmPool) { // bounded: one start per missing guest
		if ctx.Err() != nil || !a.warmStart(ctx, now) {
			return
		}
	}
}

// warmStart starts one missing warm guest if the host has room for it beside everything it
// holds. It never takes one of the creates' start slots (ADM-10): a create never waits for a
// refill nor is refused because of one. The refill is its own single slot (warmLoop is one
// goroutine) and starts only while creates use fewer than half of their slots, so a host busy
// starting sandboxes is not loaded further; the host runs at most --max-starts + 1 starts. It
// reports whether it started one (or tried and failed, which backs that template off).
func (a *Agent) warmStart(ctx context.Context, now time.Time) bool {
	if len(a.starts) >= max(cap(a.starts)/2, 1) {
		return false
	}
	a.mu.Lock()
	if !a.intakeOpenLocked() || a.criticalTicks > 0 {
		a.mu.Unlock()
		return false
	}
	e, ok := a.missingWarmLocked(now)
	if !ok || !admission.Fits(a.admittableWithPoolLocked(), 0, admission.Charge(a.cfg.Admission, e.MemoryMiB, false)) {
		a.mu.Unlock()
		return false
	}
	w := &warmGuest{rtID: warmIDPrefix + randomID(), entry: e, admittedAt: now}
	a.warm.guests[w.rtID] = w
	a.mu.Unlock()

	err := a.rawRT().Start(ctx, Spec{ID: w.rtID, Template: e.Template, MemoryMiB: e.MemoryMiB, VCPUs: 1})
	a.mu.Lock()
	cur := a.warm.guests[w.rtID]
	if err != nil {
		delete(a.warm.guests, w.rtID)
		a.warm.failures[e.Template]++
		back := min(time.Second<<min(a.warm.failures[e.Template]-1, 6), time.Minute)
		a.warm.failUntil[e.Template] = time.Now().Add(back)
		a.mu.Unlock()
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = a.rawRT().Stop(stop, w.rtID)
		if ctx.Err() == nil {
			a.log.Warn("warm guest did not start; retrying later", "template", e.Template, "retry_in", back, "err", err)
		}
		return true
	}
	delete(a.warm.failures, e.Template)
	if cur != w {
		// Released while it started (pressure, drain, a create that needed the room).
		a.mu.Unlock()
		a.stopWarm(context.WithoutCancel(ctx), []string{w.rtID}, "released while it started")
		return true
	}
	w.started = true
	a.mu.Unlock()
	return true
}

// missingWarmLocked returns the entry with the largest shortfall of warm guests (started or
// starting) whose start is not backed off; ok is false when the pool is full.
func (a *Agent) missingWarmLocked(now time.Time) (WarmPoolEntry, bool) {
	have := map[string]int{}
	for _, w := range a.warm.guests {
		have[w.entry.Template]++
	}
	var best WarmPoolEntry
	gap := 0
	for _, e := range a.cfg.WarmPool {
		if d := e.Size - have[e.Template]; d > gap && !now.Before(a.warm.failUntil[e.Template]) {
			best, gap = e, d
		}
	}
	return best, gap > 0
}

// measureWarm measures the started warm guests (their working set is charged like any
// guest's, ADM-3) and drops the ones whose init exited.
func (a *Agent) measureWarm(ctx context.Context) {
	a.mu.Lock()
	ids := make([]string, 0, len(a.warm.guests))
	for id, w := range a.warm.guests {
		if w.started {
			ids = append(ids, id)
		}
	}
	a.mu.Unlock()
	var dead []string
	for _, id := range ids {
		m, err := a.rawRT().Measure(id)
		if err != nil {
			continue
		}
		clamped, _ := admission.ClampResident(m.ResidentMiB, a.cfg.MemoryMiB)
		a.mu.Lock()
		if w, ok := a.warm.guests[id]; ok {
			if m.Exited {
				delete(a.warm.guests, id)
				dead = append(dead, id)
			} else {
				w.resident = clamped
				if m.Seen || time.Since(w.admittedAt) >= a.cfg.ReserveTTL {
					w.measured = true
				}
			}
		}
		a.mu.Unlock()
	}
	a.stopWarm(ctx, dead, "its init exited")
}

// warmResidentLocked is the working set of the pool, MiB, for ADM-9's reading of the host.
func (a *Agent) warmResidentLocked() int64 {
	var n int64
	for _, w := range a.warm.guests {
		n += w.resident
	}
	return n
}

// checkCreateID refuses a sandbox id that could name a warm guest in the runtime.
func checkCreateID(id string) error {
	if strings.HasPrefix(id, warmIDPrefix) {
		return berth.Errorf(berth.EInvalidRequest, "sandbox id %q: the prefix %q is the agent's own", id, warmIDPrefix)
	}
	return nil
}

// aliases maps a sandbox id the agent handed out to the runtime id of the warm guest that
// serves it; a runtime fixes a guest's identity (cgroup, bundle directory) at its start.
type aliases struct {
	mu sync.RWMutex
	m  map[string]string
}

func newAliases() *aliases { return &aliases{m: map[string]string{}} }

// of returns the runtime id of sandbox id (id itself unless a warm guest serves it).
func (al *aliases) of(id string) string {
	al.mu.RLock()
	defer al.mu.RUnlock()
	if r, ok := al.m[id]; ok {
		return r
	}
	return id
}

func (al *aliases) set(id, rtID string) {
	al.mu.Lock()
	al.m[id] = rtID
	al.mu.Unlock()
}

func (al *aliases) drop(id string) {
	al.mu.Lock()
	delete(al.m, id)
	al.mu.Unlock()
}

// dropIf ends id's alias only while it still names rtID, the runtime guest just stopped: a
// warm guest that serves a new copy of id since keeps its alias.
func (al *aliases) dropIf(id, rtID string) {
	al.mu.Lock()
	if al.m[id] == rtID {
		delete(al.m, id)
	}
	al.mu.Unlock()
}

// rawRT is the runtime itself, below the aliases: the pool starts, measures and stops its
// guests by their runtime ids.
func (a *Agent) rawRT() Runtime {
	if r, ok := a.rt.(aliasRuntime); ok {
		return r.Runtime
	}
	return a.rt
}

// aliasRuntime is the agent's view of its runtime: every call by sandbox id reaches the
// runtime guest that serves it. A stop that leaves nothing running ends the alias.
type aliasRuntime struct {
	Runtime
	ids *aliases
}

func (r aliasRuntime) Start(ctx context.Context, s Spec) error {
	s.ID = r.ids.of(s.ID)
	return r.Runtime.Start(ctx, s)
}

func (r aliasRuntime) Stop(ctx context.Context, id string) error {
	rtID := r.ids.of(id)
	err := r.Runtime.Stop(ctx, rtID)
	if err == nil || berth.ErrorCode(err) == berth.ESandboxNotFound {
		r.ids.dropIf(id, rtID)
	}
	return err
}

func (r aliasRuntime) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	return r.Runtime.Exec(ctx, r.ids.of(id), req)
}

func (r aliasRuntime) WriteFile(ctx context.Context, id, path string, content io.Reader) error {
	return r.Runtime.WriteFile(ctx, r.ids.of(id), path, content)
}

func (r aliasRuntime) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	return r.Runtime.ReadFile(ctx, r.ids.of(id), path)
}

func (r aliasRuntime) Measure(id string) (Measurement, error) { return r.Runtime.Measure(r.ids.of(id)) }

// aliasCheckpointer is the runtime's Checkpointer seen through the aliases.
type aliasCheckpointer struct {
	Checkpointer
	ids *aliases
}

func (c aliasCheckpointer) Checkpoint(ctx context.Context, id, dir string) error {
	return c.Checkpointer.Checkpoint(ctx, c.ids.of(id), dir)
}

func (c aliasCheckpointer) Restore(ctx context.Context, s Spec, dir string) error {
	s.ID = c.ids.of(s.ID)
	return c.Checkpointer.Restore(ctx, s, dir)
}

func (c aliasCheckpointer) Ping(ctx context.Context, id string) error {
	return c.Checkpointer.Ping(ctx, c.ids.of(id))
}

// aliasServices is the runtime's Services seen through the aliases.
type aliasServices struct {
	Services
	ids *aliases
}

func (s aliasServices) Serve(ctx context.Context, id string, req berth.ServiceRequest) error {
	return s.Services.Serve(ctx, s.ids.of(id), req)
}

func (s aliasServices) ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error) {
	return s.Services.ServiceStatus(ctx, s.ids.of(id))
}

func (s aliasServices) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	return s.Services.Dial(ctx, s.ids.of(id), port)
}

// warmString renders entries as the flag spells them, for the log.
func warmString(entries []WarmPoolEntry) string {
	parts := make([]string, 0, len(entries))
	for _, e := range entries {
		parts = append(parts, fmt.Sprintf("%s=%d:%d", e.Template, e.Size, e.MemoryMiB))
	}
	return strings.Join(parts, ",")
}
