package server

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/placement"
	"github.com/berth-dev/berth/store/sqlite"
)

// seedRows runs each statement on the SQLite database at path through a connection of its
// own, beside the store's: how a test lays down a fleet's worth of rows in a second.
func seedRows(t *testing.T, path string, stmts ...string) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	must(t, err)
	defer db.Close()
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// manyRunning is an INSERT of n running sandboxes on agentID, ids <prefix>-<i>, created at
// createdMS + i and expiring at expiresMS + i (unix ms).
func manyRunning(prefix, agentID string, n int, createdMS, expiresMS int64) string {
	return fmt.Sprintf(`WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < %d)
		INSERT INTO sandboxes (id, template, tenant, agent_id, state, memory_mb, vcpus, created_at, expires_at)
		SELECT '%s-' || n, 'python', 't', '%s', 'running', 512, 1, %d + n, %d + n FROM i`,
		n, prefix, agentID, createdMS, expiresMS)
}

// TestAPI3_EstimateReadsPastTheNewestRunning (found reading the estimate): a refusal's
// Retry-After came from the 100,000 newest running sandboxes, so on a fleet running more —
// 10,000 hosts at 50 each run half a million — the sandbox whose TTL ends first could be
// left out, and the hint said 5 s ("nothing expires") or a later expiry. Here 100,001 newer
// sandboxes run on a drained host and expire later; the one older sandbox on the open host
// expires in 30 s, and the hint must be 30 s plus one heartbeat.
func TestAPI3_EstimateReadsPastTheNewestRunning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	st, err := sqlite.Open(context.Background(), path)
	must(t, err)
	t.Cleanup(func() { st.Close() })
	now := time.Now().Truncate(time.Millisecond) // as the store keeps it
	seedRows(t, path,
		manyRunning("old", "a1", 1, now.Add(-time.Hour).UnixMilli(), now.Add(30*time.Second).UnixMilli()),
		manyRunning("new", "a2", 100_001, now.Add(-time.Minute).UnixMilli(), now.Add(10*time.Minute).UnixMilli()))

	cfg := DefaultConfig()
	cfg.Clock = func() time.Time { return now }
	s := newScheduler(st, cfg, nil, nil)
	s.hosts = []placement.Host{
		{ID: "a1", LastSeenNano: now.UnixNano(), IntakeOpen: true, Mode: berth.AdmissionCommitted},
		{ID: "a2", LastSeenNano: now.UnixNano(), IntakeOpen: true, Draining: true, Mode: berth.AdmissionCommitted},
	}
	if got, want := s.retryAfter(context.Background(), berth.ENoCapacity, 512), 30*time.Second+cfg.HeartbeatInterval; got != want {
		t.Fatalf("Retry-After %v, want %v: the first expiry on the open host", got, want)
	}
}

// TestAPI3_EstimateSkipsClosedHostsBounded: the first expiries on closed hosts are read past,
// a page at a time, to the first on an open host; when over 10,240 (expiryPages pages) come
// first, the estimate gives up on the TTL and says what it says when nothing expires (5 s)
// rather than read on, and keeps that answer for its second: 50 concurrent refusals then read
// the 40 pages once. (Not kept, as first written, the refusals — which estimate one at a time
// — each read them in turn: 2,000 reads, found by an attack.)
func TestAPI3_EstimateSkipsClosedHostsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	st, err := sqlite.Open(context.Background(), path)
	must(t, err)
	t.Cleanup(func() { st.Close() })
	now := time.Now().Truncate(time.Millisecond) // as the store keeps it
	created := now.Add(-time.Hour).UnixMilli()
	cfg := DefaultConfig()
	cfg.Clock = func() time.Time { return now }
	hosts := []placement.Host{
		{ID: "a1", LastSeenNano: now.UnixNano(), IntakeOpen: true, Mode: berth.AdmissionCommitted},
		{ID: "a2", LastSeenNano: now.UnixNano(), IntakeOpen: true, Quarantined: true, Mode: berth.AdmissionCommitted},
	}
	// 600 on the closed host expire in 10 s and after; the open host's in 40 s: three pages.
	seedRows(t, path, manyRunning("closed", "a2", 600, created, now.Add(10*time.Second).UnixMilli()),
		manyRunning("open", "a1", 1, created, now.Add(40*time.Second).UnixMilli()))
	s := newScheduler(st, cfg, nil, nil)
	s.hosts = hosts
	if got, want := s.retryAfter(context.Background(), berth.ENoCapacity, 512), 40*time.Second+cfg.HeartbeatInterval; got != want {
		t.Fatalf("Retry-After %v, want %v: past 600 expiries on a quarantined host", got, want)
	}

	seedRows(t, path, manyRunning("more", "a2", expiryPage*expiryPages, created, now.Add(20*time.Second).UnixMilli()))
	reads := &countingExpiries{Store: st}
	s = newScheduler(reads, cfg, nil, nil)
	s.hosts = hosts
	var wg sync.WaitGroup
	got := make([]time.Duration, 50)
	for i := range got {
		wg.Go(func() { got[i] = s.retryAfter(context.Background(), berth.ENoCapacity, 512) })
	}
	wg.Wait()
	for _, d := range got {
		if d != 5*time.Second {
			t.Fatalf("Retry-After %v past %d expiries on a closed host, want the 5 s of no known expiry", d, expiryPage*expiryPages)
		}
	}
	if n := reads.n.Load(); n != expiryPages {
		t.Fatalf("50 concurrent refusals read %d pages of expiries, want %d: one estimate, kept for its second", n, expiryPages)
	}
}

// countingExpiries counts Store.ExpiringFirst reads.
type countingExpiries struct {
	berth.Store
	n atomic.Int64
}

func (c *countingExpiries) ExpiringFirst(ctx context.Context, from berth.Expiry, limit int) ([]berth.Expiry, error) {
	c.n.Add(1)
	return c.Store.ExpiringFirst(ctx, from, limit)
}
