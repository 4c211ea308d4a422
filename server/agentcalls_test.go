package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// TestAgentCallsYieldToTheAgentsRefusedBefore: an agent whose call ended after another was
// refused for want of a slot yields the freed slot to it; an agent with no call ended since
// takes a free slot at once; one call per agent; a refused agent that stops asking for
// longer than the expiry is no longer yielded to.
func TestAgentCallsYieldToTheAgentsRefusedBefore(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
	c := newAgentCalls(2, 30*time.Second, func() time.Time { return now })
	take := func(id string) func() {
		t.Helper()
		done, ok := c.start(id)
		if !ok {
			t.Fatalf("%s was refused a slot", id)
		}
		return done
	}
	refused := func(id string) {
		t.Helper()
		if _, ok := c.start(id); ok {
			t.Fatalf("%s took a slot", id)
		}
	}
	h1, h2 := take("h1"), take("h2")
	refused("h1") // its own call runs
	refused("honest")
	refused("late")
	h1()
	refused("h1") // asks again at once: the honest agent was refused before h1's call ended
	honest := take("honest")
	h2()
	refused("h2") // "late" was refused before h2's call ended
	late := take("late")
	honest()
	late()
	h1 = take("h1") // refused after honest and late, who no longer wait: its turn
	refused("honest")
	now = now.Add(31 * time.Second) // neither asked since: both forgotten, h2 no longer yielded to
	honest = take("honest")
	h1()
	honest()
	if c.busy("h1") || c.busy("honest") {
		t.Fatal("a call given back is still counted as running")
	}
	if c.queue.Len() != 0 || len(c.ended) != 0 {
		t.Fatalf("%d waiters, %d ends remembered with no one waiting", c.queue.Len(), len(c.ended))
	}
}

// TestStopRoundsYieldToTheAgentsRefusedBefore (an attack on stop 29): agents whose deletes
// never answer, heartbeating again the moment their round ends, took every stop-round slot
// back as it freed, and an honest agent's stop round never ran (0 of 24 tries in 6 s). A
// slot freed now goes to the agent refused before: the honest agent's round runs, and the
// hostile agent that asked again at once waits.
func TestStopRoundsYieldToTheAgentsRefusedBefore(t *testing.T) {
	h := newHarness(t, 0)
	type stand struct {
		url     string
		deletes atomic.Int64
		release chan struct{}
	}
	newStand := func(block bool) *stand {
		s := &stand{release: make(chan struct{})}
		if !block {
			close(s.release)
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodDelete {
				s.deletes.Add(1)
				<-s.release
			}
			w.WriteHeader(http.StatusNoContent)
		}))
		t.Cleanup(srv.Close)
		s.url = srv.URL
		return s
	}
	seq, tokens := map[string]int64{}, map[string]string{}
	heartbeat := func(id string, s *stand) {
		t.Helper()
		seq[id]++
		c := client.New(h.srv.URL, tokens[id])
		err := c.Heartbeat(context.Background(), berth.Heartbeat{AgentID: id, Address: s.url, Status: berth.AgentActive,
			BootID: "boot", Seq: seq[id], MemoryAdmission: berth.AdmissionWorkingSet, MemoryMiBTotal: 1024, MemoryMiBAdmittable: 512,
			Sandboxes: []berth.HeldSandbox{{ID: fmt.Sprintf("sb-unknown-%s-%d", id, seq[id]), Measured: true}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	hostile := make([]*stand, maxStopRounds)
	for i := range hostile {
		id := fmt.Sprintf("h%d", i)
		tokens[id] = joinAs(t, h.srv.URL, id)
		hostile[i] = newStand(true)
		t.Cleanup(func() { close(hostile[i].release) })
		heartbeat(id, hostile[i])
		waitUntil(t, id+"'s round sends its delete", func() (bool, string) { return hostile[i].deletes.Load() == 1, "" })
	}
	honest := newStand(false)
	tokens["honest"] = joinAs(t, h.srv.URL, "honest")
	heartbeat("honest", honest) // every slot taken: refused, remembered
	if honest.deletes.Load() != 0 {
		t.Fatal("a fifth stop round ran beside four")
	}

	hostile[0].release <- struct{}{} // h0's delete answers; its round ends
	waitUntil(t, "h0's round ends", func() (bool, string) { return !h.s.stopRounds.busy("h0"), "" })
	heartbeat("h0", hostile[0]) // asks again at once
	heartbeat("honest", honest)
	waitUntil(t, "the honest agent's delete", func() (bool, string) {
		return honest.deletes.Load() == 1, fmt.Sprintf("%d deletes", honest.deletes.Load())
	})
	if got := hostile[0].deletes.Load(); got != 1 {
		t.Fatalf("h0 was sent %d deletes; want its first only: the freed slot was the honest agent's", got)
	}
}
