package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/google/go-cmp/cmp"
)

// The placement steps of place.go, each tested alone, over a real SQLite store and agents
// over real HTTP: choose (Filter and Score), reserve, unreserve, bind, unbind and next; and
// the loop's promise that every failure after reserve leaves no reservation behind (LED-3).

// scriptedAgent is an agent over real HTTP that answers each create with the code its script
// returns ("" starts the sandbox) and counts creates and deletes.
type scriptedAgent struct {
	srv     *httptest.Server
	creates atomic.Int64
	deletes atomic.Int64
}

func newScriptedAgent(t *testing.T, answer func(berth.AgentCreate) string) *scriptedAgent {
	a := &scriptedAgent{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case !fromServer(r, a.srv.URL):
			w.WriteHeader(http.StatusUnauthorized)
		case r.Method == http.MethodPost && r.URL.Path == "/internal/sandboxes":
			a.creates.Add(1)
			var ac berth.AgentCreate
			_ = json.NewDecoder(r.Body).Decode(&ac)
			if code := answer(ac); code != "" {
				w.WriteHeader(httpjson.StatusFor(code))
				_ = json.NewEncoder(w).Encode(berth.ErrorBody{Error: berth.ErrorDetail{Code: code, Message: "scripted " + code}})
				return
			}
			w.WriteHeader(http.StatusCreated)
		case r.Method == http.MethodDelete:
			a.deletes.Add(1)
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// answering returns a script that always answers code.
func answering(code string) func(berth.AgentCreate) string {
	return func(berth.AgentCreate) string { return code }
}

// faultyStore is the real store with a few calls a test may fail or race (a hook runs
// before the real call; an error from it is the call's answer). It records the sandbox ids
// of the reservations the ledger granted.
type faultyStore struct {
	berth.Store
	beforePin        func(ctx context.Context, v berth.Volume) error
	beforeCreate     func(ctx context.Context, sb berth.Sandbox) error
	beforeTransition func(ctx context.Context, id string, to berth.SandboxState) error

	mu       sync.Mutex
	reserved []string
}

func (f *faultyStore) Reserve(ctx context.Context, r berth.Reservation, now time.Time) (bool, error) {
	ok, err := f.Store.Reserve(ctx, r, now)
	if ok && err == nil {
		f.mu.Lock()
		f.reserved = append(f.reserved, r.SandboxID)
		f.mu.Unlock()
	}
	return ok, err
}

// ReserveAndCreate runs the create hook before the one transaction a create's first write
// is, and records the reservation when it was granted.
func (f *faultyStore) ReserveAndCreate(ctx context.Context, r berth.Reservation, sb berth.Sandbox, actor string, now time.Time) (bool, error) {
	if f.beforeCreate != nil {
		if err := f.beforeCreate(ctx, sb); err != nil {
			return false, err
		}
	}
	ok, err := f.Store.ReserveAndCreate(ctx, r, sb, actor, now)
	if ok && err == nil {
		f.mu.Lock()
		f.reserved = append(f.reserved, r.SandboxID)
		f.mu.Unlock()
	}
	return ok, err
}

func (f *faultyStore) PinVolume(ctx context.Context, v berth.Volume, actor string, now time.Time) (berth.Volume, error) {
	if f.beforePin != nil {
		if err := f.beforePin(ctx, v); err != nil {
			return berth.Volume{}, err
		}
	}
	return f.Store.PinVolume(ctx, v, actor, now)
}

func (f *faultyStore) CreateSandbox(ctx context.Context, sb berth.Sandbox, actor string, now time.Time) error {
	if f.beforeCreate != nil {
		if err := f.beforeCreate(ctx, sb); err != nil {
			return err
		}
	}
	return f.Store.CreateSandbox(ctx, sb, actor, now)
}

func (f *faultyStore) TransitionSandbox(ctx context.Context, id string, from []berth.SandboxState, to berth.SandboxState, reason, actor string, now time.Time) (bool, error) {
	if f.beforeTransition != nil {
		if err := f.beforeTransition(ctx, id, to); err != nil {
			return false, err
		}
	}
	return f.Store.TransitionSandbox(ctx, id, from, to, reason, actor, now)
}

func (f *faultyStore) reservedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reserved)
}

// placeRig is one server's scheduler over a faultyStore around a fresh SQLite store.
type placeRig struct {
	*harness
	s  *scheduler
	fs *faultyStore
}

func newPlaceRig(t *testing.T, mutate func(*Config)) *placeRig {
	h := newHarnessWith(t, func(c *Config) {
		if mutate != nil {
			mutate(c)
		}
	})
	fs := &faultyStore{Store: h.st}
	h.s.sched.store = fs
	return &placeRig{harness: h, s: h.s.sched, fs: fs}
}

// host writes a heartbeat for agent id at addr with admittable MiB free; a host that
// checkpoints (restore) can take resumes (ISO-4).
func (r *placeRig) host(t *testing.T, id, addr string, admittable int64, restore bool) {
	t.Helper()
	_, err := r.st.ApplyHeartbeat(context.Background(), berth.Heartbeat{
		AgentID: id, Address: addr, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: max(8192, admittable), MemoryMiBAdmittable: admittable,
		CPUTotal: 2, HeartbeatAt: r.clock(), Checkpoint: restore,
	}, r.clock())
	must(t, err)
}

