package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// TestAgentCallsRunInTheOrderAsked: at most limit calls at once and one per agent; a call
// asked for while every slot is taken waits in a queue, in the order asked (asked again, it
// keeps its place), and starts the moment a slot frees; one asked for while its agent's own
// call runs is dropped; a queued call whose agent stopped asking while others asked is
// dropped at its turn.
func TestAgentCallsRunInTheOrderAsked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := &fakeClock{now: time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)}
		c := newAgentCalls(2, 30*time.Second, clock.Now)
		var mu sync.Mutex // the calls run in c's goroutines
		var order []string
		release := map[string]chan struct{}{}
		call := func(label string, release <-chan struct{}) func() {
			return func() {
				mu.Lock()
				order = append(order, label)
				mu.Unlock()
				<-release
			}
		}
		ask := func(id string) bool {
			if release[id] == nil {
				release[id] = make(chan struct{})
			}
			started := c.run(id, "call", call(id, release[id]), call(id+" (queued)", release[id]))
			synctest.Wait()
			return started
		}
		end := func(id string) {
			close(release[id])
			delete(release, id)
			synctest.Wait()
		}
		ran := func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(order)
		}
		if !ask("h1") || !ask("h2") {
			t.Fatal("a free slot was refused")
		}
		if ask("h1") { // its own call runs: dropped
			t.Fatal("a second call of one agent started")
		}
		for _, id := range []string{"honest", "late", "honest"} { // asked again: keeps its place
			if ask(id) {
				t.Fatalf("%s started with every slot taken", id)
			}
		}
		end("h1")
		if ask("h1") { // asks again at once: behind the others
			t.Fatal("h1 took the slot it freed")
		}
		end("h2")
		end("honest")
		end("late")
		want := []string{"h1", "h2", "honest (queued)", "late (queued)", "h1 (queued)"}
		if got := ran(); !slices.Equal(got, want) {
			t.Fatalf("calls ran in the order %q, want %q", got, want)
		}
		if !ask("x") || ask("y") { // one slot free (h1's queued call runs), then none
			t.Fatal("x or y: want x started, y queued")
		}
		clock.Add(31 * time.Second) // y did not ask again; z does
		if ask("z") {
			t.Fatal("z started with every slot taken")
		}
		end("x") // y's turn: silent past the expiry, dropped; z's call runs
		end("h1")
		end("z")
		want = append(want, "x", "z (queued)")
		if got := ran(); c.busy("y") || !slices.Equal(got, want) {
			t.Fatalf("calls ran in the order %q, want %q (y, silent past the expiry, dropped)", got, want)
		}
	})
}

// TestAgentCallsHungAgentsHoldNoOneOff (an attack on stop 29): agents whose calls never
// answer (each holds its slot for AgentTimeout, 30 s) and that ask again the moment their
// call ends — hung hosts, or an attacker's — used to take every slot back as it freed, and an
// honest agent asking at each 10 s heartbeat got none (0 of 24 tries in 6 s). In the queue
// its call runs once the calls asked for before it have had their turn — the hung agents
// queued ahead of it, limit at a time: here 4 running and 4 queued, so within two of their
// 30 s rounds — however often they ask.
func TestAgentCallsHungAgentsHoldNoOneOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			limit    = 4
			hung     = 8
			interval = 10 * time.Second
			timeout  = 30 * time.Second
			tick     = time.Second
		)
		clock := &fakeClock{now: time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)}
		c := newAgentCalls(limit, 3*interval, clock.Now)
		var mu sync.Mutex              // the calls run in c's goroutines
		ends := map[string]time.Time{} // a running hung call → when it times out
		release := map[string]chan struct{}{}
		hungCall := func(id string, release <-chan struct{}) func() {
			return func() {
				mu.Lock()
				ends[id] = clock.Now().Add(timeout)
				mu.Unlock()
				<-release
			}
		}
		var asked time.Time // the honest agent's first ask since its last round ran
		var worst time.Duration
		ran := 0
		honestCall := func() {
			mu.Lock()
			defer mu.Unlock()
			worst = max(worst, clock.Now().Sub(asked))
			asked = time.Time{}
			ran++
		}
		for step := range int(10 * time.Minute / tick) {
			mu.Lock()
			for id, end := range ends {
				if !clock.Now().Before(end) {
					delete(ends, id)
					close(release[id])
					delete(release, id)
				}
			}
			mu.Unlock()
			synctest.Wait()
			mu.Lock()
			for i := range hung { // every hung agent asks again at once, every tick
				id := fmt.Sprintf("hung-%d", i)
				if release[id] == nil {
					release[id] = make(chan struct{})
				}
				ch := release[id]
				mu.Unlock()
				c.run(id, "call", hungCall(id, ch), hungCall(id, ch))
				mu.Lock()
			}
			honest := step%int(interval/tick) == 5 // its heartbeat, off the others' phase
			if honest && asked.IsZero() {
				asked = clock.Now()
			}
			mu.Unlock()
			if honest {
				c.run("honest", "call", honestCall, honestCall)
			}
			synctest.Wait()
			clock.Add(tick)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, ch := range release {
			close(ch)
		}
		if bound := hung / limit * timeout; ran < 8 || worst > bound {
			t.Fatalf("the honest agent's call ran %d times in 60 heartbeats and waited up to %s beside %d hung agents (want within %s)",
				ran, worst, hung, bound)
		}
	})
}

