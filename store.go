package berth

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned (wrapped) by stores when a looked-up row does not exist.
var ErrNotFound = errors.New("not found")

// ErrOverQuota is returned (wrapped) by SandboxStore.CreateSandbox when the tenant's quota
// (ADM-11) does not allow one more live sandbox of that size; nothing is written.
var ErrOverQuota = errors.New("tenant over quota")

// ErrIdempotencyConflict is returned by SandboxStore.CreateSandbox when another sandbox of the
// same tenant already holds the Idempotency-Key (API-4).
var ErrIdempotencyConflict = errors.New("idempotency key already used")

// AgentStore keeps agents and applies heartbeats. Implementations: store/sqlite (and later
// store/postgres); both pass store/storetest.
type AgentStore interface {
	// ApplyHeartbeat records hb as seen at now, in one transaction: it upserts the agent
	// (keeping an operator drain in force), releases the ledger entries of every sandbox the
	// heartbeat lists or that is terminal (LED-4 netting), applies hb.Ended as sandbox
	// transitions, and writes an event for every agent or sandbox transition (LIF-3). It
	// returns the number of reservations netted.
	ApplyHeartbeat(ctx context.Context, hb Heartbeat, now time.Time) (netted int, err error)
	// RecordHeartbeat is ApplyHeartbeat for heartbeats that may be deltas (issue 16, goal 2):
	// a delta (hb.Delta) is applied onto the held list of the same boot's heartbeat
	// hb.BaseSeq, which the store keeps per sandbox, and refused (Resync, only hb.Ended
	// applied) when the store holds any other base. It costs what the heartbeat lists, not
	// what the agent holds. credHash is the SHA-256 (hex) of the credential the heartbeat came
	// with: the heartbeat is applied only if it is a live credential of hb.AgentID, checked in
	// the same transaction (ErrRevoked otherwise, nothing applied; TRUST-1). "" skips that
	// check (the caller authenticated otherwise); an admin revoke of the id is checked always.
	RecordHeartbeat(ctx context.Context, hb Heartbeat, credHash string, now time.Time) (HeartbeatResult, error)
	// Agents returns every known agent.
	Agents(ctx context.Context) ([]Agent, error)
	// AgentsChangedSince reads the agent table for placement's snapshot, without held lists
	// (Sandboxes empty: a fleet's held lists are ten times its agents or more). Given the
	// Cursor of an earlier read it may return only the agents whose rows changed since that
	// read (Full false): every change committed after the earlier read took its cursor is
	// among them, whatever order the changes committed in. Given "" or a cursor it cannot
	// use (another database's, or one ahead of it), or wherever it cannot tell, it returns
	// every agent (Full true). A replica re-reads every second, and a heartbeat changes its
	// agent's row every 10 s, so at 10,000 agents a read since the last one is about a tenth
	// of the table (issue 16, goal 2). A deleted row is no change: Berth deletes no agent,
	// and a reader that must see rows deleted by hand reads whole now and then.
	AgentsChangedSince(ctx context.Context, cursor string) (AgentChanges, error)
	// UnmeasuredHeld returns the held sandboxes the agents' latest heartbeats list as not yet
	// measured (HeldSandbox.Measured false, ADM-5), as sandbox ids by agent id: what a
	// refusal's Retry-After needs of the held lists (issue 16, goal 6). Its cost is a scan of
	// the held rows, not a read of them: a guest is measured within about a second of
	// starting, so few are unmeasured at any time.
	UnmeasuredHeld(ctx context.Context) (map[string][]string, error)
	// HeldCounts returns how many sandboxes each agent's latest heartbeat holds, by agent id
	// (an agent holding none is absent): what a fleet listing shows of the held lists without
	// reading them (GET /v1/agents?held=count).
	HeldCounts(ctx context.Context) (map[string]int, error)
	// Agent returns one agent or an error wrapping ErrNotFound.
	Agent(ctx context.Context, id string) (Agent, error)
	// SetAgentDrain marks (draining=true) or clears an operator drain, with an event.
	SetAgentDrain(ctx context.Context, id string, draining bool, reason, actor string, now time.Time) error
	// RecordCreateOutcome counts a create that failed on the agent after admission (failed)
	// or resets the count after one that succeeded (PLC-9). Crossing q.After consecutive
	// failures sets QuarantinedUntil to q.Until(...) with an event "active → quarantined";
	// a success after a quarantine writes "quarantined → active". Changes are pushed to
	// AgentWatcher listeners. It returns the agent as stored; unknown agent → ErrNotFound.
	RecordCreateOutcome(ctx context.Context, id string, failed bool, q QuarantinePolicy, actor string, now time.Time) (Agent, error)
}