// pending is the snapshot's pending reservations on agent id, in MiB.
func (r *placeRig) pending(id string) int64 {
	r.s.mu.RLock()
	defer r.s.mu.RUnlock()
	if i, ok := r.s.index[id]; ok {
		return r.s.hosts[i].PendingMiB
	}
	return -1
}

// newSandbox is a python sandbox of acme's, not yet placed, holding key ("" for none).
func newSandbox(key string) berth.Sandbox {
	now := time.Now().UTC().Truncate(time.Millisecond)
	return berth.Sandbox{ID: newID("sb"), Template: "python", Tenant: "acme", MemoryMiB: 512, VCPUs: 1,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), IdempotencyKey: key}
}

// pausedSandbox stores a sandbox paused with its checkpoint image, as a pause leaves it.
func (r *placeRig) pausedSandbox(t *testing.T) berth.Sandbox {
	t.Helper()
	ctx := context.Background()
	sb := newSandbox("")
	sb.AgentID, sb.State = "gone", berth.SandboxRunning
	must(t, r.st.CreateSandbox(ctx, sb, "test", r.clock()))
	ok, err := r.st.MoveSandbox(ctx, sb.ID, []berth.SandboxState{berth.SandboxRunning},
		berth.SandboxMove{To: berth.SandboxPaused, ExpiresAt: sb.ExpiresAt, PausedAt: r.clock(), Image: sb.ID + "/img-1"},
		"paused", "test", r.clock())
	if err != nil || !ok {
		t.Fatalf("pause the fixture: %v %v", ok, err)
	}
	cur, err := r.st.Sandbox(ctx, sb.ID)
	must(t, err)
	cur.Image = sb.ID + "/img-1"
	return cur
}

// resume is placeRestore of sb from paused, as POST /v1/sandboxes/{id}/resume runs it.
func (r *placeRig) resume(sb berth.Sandbox) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := r.s.placeRestore(ctx, sb, []berth.SandboxState{berth.SandboxPaused}, "test")
		return err
	}
}

func TestPlaceBegin(t *testing.T) {
	ctx := context.Background()
	r := newPlaceRig(t, nil)
	r.host(t, "a", "http://127.0.0.1:1", 4096, false)
	_, err := r.st.PinVolume(ctx, berth.Volume{Tenant: "acme", Name: "data", AgentID: "a"}, "test", r.clock())
	must(t, err)
	for _, tc := range []struct {
		volume   string
		wantHost string
		pinned   bool
	}{{"", "", false}, {"data", "a", true}, {"fresh", "", false}} {
		sb := newSandbox("")
		sb.Volume, sb.Stateful = tc.volume, tc.volume != ""
		p, err := r.s.begin(ctx, sb, berth.CreateRequest{Volume: tc.volume, Region: "eu"}, "test", attempt{restore: true})
		must(t, err)
		want := placingFacts{VolumeHost: tc.wantHost, Pinned: tc.pinned, Stateful: sb.Stateful, Restore: true, Region: "eu", MemoryMiB: 512, Tries: 0}
		if diff := cmp.Diff(want, factsOf(p)); diff != "" {
			t.Errorf("begin with volume %q (-want +got):\n%s", tc.volume, diff)
		}
	}
}

// placingFacts is what begin sets up, for comparing.
type placingFacts struct {
	VolumeHost string
	Pinned     bool
	Stateful   bool
	Restore    bool
	Region     string
	MemoryMiB  int64
	Tries      int
}

func factsOf(p *placing) placingFacts {
	return placingFacts{VolumeHost: p.preq.VolumeHost, Pinned: p.pinned, Stateful: p.preq.Stateful, Restore: p.preq.Restore,
		Region: p.preq.Region, MemoryMiB: p.preq.MemoryMiB, Tries: p.tries}
}

