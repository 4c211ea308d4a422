package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/internal/httpjson"
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, _ principal) error {
	ts, err := s.store.Templates(r.Context())
	if err != nil {
		return berth.Fault(err, "list templates")
	}
	if ts == nil {
		ts = []berth.Template{}
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"templates": ts})
	return nil
}

// putTemplate is PUT /v1/templates/{name} (admin): {"memory_mb","vcpus"}.
func (s *Server) putTemplate(w http.ResponseWriter, r *http.Request, _ principal) error {
	var t berth.Template
	if err := httpjson.Decode(w, r, maxJSONBytes, &t); err != nil {
		return err
	}
	name := r.PathValue("name")
	if t.Name != "" && t.Name != name {
		return berth.Errorf(berth.EInvalidRequest, "body name %q differs from path %q", t.Name, name)
	}
	t.Name = name
	if !nameRE.MatchString(name) || t.MemoryMiB < berth.MinSandboxMiB || t.MemoryMiB > s.cfg.MaxSandboxMiB || t.VCPUs <= 0 || t.VCPUs > maxVCPUs {
		return berth.Errorf(berth.EInvalidRequest, "template needs a lowercase name, memory_mb in %d..%d and vcpus in 1..%d",
			berth.MinSandboxMiB, s.cfg.MaxSandboxMiB, maxVCPUs)
	}
	if err := s.store.PutTemplate(r.Context(), t); err != nil {
		return berth.Fault(err, "store template")
	}
	s.templates.forget(t.Name)
	httpjson.WriteJSON(w, http.StatusOK, t)
	return nil
}

// listAgents is GET /v1/agents: the AGT-1 fields plus last_seen_s; status shows the derived
// stale and dead states (LIF-1).
func (s *Server) listAgents(w http.ResponseWriter, r *http.Request, _ principal) error {
	as, err := s.agentsHeld(r.Context(), r.URL.Query().Get("held"))
	if err != nil {
		return err
	}
	now := s.cfg.Clock()
	for i := range as {
		age := now.Sub(as[i].LastSeen)
		as[i].LastSeenS = float64(age.Milliseconds()) / 1000
		as[i].Status = derivedStatus(as[i], now, s.cfg.StaleAfter, s.cfg.DeadAfter)
	}
	if as == nil {
		as = []berth.Agent{}
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"agents": as})
	return nil
}

// agentsHeld reads every agent for GET /v1/agents with HeldCount filled in; held is the
// query's held=: "list" or "" for every held list, "count" for the counts alone — at 10,000
// hosts holding 50 each, half a million rows fewer to read and send (the dashboard's and the
// CLI's listing). Any other value is a 400.
func (s *Server) agentsHeld(ctx context.Context, held string) ([]berth.Agent, error) {
	switch held {
	case "", "list":
		as, err := s.store.Agents(ctx)
		if err != nil {
			return nil, berth.Fault(err, "list agents")
		}
		for i := range as {
			as[i].HeldCount = len(as[i].Sandboxes)
		}
		return as, nil
	case "count":
		as, err := fleetAgents(ctx, s.store)
		if err != nil {
			return nil, berth.Fault(err, "list agents")
		}
		counts, err := s.store.HeldCounts(ctx)
		if err != nil {
			return nil, berth.Fault(err, "count held sandboxes")
		}
		for i := range as {
			as[i].Sandboxes = []berth.HeldSandbox{}
			as[i].HeldCount = counts[as[i].AgentID]
		}
		slices.SortFunc(as, func(a, b berth.Agent) int { return strings.Compare(a.AgentID, b.AgentID) })
		return as, nil
	}
	return nil, berth.Errorf(berth.EInvalidRequest, "held must be list or count, not %q", held)
}

type drainBody struct {
	Reason string `json:"reason"`
}

func (s *Server) drainAgent(w http.ResponseWriter, r *http.Request, p principal) error {
	return s.setDrain(w, r, p, true)
}

func (s *Server) undrainAgent(w http.ResponseWriter, r *http.Request, p principal) error {
	return s.setDrain(w, r, p, false)
}

// setDrain marks the agent row (every replica's placement honours it on its next read, and
// this one at once), then tells the agent so it closes its own intake (AGT-5). The agent
// call is best effort: the row alone already stops placement.
func (s *Server) setDrain(w http.ResponseWriter, r *http.Request, p principal, draining bool) error {
	var b drainBody
	if r.ContentLength != 0 {
		if err := httpjson.Decode(w, r, maxJSONBytes, &b); err != nil {
			return err
		}
	}
	if err := berth.CheckReason(b.Reason); err != nil {
		return err
	}
	if draining && b.Reason == "" {
		b.Reason = "operator"
	}
	id, err := agentIDParam(r)
	if err != nil {
		return err
	}
	err = s.store.SetAgentDrain(r.Context(), id, draining, b.Reason, p.actor(), s.cfg.Clock())
	if errors.Is(err, berth.ErrNotFound) {
		return berth.Errorf(berth.ENotFound, "no agent %q", id)
	}
	if errors.Is(err, berth.ErrRevoked) {
		return berth.Errorf(berth.EConflict, "agent %q was revoked by an admin: it stays drained", id)
	}
	if err != nil {
		return berth.Fault(err, "record drain")
	}
	if a, err := s.store.Agent(r.Context(), id); err == nil {
		s.sched.observe(a)
		if err := s.agents.drain(r.Context(), agentAt{a.AgentID, a.Address}, draining, b.Reason); err != nil {
			s.log.Warn("agent did not take the drain call; the store mark holds", "agent", id, "err", err)
		}
	}
	status := http.StatusOK
	if draining {
		status = http.StatusAccepted
	}
	httpjson.WriteJSON(w, status, map[string]any{"agent_id": id, "draining": draining, "reason": b.Reason})
	return nil
}