// TestStopRoundsRunInTheOrderAsked (attacks on stop 29 and on this change): agents whose
// deletes never answer, heartbeating again the moment their round ends, took every stop-round
// slot back as it freed, and an honest agent's stop round never ran (0 of 24 tries in 6 s);
// a fresh agent id, joined with the join token, took a freed slot just as well. Now the
// honest agent's round waits in the queue and runs, as a sweep of what the store says it
// holds, in the first slot that frees; the fresh id that asked after it waits for the next.
func TestStopRoundsRunInTheOrderAsked(t *testing.T) {
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
				select {
				case <-s.release:
				case <-r.Context().Done():
				}
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
	hostile := make([]*stand, maxStopRounds+1)
	for i := range hostile {
		id := fmt.Sprintf("h%d", i)
		tokens[id] = joinAs(t, h.srv.URL, id)
		hostile[i] = newStand(true)
		t.Cleanup(func() { close(hostile[i].release) })
	}
	for i := range maxStopRounds {
		id := fmt.Sprintf("h%d", i)
		heartbeat(id, hostile[i])
		waitUntil(t, id+"'s round sends its delete", func() (bool, string) { return hostile[i].deletes.Load() == 1, "" })
	}
	honest := newStand(true)
	t.Cleanup(func() { close(honest.release) })
	tokens["honest"] = joinAs(t, h.srv.URL, "honest")
	heartbeat("honest", honest) // every slot taken: queued
	fresh := fmt.Sprintf("h%d", maxStopRounds)
	heartbeat(fresh, hostile[maxStopRounds]) // a fresh id, after the honest agent: queued behind it
	heartbeat("h0", hostile[0])              // its own round runs: dropped
	if !h.s.stopRounds.busy("honest") || honest.deletes.Load() != 0 {
		t.Fatal("a fifth stop round ran beside four")
	}

	hostile[0].release <- struct{}{} // h0's delete answers (its agent timeout, in real life); its round ends
	waitUntil(t, "the honest agent's round, in the freed slot", func() (bool, string) {
		return honest.deletes.Load() == 1, fmt.Sprintf("%d deletes", honest.deletes.Load())
	})
	if got := hostile[maxStopRounds].deletes.Load(); got != 0 {
		t.Fatalf("%s, which asked after the honest agent, was sent %d deletes while the honest round held the only free slot", fresh, got)
	}
	honest.release <- struct{}{}
	waitUntil(t, fresh+"'s round, next", func() (bool, string) { return hostile[maxStopRounds].deletes.Load() == 1, "" })
	if got := hostile[0].deletes.Load(); got != 1 {
		t.Fatalf("h0 was sent %d deletes; want its first only (its second heartbeat came while its round ran)", got)
	}
}