func TestPlaceChoose(t *testing.T) {
	ctx := context.Background()
	t.Run("the host with the most room, then the next; a create's next attempt is a new sandbox", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		r.host(t, "big", "http://127.0.0.1:1", 8192, false)
		r.host(t, "small", "http://127.0.0.1:2", 2048, false)
		sb := newSandbox("")
		p, err := r.s.begin(ctx, sb, berth.CreateRequest{}, "test", attempt{fresh: true})
		must(t, err)
		c, err := r.s.choose(ctx, p)
		must(t, err)
		if c.host != "big" || c.addr != "http://127.0.0.1:1" || c.d.ChargeMiB != 512 || p.tries != 1 || p.sb.ID != sb.ID {
			t.Fatalf("first choice: %s %s charge %d, tries %d, id %s; want big, charge 512, the sandbox's own id", c.host, c.addr, c.d.ChargeMiB, p.tries, p.sb.ID)
		}
		p.excluded["big"] = berth.EHostStartsSaturated
		c, err = r.s.choose(ctx, p)
		must(t, err)
		if c.host != "small" || p.tries != 2 || p.sb.ID == sb.ID {
			t.Fatalf("second choice: %s, tries %d, id %s; want small, a new sandbox id", c.host, p.tries, p.sb.ID)
		}
	})
	t.Run("a resume keeps its id from host to host", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		r.host(t, "a", "http://127.0.0.1:1", 8192, true)
		r.host(t, "b", "http://127.0.0.1:2", 8192, true)
		sb := newSandbox("")
		p, err := r.s.begin(ctx, sb, berth.CreateRequest{}, "test", attempt{restore: true})
		must(t, err)
		for range 2 {
			c, err := r.s.choose(ctx, p)
			must(t, err)
			p.excluded[c.host] = berth.ENoCapacity
		}
		if p.sb.ID != sb.ID || p.tries != 2 {
			t.Fatalf("after two hosts: id %s, tries %d; want %s and 2", p.sb.ID, p.tries, sb.ID)
		}
	})
	t.Run("re-reads the store before a refusal (PLC-6)", func(t *testing.T) {
		r := newPlaceRig(t, func(c *Config) { c.CacheTTL = time.Hour })
		r.host(t, "a", "http://127.0.0.1:1", 0, false)
		p, err := r.s.begin(ctx, newSandbox(""), berth.CreateRequest{}, "test", attempt{fresh: true})
		must(t, err)
		r.host(t, "a", "http://127.0.0.1:1", 4096, false) // behind the snapshot's back
		c, err := r.s.choose(ctx, p)
		if err != nil || c.host != "a" || !p.reread {
			t.Fatalf("choose: %+v, %v, reread %v; want a after a re-read", c, err, p.reread)
		}
	})
	t.Run("refuses past MaxHostsPerCreate, counting the next host saturated (PLC-7)", func(t *testing.T) {
		r := newPlaceRig(t, func(c *Config) { c.MaxHostsPerCreate = 1 })
		r.host(t, "a", "http://127.0.0.1:1", 8192, false)
		r.host(t, "b", "http://127.0.0.1:2", 4096, false)
		p, err := r.s.begin(ctx, newSandbox(""), berth.CreateRequest{}, "test", attempt{fresh: true})
		must(t, err)
		c, err := r.s.choose(ctx, p)
		must(t, err)
		p.excluded[c.host] = berth.EHostStartsSaturated
		_, err = r.s.choose(ctx, p)
		var e *berth.Error
		if !errors.As(err, &e) || e.Code != berth.ENoCapacity || e.RetryAfter <= 0 {
			t.Fatalf("choose past the patience: %v; want a no_capacity refusal with Retry-After", err)
		}
		// The excluded host and the one it would try next are both counted saturated.
		if diff := cmp.Diff(map[string]int{"total": 2, "saturated": 2}, e.Hosts); diff != "" {
			t.Fatalf("hosts (-want +got):\n%s", diff)
		}
	})
	t.Run("no live host is no_healthy_agents", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		p, err := r.s.begin(ctx, newSandbox(""), berth.CreateRequest{}, "test", attempt{fresh: true})
		must(t, err)
		if _, err := r.s.choose(ctx, p); berth.ErrorCode(err) != berth.ENoHealthyAgents || !p.reread {
			t.Fatalf("choose on an empty fleet: %v (reread %v); want no_healthy_agents after a re-read", err, p.reread)
		}
	})
}

func TestPlaceReserveAndUnreserve(t *testing.T) {
	ctx := context.Background()
	t.Run("reserve takes the charge in the ledger and the snapshot; unreserve gives it back, twice harmlessly", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		r.host(t, "a", "http://127.0.0.1:1", 4096, false)
		p, err := r.s.begin(ctx, newSandbox(""), berth.CreateRequest{}, "test", attempt{fresh: true})
		must(t, err)
		c, err := r.s.choose(ctx, p)
		must(t, err)
		h, err := r.s.reserve(ctx, p, c)
		must(t, err)
		rs, err := r.st.Reservations(ctx)
		must(t, err)
		if len(rs) != 1 || rs[0].ID != h.res.ID || rs[0].AgentID != "a" || rs[0].SandboxID != p.sb.ID || rs[0].MiB != 512 || rs[0].Owner != r.s.cfg.ReplicaID {
			t.Fatalf("ledger after reserve: %+v; want 512 MiB on a for %s owned by this replica", rs, p.sb.ID)
		}
		if got := r.pending("a"); got != 512 {
			t.Fatalf("snapshot pending on a: %d MiB, want 512", got)
		}
		for range 2 {
			r.s.unreserve(h)
			rs, err = r.st.Reservations(ctx)
			must(t, err)
			if len(rs) != 0 || r.pending("a") != 0 {
				t.Fatalf("after unreserve: ledger %+v, pending %d; want empty and 0", rs, r.pending("a"))
			}
		}
		select {
		case <-h.renewing.done:
		default:
			t.Fatal("unreserve left the renewals running")
		}
	})
	t.Run("the ledger knows better than the snapshot: errLedgerSaidNo, and the snapshot is re-read", func(t *testing.T) {
		r := newPlaceRig(t, func(c *Config) { c.CacheTTL = time.Hour })
		r.host(t, "a", "http://127.0.0.1:1", 512, false)
		p, err := r.s.begin(ctx, newSandbox(""), berth.CreateRequest{}, "test", attempt{fresh: true})
		must(t, err)
		c, err := r.s.choose(ctx, p)
		must(t, err)
		now := r.clock()
		ok, err := r.st.Reserve(ctx, berth.Reservation{ID: "rsv-other", AgentID: "a", SandboxID: "sb-other", MiB: 512,
			Owner: "replica-2", CreatedAt: now, ExpiresAt: now.Add(time.Minute)}, now) // another replica took the room
		if err != nil || !ok {
			t.Fatalf("the other replica's reserve: %v %v", ok, err)
		}
		if _, err := r.s.reserve(ctx, p, c); !errors.Is(err, errLedgerSaidNo) {
			t.Fatalf("reserve: %v, want errLedgerSaidNo", err)
		}
		if got := r.pending("a"); got != 512 {
			t.Fatalf("snapshot pending after the ledger said no: %d MiB, want the other replica's 512", got)
		}
		if _, err := r.s.choose(ctx, p); berth.ErrorCode(err) != berth.ENoCapacity {
			t.Fatalf("the next choose: %v, want no_capacity", err)
		}
	})
}