// heartbeatBody is a heartbeat as agents send it: the fields of berth.Heartbeat, and two an
// agent of the previous release still sends — natid_free and stream_restore_enabled, retired
// in issue 14 because nothing read them — accepted and ignored, so a rolling upgrade does not
// turn every old agent's heartbeat into a 400 under strict decoding.
type heartbeatBody struct {
	berth.Heartbeat
	RetiredNatIDFree     json.RawMessage `json:"natid_free,omitempty"`
	RetiredStreamRestore json.RawMessage `json:"stream_restore_enabled,omitempty"`
}

// heartbeat is POST /v1/agents/heartbeat with the agent's credential (AGT-1, TRUST-1). It records the
// heartbeat, nets the ledger (LED-4) and applies the agent's ended sandboxes in one store
// transaction, then folds the agent into this replica's snapshot. The answer is 200 with a
// berth.HeartbeatAck (issue 16, goal 2): the seq now held, on which the agent may send deltas,
// or resync when a delta's base is not the one the store holds (only its ended list applied).
// An agent of the previous release reads no body and sends whole lists: nothing changes for it.
func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	// Received now: stamped before any work of the server's, so a slow credential read or
	// body does not make a heartbeat look younger than it is (last_seen; settleUnheld
	// compares it with when a sandbox entered running).
	now := s.cfg.Clock()
	cred, credHash, cached, err := s.heartbeatCredential(r.Context(), r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var body heartbeatBody
	err = httpjson.Decode(w, r, maxHeartbeatBytes, &body)
	hb := body.Heartbeat
	hb.StatusReason = excerpt(hb.StatusReason) // it goes into an event: bounded like an app's reason
	if err == nil {
		err = validateHeartbeat(hb)
	}
	if err == nil {
		err = s.checkAgentAddress(hb.Address)
	}
	if err == nil {
		// TRUST-1: only the credential bound to hb.AgentID may announce it or report its
		// ended sandboxes; another agent's credential is 403, a revoked or unknown one 401.
		err = sameAgent(cred, hb.AgentID)
	}
	if err != nil {
		s.writeError(w, r, s.uncacheRevoked(r.Context(), credHash, cached, err))
		return
	}
	res, err := s.store.RecordHeartbeat(r.Context(), hb, credHash, now)
	if errors.Is(err, berth.ErrRevoked) {
		// Revoked, by an admin or a rejoin, before or while this heartbeat was on its way: it
		// is not applied (TRUST-1). The credential leaves the cache, and the store says which.
		s.heartbeatCreds.forget(credHash)
		s.writeError(w, r, s.uncacheRevoked(r.Context(), credHash, true,
			berth.Errorf(berth.EUnauthorized, "agent credential revoked; join again under a new agent id")))
		return
	}
	if err != nil {
		s.writeError(w, r, berth.Fault(err, "record heartbeat"))
		return
	}
	for _, e := range hb.Ended {
		s.metrics.ended.WithLabelValues(string(e.State)).Inc()
	}
	ack := berth.HeartbeatAck{Resync: res.Resync}
	if res.Applied {
		ack.Seq = hb.Seq
		s.sched.observe(res.Agent)
		s.stopEnded(hb)
	}
	httpjson.WriteJSON(w, http.StatusOK, ack)
}

// stopForgetAfter is how long after its last AGT-6 sweep on this replica an agent's memory
// here (stopSwept, stopLive) is dropped (forgetStopRounds): ten times Config.HeldSweepEvery.
// An agent heartbeating to this replica is swept every HeldSweepEvery, so one not swept for
// this long went away or heartbeats elsewhere now; if it comes back, its next heartbeat
// sweeps at once, as for an agent met for the first time.
func (s *Server) stopForgetAfter() time.Duration { return 10 * s.cfg.HeldSweepEvery }

// forgetStopRounds drops the AGT-6 memory of agents not swept for stopForgetAfter, at most
// once per Config.HeldSweepEvery (the sweeper calls it every sweep): without it, a replica kept an
// entry for every agent id it ever met, which grows without bound with churning ids.
func (s *Server) forgetStopRounds(now time.Time) {
	if last := s.stopForgotAt.Load(); last != 0 && since(now, last) < s.cfg.HeldSweepEvery {
		return
	}
	s.stopForgotAt.Store(now.UnixNano())
	s.stopSwept.Range(func(id, at any) bool {
		if now.Sub(at.(time.Time)) >= s.stopForgetAfter() {
			s.stopSwept.Delete(id)
			s.stopLive.Delete(id)
		}
		return true
	})
}

