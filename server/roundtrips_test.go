package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
	"github.com/berth-dev/berth/store/sqlite"
)

// roundTripStores open the stores whose round trips are counted: SQLite in memory and a
// fresh PostgreSQL database.
var roundTripStores = map[string]func(t *testing.T) berth.Store{
	"sqlite": func(t *testing.T) berth.Store {
		st, err := sqlite.Open(context.Background(), ":memory:")
		must(t, err)
		return st
	},
	"postgres": func(t *testing.T) berth.Store {
		st, err := postgres.Open(context.Background(), pgtest.Start(t).NewDatabase(t))
		must(t, err)
		return st
	},
}

// The store budget of one create (issue 16, goal 1): requests to the database for a create
// without and with an Idempotency-Key, with the agent table cached. On PostgreSQL a create's
// first write is one pipeline that is its own implicit transaction (two row locks, then the
// statement that reserves and inserts only when the room is there), then the `running` mark
// as one statement; a keyed create adds its answer. SQLite has no network and runs the
// transaction a statement at a time, each counted. docs/PERFORMANCE.md has the counts before
// and after.
var createBudget = map[string]struct{ plain, keyed float64 }{
	"sqlite":   {plain: 12, keyed: 13},
	"postgres": {plain: 2, keyed: 3},
}

// TestCreateRoundTrips counts the store round trips of creates through the real handler on
// SQLite and PostgreSQL and holds them to the budget: a change that adds a statement to the
// hot path fails here, and the counts are logged for docs/PERFORMANCE.md.
func TestCreateRoundTrips(t *testing.T) {
	ctx := context.Background()
	for name, open := range roundTripStores {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			t.Cleanup(func() { st.Close() })
			key := NewKeySecret()
			must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
			must(t, tenantErr(st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: time.Now()})))
			must(t, st.PutAPIKey(ctx, berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleAdmin, Hash: HashKey(key), CreatedAt: time.Now()}))
			a := newFakeAgent(t, "")
			_, err := st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Address: a.srv.URL, Status: berth.AgentActive, IntakeOpen: true,
				MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 1 << 30, MemoryMiBAdmittable: 1 << 30, CPUTotal: 2,
				HeartbeatAt: time.Now()}, time.Now())
			must(t, err)
			cfg := DefaultConfig()
			cfg.NodeToken, cfg.CacheTTL = "node-token", time.Hour
			cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			srv := httptest.NewServer(New(cfg, st).Handler())
			t.Cleanup(srv.Close)
			rt := st.(interface{ RoundTrips() int64 })
			create := func(i int, keyed bool) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/sandboxes", strings.NewReader(`{"template":"python"}`))
				req.Header.Set("Authorization", "Bearer "+key)
				if keyed {
					req.Header.Set("Idempotency-Key", fmt.Sprintf("rt-%d", i))
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					t.Fatalf("create %d: %d", i, resp.StatusCode)
				}
			}
			create(-1, false) // warms the caches (and PostgreSQL's prepared statements)
			create(-2, true)
			const n = 20
			count := func(keyed bool) float64 {
				before := rt.RoundTrips()
				for i := range n {
					create(i, keyed)
				}
				return float64(rt.RoundTrips()-before) / n
			}
			plain, keyed := count(false), count(true)
			t.Logf("%s: store round trips per create: %.1f without an Idempotency-Key, %.1f with one", name, plain, keyed)
			if b := createBudget[name]; plain > b.plain || keyed > b.keyed {
				t.Errorf("a create costs %.1f round trips (budget %.0f), a keyed one %.1f (budget %.0f)", plain, b.plain, keyed, b.keyed)
			}
		})
	}
}