func TestPlaceBind(t *testing.T) {
	ctx := context.Background()
	// bound chooses a, binds a create of sb there, and returns the placing and the result.
	bound := func(t *testing.T, r *placeRig, sb berth.Sandbox, req berth.CreateRequest) (*placing, berth.Sandbox, *unbound) {
		t.Helper()
		p, err := r.s.begin(ctx, sb, req, "test", r.s.createAttempt(req, "test"))
		must(t, err)
		c, err := r.s.choose(ctx, p)
		must(t, err)
		got, u := r.s.bind(ctx, p, c, &hold{})
		return p, got, u
	}
	state := func(t *testing.T, r *placeRig, id string) berth.Sandbox {
		t.Helper()
		sb, err := r.st.Sandbox(ctx, id)
		must(t, err)
		return sb
	}
	t.Run("starts it and records it running", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		a := newScriptedAgent(t, answering(""))
		r.host(t, "a", a.srv.URL, 4096, false)
		sb := newSandbox("")
		_, got, u := bound(t, r, sb, berth.CreateRequest{})
		if u != nil || got.State != berth.SandboxRunning || got.AgentID != "a" || got.Reason != "agent started it" {
			t.Fatalf("bind: %+v %+v; want running on a", got, u)
		}
		if cur := state(t, r, sb.ID); cur.State != berth.SandboxRunning || a.creates.Load() != 1 {
			t.Fatalf("stored %s, %d creates; want running after one create", cur.State, a.creates.Load())
		}
	})
	for _, tc := range []struct {
		name      string
		code      string
		stopAgent bool
	}{
		{"an agent's refusal leaves the record for unbind", berth.EHostStartsSaturated, false},
		{"an agent's failure leaves its side unknown", berth.EInternal, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPlaceRig(t, nil)
			r.host(t, "a", newScriptedAgent(t, answering(tc.code)).srv.URL, 4096, false)
			sb := newSandbox("")
			_, _, u := bound(t, r, sb, berth.CreateRequest{})
			if u == nil || !u.recorded || u.stopAgent != tc.stopAgent || berth.ErrorCode(u.agentErr) != tc.code || u.err != nil ||
				!strings.HasPrefix(u.reason, "agent/a: ") {
				t.Fatalf("bind: %+v; want recorded, stopAgent %v, the agent's %s", u, tc.stopAgent, tc.code)
			}
			if cur := state(t, r, sb.ID); cur.State != berth.SandboxStarting {
				t.Fatalf("stored %s; bind undoes nothing, want starting", cur.State)
			}
		})
	}
	t.Run("a key another create holds: errIdempotent, nothing written, the agent never asked", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		a := newScriptedAgent(t, answering(""))
		r.host(t, "a", a.srv.URL, 4096, false)
		first := newSandbox("key-1")
		first.AgentID, first.State = "a", berth.SandboxStarting
		must(t, r.st.CreateSandbox(ctx, first, "test", r.clock()))
		_, _, u := bound(t, r, newSandbox("key-1"), berth.CreateRequest{})
		if u == nil || !errors.Is(u.err, errIdempotent) || u.recorded || a.creates.Load() != 0 {
			t.Fatalf("bind: %+v, %d creates; want errIdempotent, not recorded, no create", u, a.creates.Load())
		}
	})
	t.Run("a volume pinned elsewhere meanwhile is followed there", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		a := newScriptedAgent(t, answering(""))
		r.host(t, "a", a.srv.URL, 8192, false)
		r.host(t, "b", a.srv.URL, 4096, false)
		r.fs.beforePin = func(ctx context.Context, v berth.Volume) error {
			r.fs.beforePin = nil
			v.AgentID = "b" // another create wins the race
			_, err := r.st.PinVolume(ctx, v, "other", r.clock())
			return err
		}
		sb := newSandbox("")
		sb.Stateful, sb.Volume = true, "data"
		p, _, u := bound(t, r, sb, berth.CreateRequest{Volume: "data"})
		if u == nil || u.err != nil || u.recorded || u.agentErr != nil || p.preq.VolumeHost != "b" || a.creates.Load() != 0 {
			t.Fatalf("bind: %+v, volume host %q, %d creates; want go on to b, nothing recorded", u, p.preq.VolumeHost, a.creates.Load())
		}
	})
	t.Run("the heartbeat promoted it first: the store's sandbox", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
		r.fs.beforeTransition = func(ctx context.Context, id string, to berth.SandboxState) error {
			_, err := r.st.TransitionSandbox(ctx, id, []berth.SandboxState{berth.SandboxStarting}, to, "listed by its agent", "heartbeat", r.clock())
			return err
		}
		_, got, u := bound(t, r, newSandbox(""), berth.CreateRequest{})
		if u != nil || got.State != berth.SandboxRunning || got.Reason != "listed by its agent" {
			t.Fatalf("bind: %+v %+v; want the store's running sandbox", got, u)
		}
	})
	t.Run("recording running fails: internal (not transient, berth.Fault), the agent's copy to stop", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
		var tries int
		r.fs.beforeTransition = func(context.Context, string, berth.SandboxState) error { tries++; return errors.New("disk full") }
		_, _, u := bound(t, r, newSandbox(""), berth.CreateRequest{})
		if u == nil || berth.ErrorCode(u.err) != berth.EInternal || !u.recorded || !u.stopAgent || u.reason != "recording running failed: disk full" {
			t.Fatalf("bind: %+v; want internal, recorded, stopAgent", u)
		}
		if tries != runningAttempts {
			t.Errorf("the transition was tried %d times, want %d", tries, runningAttempts)
		}
	})
	t.Run("recording running was applied but its answer lost: the store's running sandbox", func(t *testing.T) {
		r := newPlaceRig(t, nil)
		r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
		r.fs.beforeTransition = func(ctx context.Context, id string, to berth.SandboxState) error {
			if _, err := r.st.TransitionSandbox(ctx, id, []berth.SandboxState{berth.SandboxStarting}, to, "agent started it", "test", r.clock()); err != nil {
				return err
			}
			return errors.New("unexpected EOF") // the connection died after the commit
		}
		_, got, u := bound(t, r, newSandbox(""), berth.CreateRequest{})
		if u != nil || got.State != berth.SandboxRunning {
			t.Fatalf("bind: %+v %+v; want the store's running sandbox, nothing to undo", got, u)
		}
	})
}