// liveHeld is what one stopEnded round found live in the store among the sandboxes an
// agent of one boot holds. It is replaced, never changed, so heartbeats read it unlocked.
type liveHeld struct {
	boot string
	ids  map[string]struct{}
}

// has reports whether id was found live for this boot.
func (l *liveHeld) has(boot, id string) bool {
	if l == nil || l.boot != boot {
		return false
	}
	_, ok := l.ids[id]
	return ok
}

// stopEnded tells an agent to stop the sandboxes it still runs that the store has ended or
// never knew (AGT-6): lost while the agent was cut off, or orphans of a dead replica. It runs
// in the background, one round per agent at a time and at most maxStopRounds at once (a round
// that finds every slot taken waits its turn, agentCalls), so a heartbeat is never slowed by
// it. A whole list is checked whole; a delta's listed sandboxes are checked at
// once unless a round already found them live for this boot (a delta lists a sandbox whenever
// its working set moves, and re-reading it each time cost a query per heartbeat); and every
// sandbox the store says the agent holds at most every Config.HeldSweepEvery (issue 16, goal
// 2). So
// a new sandbox the store does not know is stopped at once, and one the store ended while the
// agent kept it within HeldSweepEvery and an interval.
func (s *Server) stopEnded(hb berth.Heartbeat) {
	var held []berth.HeldCopy
	live, _ := s.stopLive.Load(hb.AgentID)
	known, _ := live.(*liveHeld)
	for _, h := range hb.Sandboxes {
		if !h.Starting && (!hb.Delta || !known.has(hb.BootID, h.ID)) {
			held = append(held, berth.HeldCopy{ID: h.ID, Boot: hb.BootID, Incarnation: h.Incarnation})
		}
	}
	now := s.cfg.Clock()
	sweep := !hb.Delta // a whole list is a sweep
	if hb.Delta {
		last, ok := s.stopSwept.Load(hb.AgentID)
		sweep = !ok || now.Sub(last.(time.Time)) >= s.cfg.HeldSweepEvery
	}
	if len(held) == 0 && !sweep {
		return
	}
	// A round of this agent's that runs drops this one (its next heartbeat asks again). One
	// that waits for a slot (a replica that just met thousands of agents, or agents whose
	// rounds never end) sweeps when its turn comes: everything the store says the agent holds,
	// which this heartbeat's list is already part of — so the queue keeps an id, not a list.
	// A sweep is recorded only once its round starts: one skipped must not put the next one
	// off by HeldSweepEvery.
	whole := berth.Heartbeat{AgentID: hb.AgentID, Address: hb.Address, BootID: hb.BootID, Delta: true}
	s.stopRounds.run(hb.AgentID, "stop round", func() {
		if sweep {
			s.stopSwept.Store(hb.AgentID, now)
		}
		s.stopRound(hb, held, sweep)
	}, func() { // whole alone: a waiting round must not keep the heartbeat's list alive
		s.stopSwept.Store(whole.AgentID, s.cfg.Clock())
		s.stopRound(whole, nil, true)
	})
}

// stopRound is one AGT-6 round of stopEnded for hb's agent: held (or, for a sweep, everything
// the store says it holds) is checked against the store, and each ended sandbox is stopped,
// and each stale copy (its sandbox placed on another agent or on none) while it is the
// boot and incarnation checked. What it finds live and the agent's own is remembered for the agent's
// boot: in place of what was remembered when the round checked everything the agent holds
// (whole), added to it otherwise. It runs as one of the agent's calls (agentCalls.run).
func (s *Server) stopRound(hb berth.Heartbeat, held []berth.HeldCopy, whole bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var checked []string
	var c berth.HeldCheck
	var err error
	if whole && hb.Delta { // a sweep: what the store says the agent holds, in one read
		checked, c, err = s.store.HeldEnded(ctx, hb.AgentID)
	} else {
		checked = make([]string, len(held))
		for i, h := range held {
			checked[i] = h.ID
		}
		c, err = s.store.EndedSandboxes(ctx, hb.AgentID, held)
	}
	if err != nil {
		return
	}
	notOurs := slices.Clone(c.Ended)
	for _, cp := range c.Stale {
		notOurs = append(notOurs, cp.ID)
	}
	s.rememberLive(hb.AgentID, hb.BootID, checked, notOurs, whole)
	at := agentAt{hb.AgentID, hb.Address}
	for _, id := range c.Ended {
		s.log.Warn("stopping a sandbox the store has ended (AGT-6)", "sandbox", id, "agent", hb.AgentID)
		if err := s.agents.delete(ctx, at, id); err != nil {
			s.log.Warn("could not stop it; a later heartbeat retries", "sandbox", id, "agent", hb.AgentID, "err", err)
		}
	}
	for _, cp := range c.Stale {
		s.stopStale(ctx, at, cp)
	}
}