// TemplateStore keeps templates.
type TemplateStore interface {
	// PutTemplate creates or replaces a template.
	PutTemplate(ctx context.Context, t Template) error
	// Template returns one template or an error wrapping ErrNotFound.
	Template(ctx context.Context, name string) (Template, error)
	// Templates returns all templates ordered by name.
	Templates(ctx context.Context) ([]Template, error)
}

// Expiry is when a running sandbox's TTL ends (Store.ExpiringFirst).
type Expiry struct {
	SandboxID string
	AgentID   string
	At        time.Time
}

// SandboxFilter selects sandboxes; zero fields match everything.
type SandboxFilter struct {
	Tenant  string
	State   SandboxState
	AgentID string
	// Live keeps only sandboxes in a state that is not terminal (LIF-1): a host's history of
	// ended sandboxes, however long, never crowds a live one out of Limit.
	Live  bool
	Limit int
	// OldestFirst lists oldest first — by CreatedAt, then ID — starting after After (the
	// zero SandboxKey starts at the first): the sweeper pages through every sandbox of a
	// state with it, so a state holding more than Limit rows is still swept whole.
	OldestFirst bool
	After       SandboxKey
}

// SandboxKey is a sandbox's place in SandboxFilter.OldestFirst's order: its CreatedAt (the
// store keeps milliseconds) and ID.
type SandboxKey struct {
	CreatedAt time.Time
	ID        string
}

// SandboxStore keeps sandboxes. Every state change writes its event in the same transaction
// (LIF-3).
type SandboxStore interface {
	// CreateSandbox inserts sb with the event "pending → sb.State". If sb.IdempotencyKey is set
	// and another sandbox of the tenant holds it, nothing is written and the error wraps
	// ErrIdempotencyConflict; if the tenant's quota does not allow one more live sandbox of
	// its size (checked in the same transaction), the error wraps ErrOverQuota.
	CreateSandbox(ctx context.Context, sb Sandbox, actor string, now time.Time) error
	// Sandbox returns one sandbox or an error wrapping ErrNotFound.
	Sandbox(ctx context.Context, id string) (Sandbox, error)
	// SandboxByIdempotencyKey returns the tenant's sandbox created with key, or ErrNotFound.
	SandboxByIdempotencyKey(ctx context.Context, tenant, key string) (Sandbox, error)
	// Sandboxes lists sandboxes matching f, newest first (oldest first with f.OldestFirst).
	Sandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error)
	// SandboxesByID returns the sandboxes of ids the store knows, in no order; an unknown id is
	// left out, and a repeated one answered once. A long list is read in parts (issue 16,
	// goal 6: a refusal's estimate reads the few sandboxes reserves name, not every one).
	SandboxesByID(ctx context.Context, ids []string) ([]Sandbox, error)
	// ExpiringFirst returns up to limit running sandboxes in order of expiry — by ExpiresAt,
	// then SandboxID — starting after the cursor from (an Expiry of an earlier page; the zero
	// Expiry starts at the beginning), leaving out sandboxes without an expiry. It reads an
	// index's first entries however many sandboxes run (API-3's estimate: when room returns
	// by TTL). A limit of 0 or less returns none.
	ExpiringFirst(ctx context.Context, from Expiry, limit int) ([]Expiry, error)
	// EndedSandboxes checks held, copies of sandboxes agentID holds, against the store
	// (AGT-6): those whose sandbox is terminal or unknown are Ended; those whose sandbox is
	// live but placed on another agent or on none (paused) are Stale. A long list is read in
	// parts.
	EndedSandboxes(ctx context.Context, agentID string, held []HeldCopy) (HeldCheck, error)
	// HeldEnded is EndedSandboxes over what agentID's held list in the store names, not
	// starting, in one read (AGT-6's sweep, issue 16 goal 2): held is every such id, ordered
	// by id, and the check of them, with the boot and incarnations that list holds. An agent
	// the store does not know holds nothing.
	HeldEnded(ctx context.Context, agentID string) (held []string, c HeldCheck, err error)
	// TransitionSandbox moves sandbox id to state to with an event, only if its current state
	// is one of from (any non-terminal state when from is empty). It reports whether the
	// transition happened. Entering a terminal state also releases the sandbox's reservations
	// and, for a create that failed before it ran (SandboxState.FreesIdempotencyKey), frees
	// its Idempotency-Key so a retry can create anew.
	TransitionSandbox(ctx context.Context, id string, from []SandboxState, to SandboxState, reason, actor string, now time.Time) (bool, error)
	// MoveSandbox is a transition that also rewrites where the sandbox lives (PAUSE-1,
	// SPOT-3): if sandbox id's state is one of from (any non-terminal state when from is
	// empty), it moves to m.To with the event "<old> → m.To" (reason, actor) and sets
	// agent_id, expires_at, paused_at and image to m's values, all in one transaction.
	// Entering a terminal state releases reservations as TransitionSandbox does. It reports
	// whether the move happened; an unknown id is (false, nil).
	MoveSandbox(ctx context.Context, id string, from []SandboxState, m SandboxMove, reason, actor string, now time.Time) (bool, error)
	// UnheldRunning returns up to limit (≤ 0: 100) sandboxes in state running that their
	// agent, alive and on the same boot, no longer holds (AGT-6's same-boot twin), ordered by
	// id. A sandbox is returned only when all of these hold:
	//   - its agent was last seen (Agent.LastSeen, the server's receive time) at or after
	//     seenSince: a silent agent is the leases' business (LIF-2);
	//   - the agent's held list is current: written by the heartbeat the agent row records
	//     (same boot, same Seq, Seq > 0), not left behind by a replica of the previous
	//     release or an unnumbered agent;
	//   - that held list does not list the sandbox (not even as starting);
	//   - the heartbeat that wrote it was received at least grace after the sandbox last
	//     entered running (its latest event "→ running"), so a heartbeat composed before the
	//     agent accepted the create, and received after the running mark, never counts.
	// A sandbox with no event into running is never returned. One call judges at most the
	// first 1,000 (oldest first) running sandboxes their agent does not list, graced or not. A
	// negative grace is an error; so is a store that cannot be read. It writes nothing.
	UnheldRunning(ctx context.Context, seenSince time.Time, grace time.Duration, limit int) ([]UnheldSandbox, error)
}