// TestPlaceUnknownAttemptKeepsAPromotedSandbox (an attack on two replicas with killed
// PostgreSQL backends found it): when an attempt's outcome is unknown — recording running
// failed every time, or the agent's create call failed — and meanwhile the agent's heartbeat
// promoted the row to running, the placement must not stop a sandbox the store holds
// running: that left a "running" row with nothing behind it until its TTL. The record is
// undone first; found running on its host, the sandbox is kept and is the answer. When the
// undo does move the record, the agent's copy is stopped as before.
func TestPlaceUnknownAttemptKeepsAPromotedSandbox(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		agent     string // the agent's answer to the create
		promoted  bool   // the heartbeat promotes the row before the undo
		undoFails bool   // the undo's statement fails too
	}{
		{name: "recording running and the undo fail: the agent keeps its copy", undoFails: true},
		{name: "recording running fails, promoted meanwhile", promoted: true},
		{name: "recording running fails, still starting"},
		{name: "agent call fails, promoted meanwhile", agent: berth.EInternal, promoted: true},
		{name: "agent call fails, still starting", agent: berth.EInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPlaceRig(t, nil)
			a := newScriptedAgent(t, answering(tc.agent))
			r.host(t, "a", a.srv.URL, 4096, false)
			r.fs.beforeTransition = func(ctx context.Context, id string, to berth.SandboxState) error {
				switch to {
				case berth.SandboxRunning:
					return errors.New("connection reset by peer")
				case berth.SandboxFailed: // the undo; the heartbeat got there first
					if tc.undoFails {
						return errors.New("connection reset by peer")
					}
					if tc.promoted {
						_, err := r.st.TransitionSandbox(ctx, id, []berth.SandboxState{berth.SandboxStarting},
							berth.SandboxRunning, "agent reports it running", "agent/a", r.clock())
						return err
					}
				}
				return nil
			}
			sb := newSandbox("")
			got, err := r.s.place(ctx, sb, berth.CreateRequest{}, "test")
			cur, rerr := r.st.Sandbox(ctx, sb.ID)
			must(t, rerr)
			if tc.promoted {
				if err != nil || got.ID != sb.ID || got.State != berth.SandboxRunning || cur.State != berth.SandboxRunning || a.deletes.Load() != 0 {
					t.Fatalf("placement: %+v, %v; row %s, %d deletes; want the running sandbox kept, no delete", got, err, cur.State, a.deletes.Load())
				}
				return
			}
			if tc.undoFails {
				if err == nil || cur.State != berth.SandboxStarting || a.deletes.Load() != 0 {
					t.Fatalf("placement: %v; row %s, %d deletes; want an error, the row starting for the heartbeat to settle, no delete", err, cur.State, a.deletes.Load())
				}
				return
			}
			if err == nil || cur.State != berth.SandboxFailed || a.deletes.Load() != 1 {
				t.Fatalf("placement: %v; row %s, %d deletes; want an error, failed, the agent's copy stopped once", err, cur.State, a.deletes.Load())
			}
			if rs, err := r.st.Reservations(ctx); err != nil || len(rs) != 0 {
				t.Errorf("reservations left: %v, %v", rs, err)
			}
		})
	}
}