// stopStale stops agent at's stale copy cp (AGT-6): its sandbox is live, but the store places
// it on another agent or on none (paused), so the copy is left over from a create or a
// checkpoint whose answer was lost, and runs the tenant's code a second time. The agent stops
// it only while it is incarnation cp.Incarnation of boot cp.Boot: a copy placed there again
// since (a resume that landed on it, in this boot or after a restart) is spared with 409
// conflict. A copy from an agent that does not number them (0) is not stopped: its delete
// could not spare one placed there again.
func (s *Server) stopStale(ctx context.Context, at agentAt, cp berth.HeldCopy) {
	if cp.Incarnation <= 0 || cp.Boot == "" {
		s.log.Warn("a sandbox placed elsewhere runs here too; this agent does not number its copies, so it is left to its TTL (AGT-6)",
			"sandbox", cp.ID, "agent", at.ID)
		return
	}
	s.log.Warn("stopping a copy of a sandbox the store places elsewhere (AGT-6)", "sandbox", cp.ID, "agent", at.ID,
		"boot", cp.Boot, "incarnation", cp.Incarnation)
	err := s.agents.deleteStale(ctx, at, cp)
	switch {
	case berth.ErrorCode(err) == berth.EConflict:
		s.log.Info("not stopped: placed on that agent again since", "sandbox", cp.ID, "agent", at.ID)
	case err != nil:
		s.log.Warn("could not stop it; a later heartbeat retries", "sandbox", cp.ID, "agent", at.ID, "err", err)
	}
}

// rememberLive records which of checked the store holds live (not in ended) for agentID's
// boot: replacing what was remembered (whole) or added to it.
func (s *Server) rememberLive(agentID, boot string, checked, ended []string, whole bool) {
	next := &liveHeld{boot: boot, ids: map[string]struct{}{}}
	if old, ok := s.stopLive.Load(agentID); ok && !whole && old.(*liveHeld).boot == boot {
		maps.Copy(next.ids, old.(*liveHeld).ids)
	}
	for _, id := range checked {
		next.ids[id] = struct{}{}
	}
	for _, id := range ended {
		delete(next.ids, id)
	}
	s.stopLive.Store(agentID, next)
}

// checkAgentAddress refuses an address this replica cannot or must not dial (400
// invalid_request): anything but an http:// or https:// base URL with a host, and http://
// while Config.RequireAgentTLS (issue 15, point 2: the server's calls carry the node token
// and tenants' files).
func (s *Server) checkAgentAddress(addr string) error {
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return berth.Errorf(berth.EInvalidRequest, "address %q must be the agent's base URL, http://HOST:PORT or https://HOST:PORT", addr)
	}
	if s.cfg.RequireAgentTLS && u.Scheme != "https" {
		return berth.Errorf(berth.EInvalidRequest, "this server calls agents over TLS only, and the address %s is http://: start the agent with --tls-cert and --tls-key", addr)
	}
	return nil
}

func validateHeartbeat(hb berth.Heartbeat) error {
	switch {
	case berth.CheckAgentID(hb.AgentID) != nil:
		return berth.CheckAgentID(hb.AgentID)
	case !admission.ValidMode(hb.MemoryAdmission):
		return berth.Errorf(berth.EInvalidRequest, "memory_admission must be committed, working-set or none")
	case heartbeatFigures(hb) != nil:
		return heartbeatFigures(hb)
	case hb.Status != "" && hb.Status != berth.AgentActive && hb.Status != berth.AgentDraining:
		return berth.Errorf(berth.EInvalidRequest, "status must be active or draining")
	case len(hb.Region) > berth.MaxRegionBytes:
		return berth.Errorf(berth.EInvalidRequest, "region is longer than %d bytes: no create could name it", berth.MaxRegionBytes)
	case max(len(hb.Address), len(hb.Version), len(hb.BootID), len(hb.Runtime)) > maxAgentTextBytes:
		// Kept on the agent's row and in every listing of the fleet (found by an attack:
		// 200 KB each were stored).
		return berth.Errorf(berth.EInvalidRequest, "address, version, boot_id and runtime must be at most %d bytes each", maxAgentTextBytes)
	case hb.Pool != "" && hb.Pool != berth.PoolStateful && hb.Pool != berth.PoolEphemeral:
		return berth.Errorf(berth.EInvalidRequest, "pool must be stateful or ephemeral")
	case hb.Preemptible && hb.Pool != berth.PoolEphemeral:
		return berth.Errorf(berth.EInvalidRequest, "a preemptible agent must be ephemeral (POOL-1)")
	case hb.Seq < 0:
		return berth.Errorf(berth.EInvalidRequest, "seq must be 0 (unnumbered) or count this boot's heartbeats from 1 (C32)")
	case hb.Delta && (hb.Seq <= 0 || hb.BaseSeq <= 0 || hb.BaseSeq >= hb.Seq):
		return berth.Errorf(berth.EInvalidRequest, "a delta heartbeat needs 0 < base_seq < seq: the acknowledged heartbeat it follows")
	case !hb.Delta && (hb.BaseSeq != 0 || len(hb.Removed) > 0):
		return berth.Errorf(berth.EInvalidRequest, "base_seq and removed belong to a delta heartbeat (delta: true) only")
	}
	for _, e := range hb.Ended {
		if !e.State.Terminal() {
			return berth.Errorf(berth.EInvalidRequest, "ended sandbox %s has non-terminal state %q", e.ID, e.State)
		}
	}
	// A NUL in any string was refused as the body was decoded (httpjson.Decode), and JSON
	// decoding replaced invalid UTF-8. Sandbox ids are keys of the store's indexes, which
	// refuse entries longer than a few KB (a 500 on PostgreSQL, found by an attack): an id is
	// at most 128 bytes.
	badID := func(id string) bool { return len(id) > maxHeldIDBytes }
	if slices.ContainsFunc(hb.Removed, badID) ||
		slices.ContainsFunc(hb.Sandboxes, func(h berth.HeldSandbox) bool { return badID(h.ID) }) ||
		slices.ContainsFunc(hb.Ended, func(e berth.EndedSandbox) bool { return badID(e.ID) }) {
		return berth.Errorf(berth.EInvalidRequest, "sandbox ids in a heartbeat must be at most %d bytes", maxHeldIDBytes)
	}
	// A time JSON cannot write back (outside years 0–9999 in UTC) would break every listing of
	// the fleet (found by an attack); the zero time means "not sent".
	if y := hb.HeartbeatAt.UTC().Year(); !hb.HeartbeatAt.IsZero() && (y < 1 || y > 9999) {
		return berth.Errorf(berth.EInvalidRequest, "heartbeat_at must be a time in years 1–9999")
	}
	return nil
}