// The store budget of one heartbeat (issue 16, goal 2): a delta that changes nothing, and a
// delta that promotes a started sandbox, nets its reservation and ends another. On
// PostgreSQL the usual delta is one pipelined batch carrying its BEGIN, and COMMIT, plus the statements of
// what changed (a transition is a few statements and an event; netting a DELETE and an
// event); the general path it replaced took 8 and 20. SQLite keeps the general path, one
// statement more since the revoke check (TRUST-1), which PostgreSQL pipelines into its batch.
var heartbeatBudget = map[string]struct{ idle, busy float64 }{
	"sqlite":   {idle: 9, busy: 22},
	"postgres": {idle: 2, busy: 12},
}

// TestHeartbeatRoundTrips counts the store round trips of delta heartbeats and holds them to
// the budget; the counts are logged for docs/PERFORMANCE.md.
func TestHeartbeatRoundTrips(t *testing.T) {
	ctx := context.Background()
	for name, open := range roundTripStores {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			t.Cleanup(func() { st.Close() })
			rt := st.(interface{ RoundTrips() int64 })
			now := time.Now()
			hb := berth.Heartbeat{AgentID: "a1", Address: "http://127.0.0.1:1", Status: berth.AgentActive, IntakeOpen: true,
				MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 1 << 20, MemoryMiBAdmittable: 1 << 20, CPUTotal: 2,
				BootID: "b1", Seq: 1, HeartbeatAt: now}
			// Under a live credential, as the server sends them: the check is in the batch.
			must(t, st.JoinAgent(ctx, berth.AgentCredential{AgentID: "a1", Hash: "a1-h", CreatedAt: now}))
			res, err := st.RecordHeartbeat(ctx, hb, "a1-h", now)
			if err != nil || !res.Applied {
				t.Fatalf("whole heartbeat: %+v, %v", res, err)
			}
			send := func(change func(*berth.Heartbeat)) float64 {
				t.Helper()
				hb.BaseSeq, hb.Seq, hb.Delta = hb.Seq, hb.Seq+1, true
				hb.Sandboxes, hb.Removed, hb.Ended = nil, nil, nil
				if change != nil {
					change(&hb)
				}
				before := rt.RoundTrips()
				res, err := st.RecordHeartbeat(ctx, hb, "a1-h", now)
				if err != nil || !res.Applied {
					t.Fatalf("delta %d: %+v, %v", hb.Seq, res, err)
				}
				return float64(rt.RoundTrips() - before)
			}
			send(nil) // warms PostgreSQL's prepared statements
			idle := send(nil)
			var busy float64
			for i := range 3 {
				sb, ended := fmt.Sprintf("sb-%d", i), fmt.Sprintf("sb-old-%d", i)
				for _, id := range []string{sb, ended} {
					ok, err := st.ReserveAndCreate(ctx, berth.Reservation{ID: "r-" + id, AgentID: "a1", SandboxID: id, MiB: 1, CreatedAt: now, ExpiresAt: now.Add(time.Minute)},
						berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1", State: berth.SandboxStarting,
							MemoryMiB: 1, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now)
					if err != nil || !ok {
						t.Fatalf("create %s: %v, %v", id, ok, err)
					}
				}
				send(func(hb *berth.Heartbeat) { hb.Sandboxes = []berth.HeldSandbox{{ID: ended}} })
				busy = send(func(hb *berth.Heartbeat) {
					hb.Sandboxes = []berth.HeldSandbox{{ID: sb}}
					hb.Removed = []string{ended}
					hb.Ended = []berth.EndedSandbox{{ID: ended, State: berth.SandboxStopped, Reason: "ttl"}}
				})
				if got, err := st.Sandbox(ctx, sb); err != nil || got.State != berth.SandboxRunning {
					t.Fatalf("%s after the heartbeat that lists it started: %+v, %v; want running", sb, got, err)
				}
			}
			t.Logf("%s: store round trips per delta heartbeat: %.0f changing nothing, %.0f promoting one sandbox, netting its reservation and ending another",
				name, idle, busy)
			if b := heartbeatBudget[name]; idle > b.idle || busy > b.busy {
				t.Errorf("a delta heartbeat costs %.0f round trips (budget %.0f), a busy one %.0f (budget %.0f)", idle, b.idle, busy, b.busy)
			}
		})
	}
}