// TestPlaceStartedThenReportedFailed (an attack found it): the agent accepted the create, and
// before the placement marked it running the agent's heartbeat reported it failed as it
// started. The create was answered 201 with state failed; now that host is skipped and the
// next one tried, and the answer is a running sandbox.
func TestPlaceStartedThenReportedFailed(t *testing.T) {
	ctx := context.Background()
	r := newPlaceRig(t, nil)
	r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 8192, false) // Pick's first choice: most room
	r.host(t, "b", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
	var crashed string
	r.fs.beforeTransition = func(ctx context.Context, id string, to berth.SandboxState) error {
		if to == berth.SandboxRunning && crashed == "" {
			crashed = id // the heartbeat's ended list got there first
			_, err := r.st.TransitionSandbox(ctx, id, []berth.SandboxState{berth.SandboxStarting},
				berth.SandboxFailed, "crashed at start", "agent/a", r.clock())
			return err
		}
		return nil
	}
	got, err := r.s.place(ctx, newSandbox(""), berth.CreateRequest{}, "test")
	if err != nil || got.State != berth.SandboxRunning || got.AgentID != "b" {
		t.Fatalf("placement: %+v, %v; want running on b", got, err)
	}
	first, err := r.st.Sandbox(ctx, crashed)
	must(t, err)
	if first.State != berth.SandboxFailed || first.AgentID != "a" {
		t.Errorf("the first attempt: %s on %s, want failed on a", first.State, first.AgentID)
	}
}

func TestPlaceUnbindAndNext(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		code        string
		cancel      bool
		restore     bool
		wantDeletes int64
		wantState   berth.SandboxState
		wantErr     string // "" goes on to the next host
		wantFailed  int    // the host's consecutive failed creates (PLC-9)
	}{
		{name: "a refusal: undone, the host excluded", code: berth.EHostStartsSaturated, wantState: berth.SandboxFailed},
		{name: "a failure: the agent told to stop it, counted toward quarantine", code: berth.EInternal,
			wantDeletes: 1, wantState: berth.SandboxFailed, wantFailed: 1},
		{name: "the client went away", code: berth.EHostStartsSaturated, cancel: true, wantState: berth.SandboxFailed,
			wantErr: berth.EUnavailable},
		{name: "a resume refused: paused again, the host excluded", code: berth.ENoCapacity, restore: true,
			wantState: berth.SandboxPaused},
		{name: "a resume whose image is gone ends", code: berth.ENotFound, restore: true, wantState: berth.SandboxPaused,
			wantErr: berth.ENotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPlaceRig(t, nil)
			a := newScriptedAgent(t, answering(tc.code))
			r.host(t, "a", a.srv.URL, 4096, tc.restore)
			sb := newSandbox("")
			at := r.s.createAttempt(berth.CreateRequest{}, "test")
			if tc.restore {
				sb, at = r.s.restoreAttempt(r.pausedSandbox(t), []berth.SandboxState{berth.SandboxPaused}, "test")
			}
			pctx, cancel := context.WithCancel(ctx)
			defer cancel()
			p, err := r.s.begin(pctx, sb, berth.CreateRequest{}, "test", at)
			must(t, err)
			c, err := r.s.choose(pctx, p)
			must(t, err)
			h, err := r.s.reserve(pctx, p, c)
			must(t, err)
			_, u := r.s.bind(pctx, p, c, h)
			if u == nil {
				t.Fatal("bind succeeded; the scripted agent says no")
			}
			if tc.cancel {
				cancel()
			}
			r.s.unbind(pctx, p, c, h, u)
			rs, err := r.st.Reservations(ctx)
			must(t, err)
			cur, err := r.st.Sandbox(ctx, p.sb.ID)
			must(t, err)
			if len(rs) != 0 || r.pending("a") != 0 || cur.State != tc.wantState || a.deletes.Load() != tc.wantDeletes {
				t.Fatalf("after unbind: ledger %+v, pending %d, sandbox %s, %d deletes; want empty, 0, %s, %d",
					rs, r.pending("a"), cur.State, a.deletes.Load(), tc.wantState, tc.wantDeletes)
			}
			if !strings.HasPrefix(cur.Reason, "agent/a: ") {
				t.Fatalf("the undo's reason %q, want the agent's no", cur.Reason)
			}
			err = r.s.next(pctx, p, c, u)
			if berth.ErrorCode(err) != tc.wantErr && !(err == nil && tc.wantErr == "") {
				t.Fatalf("next: %v, want %q", err, tc.wantErr)
			}
			if tc.wantErr == "" && (p.excluded["a"] != tc.code || berth.ErrorCode(p.lastAgentErr) != tc.code) {
				t.Fatalf("next: excluded %v, last %v; want a excluded with %s", p.excluded, p.lastAgentErr, tc.code)
			}
			ag, err := r.st.Agent(ctx, "a")
			must(t, err)
			if ag.CreateFailures != tc.wantFailed {
				t.Fatalf("agent a's failed creates: %d, want %d", ag.CreateFailures, tc.wantFailed)
			}
		})
	}
}