// heartbeatFigures refuses (invalid_request) a heartbeat whose figures no host has, within
// the bounds below: memory in MiB, CPU in cores, pressure in percent, counts not negative.
func heartbeatFigures(hb berth.Heartbeat) error {
	switch {
	case hb.MemoryMiBAdmittable < 0 || hb.MemoryMiBAdmittable > hb.MemoryMiBTotal:
		return berth.Errorf(berth.EInvalidRequest, "memory figures must satisfy 0 ≤ admittable ≤ total")
	case !inRange(hb.MemoryMiBTotal, maxHostMemoryMiB) || !inRange(hb.MemoryMiBUsed, maxHostMemoryMiB) ||
		!inRange(hb.MemoryMiBCommitted, maxHostMemoryMiB):
		return berth.Errorf(berth.EInvalidRequest, "memory_mb_total, memory_mb_used and memory_mb_committed must be 0–%d MiB", int64(maxHostMemoryMiB))
	case !inRange(hb.CPUTotal, maxHostCPUs) || !inRange(hb.CPUUsed, maxHostCPUs):
		return berth.Errorf(berth.EInvalidRequest, "cpu_total and cpu_used must be 0–%d cores", maxHostCPUs)
	case !inRange(hb.MemoryPressure, 100):
		return berth.Errorf(berth.EInvalidRequest, "memory_pressure is PSI some avg10, a percentage: 0–100")
	case hb.StartsInFlight < 0 || hb.MeasurementErrors < 0:
		return berth.Errorf(berth.EInvalidRequest, "starts_in_flight and measurement_errors are counts: 0 or more")
	}
	for _, h := range hb.Sandboxes {
		if !inRange(h.ResidentMiB, maxHostMemoryMiB) || h.OOMKills < 0 || h.Incarnation < 0 {
			return berth.Errorf(berth.EInvalidRequest, "held sandbox %s: resident_mb must be 0–%d MiB, and oom_kills and incarnation 0 or more",
				h.ID, int64(maxHostMemoryMiB))
		}
	}
	return nil
}

// Bounds of a heartbeat's figures (heartbeatFigures). They are far above any real host;
// they exist so that a figure no host can have — cpu_total 1e308, a negative resident_mb — is
// refused as bad input instead of reaching placement's scores and the fleet's sums, where it
// would make one host outrank every other or a total wrap around.
const (
	maxHostMemoryMiB = 1 << 40 // MiB: 1 EiB
	maxHostCPUs      = 1 << 16 // cores
)

// inRange reports whether 0 ≤ x ≤ hi; NaN is out of range.
func inRange[T int64 | float64](x, hi T) bool { return x >= 0 && x <= hi }

// maxHeldIDBytes bounds a sandbox id an agent reports (validateHeartbeat): the server's own
// are "sb-" and 16 hex digits.
const maxHeldIDBytes = 128

// maxAgentTextBytes bounds the text a heartbeat announces about its agent (address, version,
// boot id, runtime name): a URL, a release and an id are far shorter.
const maxAgentTextBytes = 1024

// agentIDParam is the {id} of an /v1/agents/{id}/… route, refused as invalid_request when it
// is not an agent id at all (berth.CheckAgentID: a NUL byte or invalid UTF-8 would otherwise
// reach the store and fail there as a 500).
func agentIDParam(r *http.Request) (string, error) {
	id := r.PathValue("id")
	return id, berth.CheckAgentID(id)
}

// listEvents is GET /v1/events?entity=&since=&limit= (LIF-3). Tenants may read the events of
// their own sandboxes only; admins read all.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, p principal) error {
	f, err := eventFilter(r.URL.Query())
	if err != nil {
		return err
	}
	var since berth.App // a tenant reads an app's events of its own incarnation only
	if !p.admin() {
		if since, err = s.mayReadEvents(r, p, f.Entity); err != nil {
			return err
		}
		if !since.CreatedAt.IsZero() && f.Since.Before(since.CreatedAt) {
			f.Since = since.CreatedAt
		}
	}
	evs, err := s.store.Events(r.Context(), f)
	if err != nil {
		return berth.Fault(err, "list events")
	}
	if !since.CreatedAt.IsZero() {
		evs = ownIncarnation(evs, since.CreatedAt)
	}
	if evs == nil {
		evs = []berth.Event{}
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"events": evs})
	return nil
}