// UnheldSandbox is a running sandbox its agent's current held list does not list
// (SandboxStore.UnheldRunning): RunningSince is when it last entered running, HeldAt when
// the heartbeat whose held list leaves it out was received (the agent's LastSeen); both UTC,
// millisecond precision, HeldAt − RunningSince ≥ the grace asked for.
type UnheldSandbox struct {
	ID           string
	AgentID      string
	RunningSince time.Time
	HeldAt       time.Time
}

// SandboxMove is the new state and placement MoveSandbox writes: the agent that holds the
// sandbox ("" while it is paused), its TTL end, when it was paused (zero unless paused) and
// the name of its checkpoint image ("" when it has none).
type SandboxMove struct {
	To        SandboxState
	AgentID   string
	ExpiresAt time.Time
	PausedAt  time.Time
	Image     string
}

// VolumeStore keeps the host pins of volumes (POOL-2).
type VolumeStore interface {
	// PinVolume records v (tenant, name → agent) unless the tenant already has a volume of
	// that name, with the event "" → "pinned"; it returns the volume as stored, so a caller
	// that lost a race learns the host that won.
	PinVolume(ctx context.Context, v Volume, actor string, now time.Time) (Volume, error)
	// Volume returns the tenant's volume or an error wrapping ErrNotFound.
	Volume(ctx context.Context, tenant, name string) (Volume, error)
}

// Ledger is the reservation ledger (LED-1…3).
type Ledger interface {
	// Reserve inserts r only if the agent still fits it, atomically with the check (LED-1, ADM-7):
	// agent admittable − Σ unexpired reservations on the agent ≥ r.MiB. It reports whether r
	// was taken. A zero-MiB reservation always fits a known agent.
	Reserve(ctx context.Context, r Reservation, now time.Time) (bool, error)
	// ReserveAndCreate is Reserve, then CreateSandbox(sb), in one transaction (issue 16, goal
	// 1): both are written or neither. It reports false, writing nothing, when r does not
	// fit; CreateSandbox's errors (ErrIdempotencyConflict, ErrOverQuota) write nothing either.
	ReserveAndCreate(ctx context.Context, r Reservation, sb Sandbox, actor string, now time.Time) (bool, error)
	// Release deletes reservation id; it is idempotent and reports whether a row went.
	Release(ctx context.Context, id string) (bool, error)
	// Renew keeps reservation id alive while its create is in flight (LED-2, C31): it moves
	// the expiry to expiresAt, only if the reservation is still held and unexpired at now,
	// and never earlier than it was. It writes no event. It reports whether the reservation
	// is still held; false means it went (released, netted, swept) or had expired, and must
	// not be counted on (its room may already be someone else's).
	Renew(ctx context.Context, id string, expiresAt, now time.Time) (bool, error)
	// Pending returns Σ MiB of unexpired reservations per agent.
	Pending(ctx context.Context, now time.Time) (map[string]int64, error)
	// Reservations lists every reservation, expired or not.
	Reservations(ctx context.Context) ([]Reservation, error)
	// SweepReservations deletes reservations expired at now, with an event each, and returns
	// how many went (LED-2).
	SweepReservations(ctx context.Context, now time.Time) (int, error)
}

// EventStore reads the event log (writes happen inside the other stores' transactions).
type EventStore interface {
	// Events returns events matching f, oldest first.
	Events(ctx context.Context, f EventFilter) ([]Event, error)
}