// TestPlaceEveryFailureAfterReserveUnreserves runs the whole loop (creates, resumes) down
// every path where an attempt was reserved and did not become a running sandbox: the ledger
// and the snapshot keep no reservation of any of the create's attempts, no row is left
// starting or resuming (LED-3, C20), and the answer is the one the path has always given.
// A create's row is written in its reservation's transaction (issue 16, goal 1): when that
// write fails (together), nothing was ever reserved, and the ledger must hold nothing.
func TestPlaceEveryFailureAfterReserveUnreserves(t *testing.T) {
	ctx := context.Background()
	create := func(r *placeRig, sb berth.Sandbox, req berth.CreateRequest) func(context.Context) error {
		return func(ctx context.Context) error { _, err := r.s.place(ctx, sb, req, "test"); return err }
	}
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		run  func(t *testing.T, r *placeRig) func(context.Context) error
		want string // the answer's code; "idempotent" for errIdempotent
		// together: the failure is in the one transaction of reservation and row.
		together bool
	}{
		{name: "pinning the volume fails", want: berth.EInternal, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
			r.fs.beforePin = func(context.Context, berth.Volume) error { return errors.New("disk full") }
			sb := newSandbox("")
			sb.Stateful, sb.Volume = true, "data"
			return create(r, sb, berth.CreateRequest{Volume: "data"})
		}},
		{name: "the volume is pinned elsewhere meanwhile, and its host refuses", want: berth.ENoCapacity,
			run: func(t *testing.T, r *placeRig) func(context.Context) error {
				r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 8192, false)
				r.host(t, "b", newScriptedAgent(t, answering(berth.EHostStartsSaturated)).srv.URL, 4096, false)
				r.fs.beforePin = func(ctx context.Context, v berth.Volume) error {
					r.fs.beforePin = nil
					v.AgentID = "b"
					_, err := r.st.PinVolume(ctx, v, "other", r.clock())
					return err
				}
				sb := newSandbox("")
				sb.Stateful, sb.Volume = true, "data"
				return create(r, sb, berth.CreateRequest{Volume: "data"})
			}},
		{name: "another create holds the key", want: "idempotent", together: true, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
			first := newSandbox("key-1")
			first.AgentID, first.State = "a", berth.SandboxRunning
			must(t, r.st.CreateSandbox(ctx, first, "test", r.clock()))
			return create(r, newSandbox("key-1"), berth.CreateRequest{})
		}},
		{name: "the tenant's quota was taken meanwhile", want: berth.ETenantOverQuota, together: true, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
			must(t, r.st.SetQuota(ctx, berth.Quota{Tenant: "acme", MaxSandboxes: 1}, "test", r.clock()))
			other := newSandbox("")
			other.AgentID, other.State = "a", berth.SandboxRunning
			must(t, r.st.CreateSandbox(ctx, other, "test", r.clock()))
			return create(r, newSandbox(""), berth.CreateRequest{})
		}},
		{name: "recording the attempt fails", want: berth.EInternal, together: true, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
			r.fs.beforeCreate = func(context.Context, berth.Sandbox) error { return errors.New("disk full") }
			return create(r, newSandbox(""), berth.CreateRequest{})
		}},
		{name: "every agent refuses", want: berth.EHostStartsSaturated, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering(berth.EHostStartsSaturated)).srv.URL, 8192, false)
			r.host(t, "b", newScriptedAgent(t, answering(berth.EHostStartsSaturated)).srv.URL, 4096, false)
			return create(r, newSandbox(""), berth.CreateRequest{})
		}},
		{name: "every agent fails", want: berth.ENoCapacity, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			for i, id := range []string{"a", "b", "c"} {
				r.host(t, id, newScriptedAgent(t, answering(berth.EInternal)).srv.URL, int64(8192-1024*i), false)
			}
			return create(r, newSandbox(""), berth.CreateRequest{})
		}},
		{name: "more hosts than the patience", cfg: func(c *Config) { c.MaxHostsPerCreate = 2 }, want: berth.ENoCapacity,
			run: func(t *testing.T, r *placeRig) func(context.Context) error {
				for i, id := range []string{"a", "b", "c"} {
					r.host(t, id, newScriptedAgent(t, answering(berth.ENoCapacity)).srv.URL, int64(8192-1024*i), false)
				}
				return create(r, newSandbox(""), berth.CreateRequest{})
			}},
		{name: "the client goes away during the start", want: berth.EUnavailable, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			var cancel context.CancelFunc
			r.host(t, "a", newScriptedAgent(t, func(berth.AgentCreate) string { cancel(); return berth.EHostStartsSaturated }).srv.URL, 4096, false)
			sb := newSandbox("")
			return func(ctx context.Context) error {
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
				_, err := r.s.place(ctx, sb, berth.CreateRequest{}, "test")
				return err
			}
		}},
		{name: "recording running fails", want: berth.EInternal, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, false)
			r.fs.beforeTransition = func(_ context.Context, _ string, to berth.SandboxState) error {
				if to == berth.SandboxRunning {
					return errors.New("disk full")
				}
				return nil
			}
			return create(r, newSandbox(""), berth.CreateRequest{})
		}},
		{name: "a resume: every host refuses", want: berth.ENoCapacity, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering(berth.ENoCapacity)).srv.URL, 8192, true)
			r.host(t, "b", newScriptedAgent(t, answering(berth.ENoCapacity)).srv.URL, 4096, true)
			return r.resume(r.pausedSandbox(t))
		}},
		{name: "a resume: the image is gone", want: berth.ENotFound, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering(berth.ENotFound)).srv.URL, 4096, true)
			return r.resume(r.pausedSandbox(t))
		}},
		{name: "a resume: the sandbox was deleted meanwhile", want: berth.EConflict, run: func(t *testing.T, r *placeRig) func(context.Context) error {
			r.host(t, "a", newScriptedAgent(t, answering("")).srv.URL, 4096, true)
			sb := r.pausedSandbox(t)
			_, err := r.st.TransitionSandbox(ctx, sb.ID, nil, berth.SandboxStopped, "deleted", "test", r.clock())
			must(t, err)
			return r.resume(sb)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPlaceRig(t, tc.cfg)
			err := tc.run(t, r)(ctx)
			if got := berth.ErrorCode(err); !(tc.want == "idempotent" && errors.Is(err, errIdempotent)) && got != tc.want {
				t.Fatalf("placement: %v (%s), want %s", err, got, tc.want)
			}
			reserved := r.fs.reservedIDs()
			rs, err := r.st.Reservations(ctx)
			must(t, err)
			switch {
			case tc.together && (len(reserved) > 0 || len(rs) > 0):
				t.Fatalf("the row's write failed in the reservation's transaction, yet the ledger granted %v and holds %d", reserved, len(rs))
			case !tc.together && len(reserved) == 0:
				t.Fatal("no attempt was reserved: the path does not reach the steps after reserve")
			}
			for _, res := range rs {
				if slices.Contains(reserved, res.SandboxID) {
					t.Errorf("the ledger still holds %s for the failed placement's sandbox %s", res.ID, res.SandboxID)
				}
			}
			for _, id := range []string{"a", "b", "c"} {
				if got := r.pending(id); got > 0 {
					t.Errorf("the snapshot still counts %d MiB pending on %s", got, id)
				}
			}
			for _, id := range reserved {
				if sb, err := r.st.Sandbox(ctx, id); err == nil && (sb.State == berth.SandboxStarting || sb.State == berth.SandboxResuming) {
					t.Errorf("sandbox %s left %s", id, sb.State)
				}
			}
		})
	}
}