// eventFilter reads GET /v1/events' query: entity, since and until (RFC 3339), type (sandbox,
// agent, reservation or app: LIF-3, APP-1), to (at most 64 bytes) and limit (1..10000).
// Errors: invalid_request naming the parameter.
func eventFilter(q url.Values) (berth.EventFilter, error) {
	f := berth.EventFilter{Entity: q.Get("entity")}
	if err := checkEntity(f.Entity); err != nil {
		return f, err
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, berth.Errorf(berth.EInvalidRequest, "since must be an RFC 3339 time")
		}
		f.Since = t
	}
	if v := q.Get("until"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, berth.Errorf(berth.EInvalidRequest, "until must be an RFC 3339 time")
		}
		f.Until = t
	}
	if v := q.Get("type"); v != "" {
		// The kind of entity (LIF-3, APP-1).
		if !berth.ValidEventKind(v) {
			return f, berth.Errorf(berth.EInvalidRequest, "type must be %s", berth.EventKindsText())
		}
		if f.Entity == "" {
			f.Entity = v + "/"
		} else if !strings.HasPrefix(f.Entity, v+"/") {
			return f, berth.Errorf(berth.EInvalidRequest, "entity %q is not of type %s", f.Entity, v)
		}
	}
	if v := q.Get("to"); v != "" {
		// A state no entity's events move to matches nothing: a typo, not an empty history.
		if !berth.ValidEventTo(v) {
			return f, berth.Errorf(berth.EInvalidRequest, "to %q is not a state any entity's events move to (e.g. running, lost, draining, waiting_capacity, expired)", excerpt(v))
		}
		f.To = v
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return f, berth.Errorf(berth.EInvalidRequest, "limit must be 1..10000")
		}
		f.Limit = n
	}
	return f, nil
}

// maxEntityBytes bounds an events query's entity: a kind, '/', and an id (sandbox and agent
// ids are at most 128 bytes; a volume's is its tenant and name).
const maxEntityBytes = 256

// checkEntity refuses an events query's entity that names no kind of entity, as
// invalid_request: it must be "" (every event), "<kind>/" (every entity of that kind) or
// "<kind>/<id>", with a kind of berth.EventKinds, at most maxEntityBytes (a NUL in the query
// was refused before, requestText).
func checkEntity(entity string) error {
	if entity == "" {
		return nil
	}
	kind, _, ok := strings.Cut(entity, "/")
	if !ok || !berth.ValidEventKind(kind) || len(entity) > maxEntityBytes {
		return berth.Errorf(berth.EInvalidRequest, "entity %q must be <kind>/<id>, or <kind>/ for every entity of a kind, "+
			"with kind %s (at most %d bytes)", excerpt(entity), berth.EventKindsText(), maxEntityBytes)
	}
	return nil
}

// mayReadEvents checks that tenant key p may read the events of entity: one of its own
// sandboxes ("sandbox/<id>") or apps ("app/<name>"); for an app it returns the app, whose
// CreatedAt starts the history the tenant may read (issue 15, point 6: a re-used name starts
// a fresh history for its new owner). Errors: forbidden for anything else, or the sandbox's
// or app's lookup error (not found for another tenant's).
func (s *Server) mayReadEvents(r *http.Request, p principal, entity string) (berth.App, error) {
	if name, ok := strings.CutPrefix(entity, "app/"); ok && name != "" {
		return s.appFor(r, p, name)
	}
	id, ok := strings.CutPrefix(entity, "sandbox/")
	if !ok || id == "" {
		return berth.App{}, berth.Errorf(berth.EForbidden, "tenant keys may read events of their own sandboxes and apps only (entity=sandbox/<id> or app/<name>)")
	}
	_, err := s.sandboxFor(r.Context(), p, id)
	return berth.App{}, err
}

// ownIncarnation drops, from an app's events (oldest first), those written before the
// creation event of the incarnation created at created: a previous owner's events in the
// same millisecond precede it in write order.
func ownIncarnation(evs []berth.Event, created time.Time) []berth.Event {
	for i := len(evs) - 1; i >= 0; i-- {
		if e := evs[i]; e.From == "" && e.At.Equal(created) && strings.HasPrefix(e.Reason, "created") {
			return evs[i:]
		}
	}
	return evs // the creation event is older than the window: every event is after it
}

// derivedStatus is the status an agent is reported with (LIF-1, PLC-9): dead or stale by its
// heartbeat's age, quarantined while its quarantine lasts, else what it declared.
func derivedStatus(a berth.Agent, now time.Time, staleAfter, deadAfter time.Duration) berth.AgentStatus {
	age := now.Sub(a.LastSeen)
	switch {
	case age >= deadAfter:
		return berth.AgentDead
	case age >= staleAfter:
		return berth.AgentStale
	case a.QuarantinedUntil.After(now):
		return berth.AgentQuarantined
	}
	return a.Status
}

