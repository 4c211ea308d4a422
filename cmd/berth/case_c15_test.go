package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/preempt"
)

// rebalanceIMDS serves AWS's IMDSv2 on loopback as the provider documents it
// (shared/cases/notices): a token for a PUT that asks for one, 401 for a read without it,
// spot/instance-action 404 throughout (no interruption ever comes), and the rebalance
// recommendation 404 until warn is set, then the same document on every poll from there on,
// as AWS keeps serving it. rebalancePolls counts the reads of the recommendation.
func rebalanceIMDS(t *testing.T, warn *atomic.Bool, noticeTime time.Time, rebalancePolls, actionPolls *atomic.Int64) *httptest.Server {
	t.Helper()
	const token = "imds-token"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
			if r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			io.WriteString(w, token)
			return
		}
		if r.Header.Get("X-aws-ec2-metadata-token") != token {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/latest/meta-data/spot/instance-action":
			actionPolls.Add(1)
			w.WriteHeader(http.StatusNotFound)
		case "/latest/meta-data/events/recommendations/rebalance":
			rebalancePolls.Add(1)
			if !warn.Load() {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			fmt.Fprintf(w, `{"noticeTime": %q}`, noticeTime.UTC().Format(time.RFC3339))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestCase_C15_RebalanceWithoutInterruption: an AWS rebalance recommendation, read by the
// agent's AWS watcher from a loopback IMDS, with no interruption after it (C15, SPOT-1). The
// warned host — the one every create would pick, having by far the most room — stops taking
// new placements: creates go to the other host, and a create only it could take is refused.
// After its bounded soft cordon it is back in service by itself: it takes that create again,
// though the recommendation is still served on every poll (one cordon for it, C13). The
// sandbox it held throughout was never touched.
func TestCase_C15_RebalanceWithoutInterruption(t *testing.T) {
	const soft = 4 * time.Second // the soft cordon; 30 min by default
	var warn atomic.Bool
	var rebalancePolls, actionPolls atomic.Int64
	imds := rebalanceIMDS(t, &warn, time.Now(), &rebalancePolls, &actionPolls)
	st := bootDev(t, func(c *devConfig) {
		c.Agents, c.Admission, c.AgentMemoryMiB = 2, berth.AdmissionCommitted, 4096
		c.agentHook = func(i int, ac *agent.Config) {
			if i == 0 { // dev-agent-1: the spot host that gets the warning
				ac.MemoryMiB = 16384
				ac.Notices = preempt.AWS{BaseURL: imds.URL, Poll: 50 * time.Millisecond, Log: ac.Logger}
				ac.SoftCordon = soft
			}
		}
	})
	ctx := context.Background()
	c := adminClient(st)
	const warned, other = "dev-agent-1", "dev-agent-2"
	// bigOnly is a create that fits only the warned host (committed mode charges it in full).
	const bigOnly = `{"template":"shell","memory_mb":8192}`

	code, _, before, e := rawCreate(t, st, `{"template":"shell"}`)
	if code != http.StatusCreated || before.AgentID != warned {
		t.Fatalf("create before the warning: %d %+v %+v; want it on %s, the host with the most room", code, before, e, warned)
	}
	from := rebalancePolls.Load()
	waitFor(t, 10*time.Second, "the watcher polling the recommendation", func() (bool, string) {
		return rebalancePolls.Load() >= from+2, fmt.Sprint(rebalancePolls.Load()-from, " polls")
	})
	if a := agentByID(t, c, warned); a.Status != berth.AgentActive || !a.IntakeOpen {
		t.Fatalf("%s with no recommendation served: %s, intake open %t; want active", warned, a.Status, a.IntakeOpen)
	}

	warn.Store(true)
	waitFor(t, 10*time.Second, warned+" cordoned by the warning", func() (bool, string) {
		a := agentByID(t, c, warned)
		return a.Status == berth.AgentDraining && !a.IntakeOpen, fmt.Sprint(a.Status, " intake ", a.IntakeOpen)
	})
	cordoned := time.Now()
	for i := range 2 {
		code, _, sb, e := rawCreate(t, st, `{"template":"shell"}`)
		if code != http.StatusCreated || sb.AgentID != other {
			t.Fatalf("create %d under the warning: %d %+v %+v; want it placed on %s", i+1, code, sb, e, other)
		}
	}
	code, _, _, e = rawCreate(t, st, bigOnly)
	if code != http.StatusServiceUnavailable || e.Code != berth.ENoCapacity || e.Hosts["draining"] != 1 || e.Hosts["insufficient_memory"] != 1 {
		t.Fatalf("a create only %s fits, under the warning: %d %+v; want 503 no_capacity, 1 draining, 1 insufficient_memory", warned, code, e)
	}
	if held := time.Since(cordoned); held >= soft {
		t.Fatalf("the creates under the warning took %v, past the %v soft cordon: they proved nothing", held, soft)
	}

	waitFor(t, soft+15*time.Second, warned+" back in service by itself", func() (bool, string) {
		a := agentByID(t, c, warned)
		return a.Status == berth.AgentActive && a.IntakeOpen, fmt.Sprint(a.Status, " intake ", a.IntakeOpen)
	})
	code, _, sb, e := rawCreate(t, st, bigOnly)
	if code != http.StatusCreated || sb.AgentID != warned {
		t.Fatalf("the create only %s fits, after the soft cordon: %d %+v %+v; want it placed there", warned, code, sb, e)
	}

	// The cordon lasted the soft cordon, not less (that it ended at all is the create above):
	// the events are the server's receive times of the heartbeats that reported each change
	// (C32). The cordon's event says why (LIF-3).
	evs, err := c.Events(ctx, "agent/"+warned)
	if err != nil {
		t.Fatal(err)
	}
	var down, up []berth.Event
	for _, ev := range evs {
		switch {
		case ev.From == string(berth.AgentActive) && ev.To == string(berth.AgentDraining):
			down = append(down, ev)
		case ev.From == string(berth.AgentDraining) && ev.To == string(berth.AgentActive):
			up = append(up, ev)
		}
	}
	if len(down) != 1 || len(up) != 1 {
		t.Fatalf("agent events %+v: want one cordon and one return to service", evs)
	}
	if !strings.Contains(down[0].Reason, "aws rebalance notice") {
		t.Errorf("the cordon's event says %q; want the notice that caused it", down[0].Reason)
	}
	if d := up[0].At.Sub(down[0].At); d < soft-500*time.Millisecond {
		t.Fatalf("the soft cordon lasted %v, want at least %v", d, soft)
	} else {
		t.Logf("the soft cordon lasted %v (configured %v)", d, soft)
	}

	// AWS keeps serving the recommendation: more polls of it change nothing.
	from = rebalancePolls.Load()
	waitFor(t, 10*time.Second, "10 more polls of the same recommendation", func() (bool, string) {
		return rebalancePolls.Load() >= from+10, fmt.Sprint(rebalancePolls.Load()-from, " polls")
	})
	if a := agentByID(t, c, warned); a.Status != berth.AgentActive || !a.IntakeOpen {
		t.Fatalf("%s after more polls of the same recommendation: %s, intake open %t; want still in service (C13)", warned, a.Status, a.IntakeOpen)
	}
	if actionPolls.Load() == 0 {
		t.Fatal("the watcher never looked for an interruption notice")
	}
	// A soft warning moves nothing: the sandbox the host held throughout still runs there.
	if got, err := c.Sandbox(ctx, before.ID); err != nil || got.State != berth.SandboxRunning || got.AgentID != warned {
		t.Fatalf("the sandbox %s held through the warning: %+v, %v; want still running", warned, got, err)
	}
}
