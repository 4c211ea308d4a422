package storetest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// testAgentCredentials: a join stores a live credential; a re-join revokes the id's older one
// as "rejoin"; an admin revoke ends the live one and refuses later joins for that id; other
// ids are untouched (TRUST-1).
func testAgentCredentials(t *testing.T, s berth.Store) {
	ctx := t.Context()
	_, err := s.AgentCredentialByHash(ctx, "none")
	wantNotFound(t, "AgentCredentialByHash(unknown)", err)
	_, err = s.RevokeAgent(ctx, "a1", T0)
	wantNotFound(t, "RevokeAgent(never joined)", err)

	a1 := berth.AgentCredential{AgentID: "a1", Hash: "h1", CreatedAt: T0}
	a1b := berth.AgentCredential{AgentID: "a1", Hash: "h1b", CreatedAt: at(time.Second)}
	b := berth.AgentCredential{AgentID: "b", Hash: "hb", CreatedAt: T0}
	for _, c := range []berth.AgentCredential{a1, b, a1b} {
		if err := s.JoinAgent(ctx, c); err != nil {
			t.Fatalf("JoinAgent(%s): %v", c.Hash, err)
		}
	}
	a1.RevokedAt, a1.RevokedBy = a1b.CreatedAt, "rejoin"
	got, err := s.AgentCredentials(ctx)
	if err != nil {
		t.Fatalf("AgentCredentials: %v", err)
	}
	if diff := cmp.Diff([]berth.AgentCredential{a1, a1b, b}, got); diff != "" {
		t.Errorf("AgentCredentials after a re-join (-want +got):\n%s", diff)
	}
	n, err := s.RevokeAgent(ctx, "a1", at(2*time.Second))
	if err != nil || n != 1 {
		t.Fatalf("RevokeAgent(a1) = %d, %v; want 1, nil", n, err)
	}
	if n, err := s.RevokeAgent(ctx, "a1", at(3*time.Second)); err != nil || n != 0 {
		t.Errorf("RevokeAgent(a1) again = %d, %v; want 0, nil", n, err)
	}
	c, err := s.AgentCredentialByHash(ctx, "h1b")
	if err != nil || c.Live() || c.RevokedBy != "admin" || !c.RevokedAt.Equal(at(2*time.Second)) {
		t.Errorf("AgentCredentialByHash(h1b) = %+v, %v; want revoked by admin at T0+2s", c, err)
	}
	if err := s.JoinAgent(ctx, berth.AgentCredential{AgentID: "a1", Hash: "h1c", CreatedAt: at(4 * time.Second)}); !errors.Is(err, berth.ErrRevoked) {
		t.Errorf("JoinAgent after an admin revoke: err = %v, want ErrRevoked", err)
	}
	if c, err := s.AgentCredentialByHash(ctx, "hb"); err != nil || !c.Live() {
		t.Errorf("AgentCredentialByHash(hb) = %+v, %v; want b's credential live", c, err)
	}
	// Joins racing for one id share a created_at; an admin revoke lands on whichever rows
	// were live, and may not be on the row a "latest" order picks (an attacker's finding):
	// the id stays banned all the same.
	for _, h := range []string{"tz", "ta"} {
		if err := s.JoinAgent(ctx, berth.AgentCredential{AgentID: "tie", Hash: h, CreatedAt: at(5 * time.Second)}); err != nil {
			t.Fatalf("JoinAgent(tie, %s): %v", h, err)
		}
	}
	if _, err := s.RevokeAgent(ctx, "tie", at(6*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.JoinAgent(ctx, berth.AgentCredential{AgentID: "tie", Hash: "t2", CreatedAt: at(7 * time.Second)}); !errors.Is(err, berth.ErrRevoked) {
		t.Errorf("JoinAgent(tie) after an admin revoke of tied rows: err = %v, want ErrRevoked", err)
	}
}

// testAgentJoinsRace: joins and an admin revoke for one id racing on several connections
// settle as if they had run one at a time (TRUST-1). Joins alone leave exactly one live
// credential; with a revoke among them, a revoke that found the id leaves none live (joins
// before it were revoked, joins after it refused) and one that found nothing leaves one.
func testAgentJoinsRace(t *testing.T, s berth.Store) {
	ctx := t.Context()
	const rounds, joiners = 25, 6
	live := func(id string) int {
		t.Helper()
		cs, err := s.AgentCredentials(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range cs {
			if c.AgentID == id && c.Live() {
				n++
			}
		}
		return n
	}
	for round := range rounds {
		for _, withRevoke := range []bool{false, true} {
			id := fmt.Sprintf("race-%d-%t", round, withRevoke)
			var wg sync.WaitGroup
			var revoked atomic.Int64
			revokeFound := atomic.Bool{}
			for j := range joiners {
				wg.Go(func() {
					err := s.JoinAgent(ctx, berth.AgentCredential{AgentID: id, Hash: fmt.Sprintf("%s-h%d", id, j), CreatedAt: T0})
					if err != nil && !errors.Is(err, berth.ErrRevoked) {
						t.Errorf("JoinAgent(%s): %v", id, err)
					}
				})
				if withRevoke && j == joiners/2 {
					wg.Go(func() {
						n, err := s.RevokeAgent(ctx, id, at(time.Second))
						switch {
						case errors.Is(err, berth.ErrNotFound):
						case err != nil:
							t.Errorf("RevokeAgent(%s): %v", id, err)
						default:
							revokeFound.Store(true)
							revoked.Add(int64(n))
						}
					})
				}
			}
			wg.Wait()
			want := 1
			if revokeFound.Load() {
				want = 0
			}
			if got := live(id); got != want {
				t.Fatalf("round %d (revoke %t, found %t): %d live credentials for %s, want %d",
					round, withRevoke, revokeFound.Load(), got, id, want)
			}
		}
	}
}

// testHeartbeatAfterRevoke: once RevokeAgent has returned, no heartbeat of that agent is
// applied — neither one sent after it (ErrRevoked, whole or delta) nor one that was already on
// its way while the revoke ran (TRUST-1: a revoked agent is treated as silent; on PostgreSQL
// such heartbeats used to commit after the revoke and keep the host fresh).
func testHeartbeatAfterRevoke(t *testing.T, s berth.Store) {
	ctx := t.Context()
	seen := func(id string) time.Time { t.Helper(); return lastSeen(t, s, id) }
	// In order: a whole heartbeat, a delta on it, the revoke, then both kinds refused.
	if err := s.JoinAgent(ctx, berth.AgentCredential{AgentID: "rv", Hash: "rv-h", CreatedAt: T0}); err != nil {
		t.Fatal(err)
	}
	hb := wholeThenDelta(t, s, "rv", "rv-h")
	if _, err := s.RevokeAgent(ctx, "rv", at(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	hb.Seq, hb.BaseSeq = 3, 2
	if _, err := s.RecordHeartbeat(ctx, hb, "rv-h", at(4*time.Second)); !errors.Is(err, berth.ErrRevoked) {
		t.Errorf("delta heartbeat after the revoke: %v, want ErrRevoked", err)
	}
	hb.Seq, hb.Delta, hb.BaseSeq = 4, false, 0
	if _, err := s.RecordHeartbeat(ctx, hb, "rv-h", at(5*time.Second)); !errors.Is(err, berth.ErrRevoked) {
		t.Errorf("whole heartbeat after the revoke: %v, want ErrRevoked", err)
	}
	if got := seen("rv"); !got.Equal(at(2 * time.Second)) {
		t.Errorf("last seen %v after refused heartbeats, want %v", got, at(2*time.Second))
	}
	// The revoke drained its host: no replica places on it from now on, and an undrain
	// cannot reopen it.
	if a, err := s.Agent(ctx, "rv"); err != nil || a.Status != berth.AgentDraining || a.DrainReason != "credential revoked" {
		t.Errorf("agent after its revoke: %s (drain %q), %v; want draining, \"credential revoked\"", a.Status, a.DrainReason, err)
	}
	if err := s.SetAgentDrain(ctx, "rv", false, "", "admin/ops", at(6*time.Second)); !errors.Is(err, berth.ErrRevoked) {
		t.Errorf("undrain of a revoked agent: %v, want ErrRevoked", err)
	}
	if a, err := s.Agent(ctx, "rv"); err != nil || a.Status != berth.AgentDraining {
		t.Errorf("revoked agent after an undrain: %s, %v; want draining", a.Status, err)
	}

	// Racing: heartbeats on several connections while the revoke runs.
	raceHeartbeats(t, s, "rv-race", "revoke", func(id string) error {
		_, err := s.RevokeAgent(ctx, id, at(time.Hour))
		return err
	})
}

// testHeartbeatCredentialLive: a heartbeat is applied only under a live credential of its
// own agent id (RecordHeartbeat's credHash, TRUST-1) — never under one a rejoin revoked,
// another id's, or an unknown one, whole or delta — and once JoinAgent has returned, no
// heartbeat under the credential it replaced is applied, not even one already on its way. A
// server may then answer heartbeats' credentials from a cache.
func testHeartbeatCredentialLive(t *testing.T, s berth.Store) {
	ctx := t.Context()
	seen := func(id string) time.Time { t.Helper(); return lastSeen(t, s, id) }
	for _, c := range []berth.AgentCredential{{AgentID: "cl", Hash: "cl-1"}, {AgentID: "other", Hash: "other-1"}} {
		c.CreatedAt = T0
		if err := s.JoinAgent(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	hb := wholeThenDelta(t, s, "cl", "cl-1")
	if err := s.JoinAgent(ctx, berth.AgentCredential{AgentID: "cl", Hash: "cl-2", CreatedAt: at(3 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	for i, hash := range []string{"cl-1", "other-1", "never-joined"} {
		for _, delta := range []bool{true, false} {
			hb.Seq, hb.Delta, hb.BaseSeq = int64(3+2*i), delta, 2
			if !delta {
				hb.BaseSeq = 0
			}
			if res, err := s.RecordHeartbeat(ctx, hb, hash, at(4*time.Second)); !errors.Is(err, berth.ErrRevoked) {
				t.Errorf("heartbeat of cl (delta %v) under %q: %+v, %v; want ErrRevoked", delta, hash, res, err)
			}
		}
	}
	if got := seen("cl"); !got.Equal(at(2 * time.Second)) {
		t.Errorf("last seen %v after refused heartbeats, want %v", got, at(2*time.Second))
	}
	hb.Seq, hb.Delta, hb.BaseSeq = 10, true, 2
	if res, err := s.RecordHeartbeat(ctx, hb, "cl-2", at(5*time.Second)); err != nil || !res.Applied {
		t.Fatalf("delta heartbeat under the new credential: %+v, %v", res, err)
	}

	// Racing: heartbeats under the old credential on several connections while a rejoin runs.
	raceHeartbeats(t, s, "cl-race", "rejoin", func(id string) error {
		return s.JoinAgent(ctx, berth.AgentCredential{AgentID: id, Hash: id + "-new", CreatedAt: at(time.Hour)})
	})
}

// raceHeartbeats joins agents <prefix>-<round> with the credential hash "<id>-h" and, while
// heartbeats under that credential run on several connections, calls cut (a revoke, a
// rejoin): once cut has returned, no heartbeat may be applied, so the agent's last seen must
// not move after it. Heartbeats may fail only with ErrRevoked.
func raceHeartbeats(t *testing.T, s berth.Store, prefix, what string, cut func(id string) error) {
	ctx := t.Context()
	seen := func(id string) time.Time { t.Helper(); return lastSeen(t, s, id) }
	const rounds, senders, beats = 10, 6, 20
	for round := range rounds {
		id := fmt.Sprintf("%s-%d", prefix, round)
		if err := s.JoinAgent(ctx, berth.AgentCredential{AgentID: id, Hash: id + "-h", CreatedAt: T0}); err != nil {
			t.Fatal(err)
		}
		var seq atomic.Int64
		send := func() error {
			n := seq.Add(1)
			hb := heartbeat(id, 2048)
			hb.Seq = n
			_, err := s.RecordHeartbeat(ctx, hb, id+"-h", at(time.Duration(n)*time.Millisecond))
			return err
		}
		if err := send(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range senders {
			wg.Go(func() {
				for range beats {
					if err := send(); err != nil && !errors.Is(err, berth.ErrRevoked) {
						t.Errorf("heartbeat of %s: %v", id, err)
						return
					}
				}
			})
		}
		if err := cut(id); err != nil {
			t.Fatal(err)
		}
		after := seen(id)
		wg.Wait()
		if got := seen(id); !got.Equal(after) {
			t.Fatalf("round %d: %s was last seen at %v when its %s returned, and at %v once its heartbeats ended: one was applied after the %s",
				round, id, after, what, got, what)
		}
	}
}

// lastSeen is agent id's LastSeen.
func lastSeen(t *testing.T, s berth.Store, id string) time.Time {
	t.Helper()
	a, err := s.Agent(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return a.LastSeen
}

// wholeThenDelta records, under the credential hash, agent id's whole heartbeat (seq 1, at
// 1 s) and a delta on it (seq 2, at 2 s), both of which must apply; it returns the delta.
func wholeThenDelta(t *testing.T, s berth.Store, id, hash string) berth.Heartbeat {
	t.Helper()
	hb := heartbeat(id, 2048)
	hb.Seq = 1
	if res, err := s.RecordHeartbeat(t.Context(), hb, hash, at(time.Second)); err != nil || !res.Applied {
		t.Fatalf("whole heartbeat of %s under %q: %+v, %v", id, hash, res, err)
	}
	hb.Seq, hb.Delta, hb.BaseSeq = 2, true, 1
	if res, err := s.RecordHeartbeat(t.Context(), hb, hash, at(2*time.Second)); err != nil || !res.Applied {
		t.Fatalf("delta heartbeat of %s under %q: %+v, %v", id, hash, res, err)
	}
	return hb
}