// listReservations is GET /v1/reservations (admin): the ledger as it stands (LED-3).
func (s *Server) listReservations(w http.ResponseWriter, r *http.Request, _ principal) error {
	rs, err := s.store.Reservations(r.Context())
	if err != nil {
		return berth.Fault(err, "list reservations")
	}
	if rs == nil {
		rs = []berth.Reservation{}
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"reservations": rs})
	return nil
}

type tenantBody struct {
	Name string `json:"name"`
}

// createTenant is POST /v1/tenants {"name"} (admin): 201 with the new tenant. A name that is
// taken is 409 conflict and the tenant is left as it is — its created_at, keys and quota —
// as the CLI and the SDKs document ("an existing name is a conflict"). The store says whether
// this call created the row, so of creates racing on replicas, even in one millisecond,
// exactly one answers 201.
func (s *Server) createTenant(w http.ResponseWriter, r *http.Request, _ principal) error {
	var b tenantBody
	if err := httpjson.Decode(w, r, maxJSONBytes, &b); err != nil {
		return err
	}
	if !nameRE.MatchString(b.Name) {
		return berth.Errorf(berth.EInvalidRequest, "tenant name must be lowercase letters, digits, '.', '_' or '-', at most 63")
	}
	// Stores keep milliseconds: the answer holds the time as it is stored.
	t := berth.Tenant{Name: b.Name, CreatedAt: s.cfg.Clock().UTC().Truncate(time.Millisecond)}
	created, err := s.store.PutTenant(r.Context(), t)
	if err != nil {
		return berth.Fault(err, "store tenant")
	}
	if !created {
		stored, ok, err := s.tenant(r.Context(), b.Name)
		switch {
		case err != nil:
			return err
		case !ok: // tenants are never deleted
			return berth.Errorf(berth.EInternal, "tenant %q is taken but not stored", b.Name)
		}
		return tenantExists(stored)
	}
	httpjson.WriteJSON(w, http.StatusCreated, t)
	return nil
}

// tenant reads one tenant; ok is false when there is none of that name.
func (s *Server) tenant(ctx context.Context, name string) (t berth.Tenant, ok bool, err error) {
	tenants, err := s.store.Tenants(ctx)
	if err != nil {
		return berth.Tenant{}, false, berth.Fault(err, "read tenants")
	}
	i := slices.IndexFunc(tenants, func(t berth.Tenant) bool { return t.Name == name })
	if i < 0 {
		return berth.Tenant{}, false, nil
	}
	return tenants[i], true, nil
}

func tenantExists(t berth.Tenant) error {
	return berth.Errorf(berth.EConflict, "tenant %s exists (created %s); it is left as it is",
		t.Name, t.CreatedAt.UTC().Format(time.RFC3339))
}

type keyBody struct {
	Role string `json:"role"`
}

// APIKeySecret is the answer of key creation: the secret is shown exactly once.
type APIKeySecret struct {
	berth.APIKey
	Key string `json:"key"`
}

func (s *Server) createAPIKey(w http.ResponseWriter, r *http.Request, _ principal) error {
	var b keyBody
	if r.ContentLength != 0 {
		if err := httpjson.Decode(w, r, maxJSONBytes, &b); err != nil {
			return err
		}
	}
	if b.Role == "" {
		b.Role = berth.RoleTenant
	}
	if b.Role != berth.RoleTenant && b.Role != berth.RoleAdmin {
		return berth.Errorf(berth.EInvalidRequest, "role must be tenant or admin")
	}
	secret := NewKeySecret()
	k := berth.APIKey{ID: newID("key"), Tenant: r.PathValue("name"), Role: b.Role, Hash: HashKey(secret), CreatedAt: s.cfg.Clock().UTC()}
	err := s.store.PutAPIKey(r.Context(), k)
	if errors.Is(err, berth.ErrNotFound) {
		return berth.Errorf(berth.ENotFound, "no tenant %q", k.Tenant)
	}
	if err != nil {
		return berth.Fault(err, "store key")
	}
	httpjson.WriteJSON(w, http.StatusCreated, APIKeySecret{APIKey: k, Key: secret})
	return nil
}

// NewKeySecret returns a fresh API key secret: "bk_" and 256 random bits, base64url.
func NewKeySecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "bk_" + base64.RawURLEncoding.EncodeToString(b)
}

