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

// The store budget of one create (issue 16, goal 1): requests to the database for a create
// without and with an Idempotency-Key, with the agent table cached. On PostgreSQL a create's
// first write is one pipelined batch (BEGIN, the batch, COMMIT); SQLite has no network and
// runs the batch a statement at a time, each counted. docs/PERFORMANCE.md has the counts
// before and after.
var createBudget = map[string]struct{ plain, keyed float64 }{
	"sqlite":   {plain: 12, keyed: 13},
	"postgres": {plain: 6, keyed: 7},
}

// TestCreateRoundTrips counts the store round trips of creates through the real handler on
// SQLite and PostgreSQL and holds them to the budget: a change that adds a statement to the
// hot path fails here, and the counts are logged for docs/PERFORMANCE.md.
func TestCreateRoundTrips(t *testing.T) {
	ctx := context.Background()
	stores := map[string]func(t *testing.T) berth.Store{
		"sqlite": func(t *testing.T) berth.Store {
			st, err := sqlite.Open(ctx, ":memory:")
			must(t, err)
			return st
		},
		"postgres": func(t *testing.T) berth.Store {
			st, err := postgres.Open(ctx, pgtest.Start(t).NewDatabase(t))
			must(t, err)
			return st
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			t.Cleanup(func() { st.Close() })
			key := NewKeySecret()
			must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
			must(t, st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: time.Now()}))
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
