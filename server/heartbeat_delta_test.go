package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/store/sqlite"
)

// TestHeartbeat_DeltaOverHTTP (issue 16, goal 2): the server answers a heartbeat with the seq
// whose held list it keeps; a delta on that seq changes only what it lists; a delta on any
// other base is answered resync (its ended list still applied, its figures not); a delta
// that does not follow its base is a 400.
func TestHeartbeat_DeltaOverHTTP(t *testing.T) {
	h := newHarness(t, 0)
	ctx := t.Context()
	c := client.New(h.srv.URL, joinAs(t, h.srv.URL, "a1"))
	hb := berth.Heartbeat{AgentID: "a1", Address: "http://127.0.0.1:1", Status: berth.AgentActive, CPUTotal: 2,
		MemoryMiBTotal: 4096, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBAdmittable: 3000, IntakeOpen: true,
		BootID: "b1", Seq: 1, Sandboxes: []berth.HeldSandbox{{ID: "sb-1"}, {ID: "sb-2"}}}
	if ack, err := c.HeartbeatAck(ctx, hb); err != nil || ack != (berth.HeartbeatAck{Seq: 1}) {
		t.Fatalf("whole list: %+v, %v; want seq 1 acknowledged", ack, err)
	}
	d := hb
	d.Seq, d.Delta, d.BaseSeq, d.MemoryMiBAdmittable = 2, true, 1, 2500
	d.Sandboxes, d.Removed = []berth.HeldSandbox{{ID: "sb-3", Starting: true}}, []string{"sb-1"}
	if ack, err := c.HeartbeatAck(ctx, d); err != nil || ack != (berth.HeartbeatAck{Seq: 2}) {
		t.Fatalf("delta on seq 1: %+v, %v; want seq 2 acknowledged", ack, err)
	}
	a, err := h.st.Agent(ctx, "a1")
	if err != nil || a.MemoryMiBAdmittable != 2500 || len(a.Sandboxes) != 2 || a.Sandboxes[0].ID != "sb-2" || a.Sandboxes[1].ID != "sb-3" {
		t.Fatalf("after the delta: %+v, %v; want admittable 2500, held [sb-2 sb-3]", a, err)
	}
	stale := d
	stale.Seq, stale.BaseSeq, stale.MemoryMiBAdmittable = 4, 3, 100
	if ack, err := c.HeartbeatAck(ctx, stale); err != nil || ack != (berth.HeartbeatAck{Resync: true}) {
		t.Fatalf("delta on seq 3 while the server holds 2: %+v, %v; want resync", ack, err)
	}
	if a, err := h.st.Agent(ctx, "a1"); err != nil || a.MemoryMiBAdmittable != 2500 {
		t.Fatalf("a refused delta changed the figures: %+v, %v", a, err)
	}
	for _, bad := range []struct{ seq, base int64 }{{5, 5}, {5, 0}, {0, 1}} {
		x := d
		x.Seq, x.BaseSeq = bad.seq, bad.base
		if _, err := c.HeartbeatAck(ctx, x); berth.ErrorCode(err) != berth.EInvalidRequest {
			t.Fatalf("delta seq %d base %d: %v; want invalid_request", bad.seq, bad.base, err)
		}
	}
	whole := hb
	whole.Seq, whole.Removed = 6, []string{"sb-1"}
	if _, err := c.HeartbeatAck(ctx, whole); berth.ErrorCode(err) != berth.EInvalidRequest {
		t.Fatalf("a whole list with removed ids: %v; want invalid_request", err)
	}
}

// readGate counts the store reads a test wraps and holds each one until release is closed,
// so concurrent callers meet inside it.
type readGate struct {
	reads   atomic.Int64
	release chan struct{}
}

func (g *readGate) pass() {
	g.reads.Add(1)
	<-g.release
}

// countingAgents gates reads of the whole agent table (readGate).
type countingAgents struct {
	berth.Store
	readGate
}

func (c *countingAgents) AgentsChangedSince(ctx context.Context, cursor string) (berth.AgentChanges, error) {
	c.pass()
	return c.Store.AgentsChangedSince(ctx, cursor)
}

// TestRefreshIfStale_SingleFlight (issue 16, goal 2): creates that find the snapshot stale at
// the same moment share one read of the agent table instead of each reading it.
func TestRefreshIfStale_SingleFlight(t *testing.T) {
	st, err := sqlite.Open(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	synctest.Test(t, func(t *testing.T) {
		counted := &countingAgents{Store: st, readGate: readGate{release: make(chan struct{})}}
		cfg := DefaultConfig()
		cfg.Clock = time.Now
		s := newScheduler(counted, cfg, nil, nil)
		const callers = 8
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for range callers {
			wg.Go(func() { errs <- s.refreshIfStale(context.Background()) })
		}
		synctest.Wait() // every caller is in the read or waiting for it
		if n := counted.reads.Load(); n != 1 {
			close(counted.release)
			wg.Wait()
			t.Fatalf("%d concurrent stale callers read the agent table %d times; want 1", callers, n)
		}
		close(counted.release)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := counted.reads.Load(); n != 1 {
			t.Fatalf("reads after the shared refresh: %d; want 1", n)
		}
	})
}

// TestHeartbeat_AnswerIsJSON: the 200 answer is a JSON object an agent can read.
func TestHeartbeat_AnswerIsJSON(t *testing.T) {
	h := newHarness(t, 0)
	cred := joinAs(t, h.srv.URL, "j1")
	body := `{"agent_id":"j1","address":"http://127.0.0.1:1","status":"active","cpu_total":2,"memory_mb_total":4096,
		"memory_admission":"committed","memory_mb_admittable":3000,"intake_open":true,"sandboxes":[],"boot_id":"b1","seq":3}`
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/agents/heartbeat", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cred)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != `{"seq":3}` {
		t.Fatalf("answer: %d %q; want 200 {\"seq\":3}", resp.StatusCode, b)
	}
}