// drainStatus is GET /v1/agents/{id}/drain (admin): whether the host's drain is complete —
// only when every sandbox there is terminal (C11) — and, past the drain's deadline
// (Config.DrainDeadline after it began), which sandboxes block it (C12).
func (s *Server) drainStatus(w http.ResponseWriter, r *http.Request, _ principal) error {
	id, err := agentIDParam(r)
	if err != nil {
		return err
	}
	a, err := s.store.Agent(r.Context(), id)
	if errors.Is(err, berth.ErrNotFound) {
		return berth.Errorf(berth.ENotFound, "no agent %q", id)
	}
	if err != nil {
		return berth.Fault(err, "read agent")
	}
	st := berth.DrainStatus{AgentID: id, Draining: a.Status == berth.AgentDraining || a.DrainReason != "",
		Reason: a.DrainReason, Remaining: []berth.DrainRemain{}}
	sbs, err := s.store.Sandboxes(r.Context(), berth.SandboxFilter{AgentID: id, Live: true, Limit: maxLiveOnHost})
	if err != nil {
		return berth.Fault(err, "list sandboxes")
	}
	for _, sb := range sbs {
		st.Remaining = append(st.Remaining, berth.DrainRemain{ID: sb.ID, State: sb.State})
	}
	if st.Draining {
		evs, err := s.store.Events(r.Context(), berth.EventFilter{Entity: "agent/" + id, Limit: 1000})
		if err != nil {
			return berth.Fault(err, "read agent events")
		}
		for _, e := range evs {
			if e.To == string(berth.AgentDraining) && e.From != string(berth.AgentDraining) {
				st.Since = e.At // the latest start of the drain in force
			}
		}
		if !st.Since.IsZero() {
			st.Deadline = st.Since.Add(s.cfg.DrainDeadline)
		}
		st.Complete = len(st.Remaining) == 0
		st.Blocked = !st.Complete && !st.Deadline.IsZero() && !s.cfg.Clock().Before(st.Deadline)
	}
	httpjson.WriteJSON(w, http.StatusOK, st)
	return nil
}

// putQuota is PUT /v1/tenants/{name}/quota (admin): {"max_sandboxes","max_memory_mb"}, 0 for
// no limit (ADM-11).
func (s *Server) putQuota(w http.ResponseWriter, r *http.Request, p principal) error {
	var q berth.Quota
	if err := httpjson.Decode(w, r, maxJSONBytes, &q); err != nil {
		return err
	}
	name := r.PathValue("name")
	if q.Tenant != "" && q.Tenant != name {
		return berth.Errorf(berth.EInvalidRequest, "body tenant %q differs from path %q", q.Tenant, name)
	}
	q.Tenant = name
	if q.MaxSandboxes < 0 || q.MaxMemoryMiB < 0 || q.MaxSandboxes > 1_000_000 || q.MaxMemoryMiB > 1<<40 {
		return berth.Errorf(berth.EInvalidRequest, "max_sandboxes and max_memory_mb must be between 0 (no limit) and sane bounds")
	}
	err := s.store.SetQuota(r.Context(), q, p.actor(), s.cfg.Clock())
	if errors.Is(err, berth.ErrNotFound) {
		return berth.Errorf(berth.ENotFound, "no tenant %q", name)
	}
	if err != nil {
		return berth.Fault(err, "store quota")
	}
	s.quotas.forget(name)
	httpjson.WriteJSON(w, http.StatusOK, q)
	return nil
}

// getQuota is GET /v1/tenants/{name}/quota (admin): the quota and the tenant's usage.
func (s *Server) getQuota(w http.ResponseWriter, r *http.Request, _ principal) error {
	name := r.PathValue("name")
	// An unknown tenant is not_found, as a PUT of its quota is, not "no limit".
	_, ok, err := s.tenant(r.Context(), name)
	if err != nil {
		return err
	}
	if !ok {
		return berth.Errorf(berth.ENotFound, "no tenant %q", name)
	}
	q, err := s.store.Quota(r.Context(), name)
	if err != nil {
		return berth.Fault(err, "read quota")
	}
	n, mem, err := s.store.TenantUsage(r.Context(), name)
	if err != nil {
		return berth.Fault(err, "read usage")
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"quota": q, "sandboxes": n, "memory_mb": mem})
	return nil
}

// checkQuota refuses a create the tenant's quota does not allow, before any placement work
// (ADM-11: 403, not retryable). The store checks again, atomically, when it records the
// sandbox; quotas are cached for a few seconds and usage is read only for limited tenants.
func (s *Server) checkQuota(ctx context.Context, tenant string, memMiB int64) error {
	now := s.cfg.Clock()
	q, ok := s.quotas.get(tenant, now)
	if !ok {
		var err error
		if q, err = s.store.Quota(ctx, tenant); err != nil {
			return berth.Fault(err, "read quota")
		}
		s.quotas.put(tenant, q, now)
	}
	if q.MaxSandboxes <= 0 && q.MaxMemoryMiB <= 0 {
		return nil
	}
	n, mem, err := s.store.TenantUsage(ctx, tenant)
	if err != nil {
		return berth.Fault(err, "read usage")
	}
	if !q.Allows(n, mem, memMiB) {
		s.metrics.refusals.WithLabelValues(berth.ETenantOverQuota).Inc() // MET-1
		q.Tenant = tenant
		return overQuota(&berth.QuotaRefusal{Quota: q, Sandboxes: n, MemoryMiB: mem, AskedMiB: memMiB})
	}
	return nil
}

// overQuota is the tenant_over_quota answer (ADM-11: 403, not retryable) for a refusal, from
// the pre-check or the store's own check: its message says what was asked and what the
// quota allows.
func overQuota(r *berth.QuotaRefusal) error {
	return &berth.Error{Code: berth.ETenantOverQuota, Message: r.Error(), Cause: r}
}