// TenantStore keeps tenants and hashed API keys.
type TenantStore interface {
	// PutTenant creates tenant t unless one of its name exists, atomically, and reports
	// whether this call created it: created is false, and the stored tenant is left as it is
	// (its created_at, keys and quota), when the name is taken — also by a call on another
	// replica in the same millisecond (POST /v1/tenants answers 201 or 409 from it). An
	// empty name is an error.
	PutTenant(ctx context.Context, t Tenant) (created bool, err error)
	// Tenants lists tenants ordered by name.
	Tenants(ctx context.Context) ([]Tenant, error)
	// PutAPIKey stores a key (its hash only). The tenant must exist.
	PutAPIKey(ctx context.Context, k APIKey) error
	// APIKeyByHash returns the key with the given hex SHA-256 hash, or ErrNotFound.
	APIKeyByHash(ctx context.Context, hash string) (APIKey, error)
	// SetQuota sets a tenant's quota (ADM-11) with an event; unknown tenant → ErrNotFound.
	SetQuota(ctx context.Context, q Quota, actor string, now time.Time) error
	// Quota returns a tenant's quota; a tenant without one gets the zero (unlimited) Quota.
	Quota(ctx context.Context, tenant string) (Quota, error)
	// TenantUsage returns the tenant's live (non-terminal) sandboxes and their configured MiB.
	TenantUsage(ctx context.Context, tenant string) (sandboxes int, memoryMiB int64, err error)
}

// Store is everything the server needs from persistence.
type Store interface {
	AgentStore
	TemplateStore
	SandboxStore
	VolumeStore
	Ledger
	EventStore
	TenantStore
	AppStore
	IdempotencyStore
	AgentCredentialStore
	// ClaimSweep claims fleet-wide sweep name for one run at now (issue 16, goal 2): it
	// reports true, and records now as the claim, when no replica claimed name in the
	// period every before now — or when the recorded claim lies more than every after now,
	// written by a clock since set back. Of concurrent claims of one period (every > 0, the
	// claimers' clocks less than every apart), exactly one wins. An empty name or a negative
	// every is an error. So replicas that each call it before a sweep run the
	// sweep once per period between them, not once each.
	ClaimSweep(ctx context.Context, name string, now time.Time, every time.Duration) (bool, error)
	// Ping checks the store is reachable and accepts a write, changing nothing (for /readyz,
	// issue 15).
	Ping(ctx context.Context) error
	Close() error
}

// ConnStats is a store's connection pool as one replica sees it: Max connections (0: no
// limit), InUse now, Waits — acquisitions since the store was opened that found no free
// connection and waited — and Waited, their total wait. Every store call of a replica, a
// create's and a heartbeat's alike, takes a connection from the same pool, so under an
// overload they queue here (issue 16, goal 2). Stores that keep a pool implement
// ConnStater.
type ConnStats struct {
	Max, InUse int
	Waits      int64
	Waited     time.Duration
}

// ConnStater is implemented by stores that report their connection pool (ConnStats): the
// server exports it as the berth_store_connection* metrics.
type ConnStater interface {
	ConnStats() ConnStats
}

// AgentWatcher is implemented by stores that can push agent changes to every replica (PLC-5):
// a drain or undrain written through any replica reaches the others' placement in well under
// a second, without waiting for their cache to expire. WatchAgents calls fn with the id of
// each agent whose drain state changed, until ctx ends; it reconnects by itself after store
// outages and returns only ctx.Err(). fn is also called with "" each time the watch is
// (re)established, including the first time: changes may have been missed, so every agent
// should be re-read. fn is called from one goroutine, in commit order, and must not block.
type AgentWatcher interface {
	WatchAgents(ctx context.Context, fn func(agentID string)) error
}

// Retainer is implemented by stores that delete old history (issue 15, point 5; the server's
// --retention). PurgeEnded deletes, in one transaction, up to batch sandboxes that are
// terminal and ended before cutoff, with their events and any reservation left for them, and
// up to batch events, written before cutoff, of reservations the ledger no longer holds. It
// never deletes a live sandbox, a held reservation or another entity's events. Calling it
// again deletes the next batch; it is idempotent, and a call that deletes nothing means
// nothing older than cutoff is left.
type Retainer interface {
	PurgeEnded(ctx context.Context, cutoff time.Time, batch int) (Purged, error)
}

// Purged counts the rows one PurgeEnded deleted, per table.
type Purged struct {
	Sandboxes    int
	Events       int
	Reservations int
}

// EventLogger is implemented by stores that hand every event they commit to fn, after the
// commit and never for a rolled-back transaction (LIF-3: events are also logged as JSON).
type EventLogger interface {
	LogEvents(fn func(Event))
}