// TestPLC10_UnknownRegionIsBadInput (found by a new user): a create for a region no host has
// ever announced ("mars" for "eu") was 503 no_capacity with a Retry-After, so SDKs retried
// for 90 s and reported a full fleet. It is 400 invalid_request naming the regions hosts
// announce; a known region whose hosts are all stale is still a refusal that waits.
func TestPLC10_UnknownRegionIsBadInput(t *testing.T) {
	h := newHarness(t, 0)
	ctx := context.Background()
	for _, a := range []struct {
		id, region string
		at         time.Time
	}{{"eu1", "eu-west", time.Now()}, {"us1", "us-east", time.Now()}, {"ap1", "ap-south", time.Now().Add(-time.Hour)}} {
		_, err := h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: a.id, Address: "http://127.0.0.1:1", Region: a.region,
			Status: berth.AgentActive, IntakeOpen: true, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096,
			MemoryMiBAdmittable: 64, CPUTotal: 2}, a.at)
		must(t, err)
	}
	code, body := h.do(t, http.MethodPost, "/v1/sandboxes", `{"template":"python","region":"mars"}`)
	if code != http.StatusBadRequest || !strings.Contains(body, berth.EInvalidRequest) ||
		!strings.Contains(body, `\"eu-west\"`) || !strings.Contains(body, `\"ap-south\"`) {
		t.Errorf("a region no host announces: %d %s; want 400 invalid_request naming the regions there are", code, body)
	}
	// Known regions: no room there (64 MiB free), or only stale hosts: refusals that wait.
	for _, region := range []string{"eu-west", "ap-south"} {
		code, body := h.do(t, http.MethodPost, "/v1/sandboxes", `{"template":"python","region":"`+region+`"}`)
		if code != http.StatusServiceUnavailable {
			t.Errorf("region %s, announced: %d %s; want 503", region, code, body)
		}
	}
}

// TestPLC9_RequestTheAgentRefusesIsTheCallers400: an agent that judges the request itself bad
// (invalid_request: a size its runtime cannot start, say) speaks for every host. The create
// is 400 after that one agent call — not tried on the next host and answered a retryable 503
// "2 hosts: 2 saturated" — and no host counts a failure toward quarantine (PLC-9).
func TestPLC9_RequestTheAgentRefusesIsTheCallers400(t *testing.T) {
	h := newHarness(t, 0)
	a1, a2 := newFakeAgent(t, berth.EInvalidRequest), newFakeAgent(t, berth.EInvalidRequest)
	h.heartbeat(t, "a1", a1.srv.URL, 4096)
	h.heartbeat(t, "a2", a2.srv.URL, 4096)
	code, _, e := h.create(t)
	if code != http.StatusBadRequest || e.Code != berth.EInvalidRequest {
		t.Fatalf("create the agents refuse as bad: %d %+v; want 400 invalid_request", code, e)
	}
	if n := a1.creates.Load() + a2.creates.Load(); n != 1 {
		t.Errorf("agent create calls: %d; want 1 (every host would say the same)", n)
	}
	for _, id := range []string{"a1", "a2"} {
		a, err := h.st.Agent(context.Background(), id)
		must(t, err)
		if a.CreateFailures != 0 {
			t.Errorf("agent %s counts %d failed creates; want 0 (the request's fault, not the host's)", id, a.CreateFailures)
		}
	}
}
