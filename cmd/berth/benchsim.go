package main

// Simulated agents for `berth bench fleet --sim-agents N` (issue 16, goal 2): each joins with
// the node token and heartbeats every interval at its own phase, as an agent on a host of
// its own would — its first heartbeat the whole held list, then deltas against what the
// server acknowledged, one held sandbox's working set changing each time; its sandboxes are
// running rows in the store — but runs nothing and takes no placements (intake closed,
// nothing admittable), so thousands fit in one process beside the real no-op agents the
// creates go to.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/server"
)

// simAgentHeld is how many sandboxes each simulated agent holds.
const simAgentHeld = 10

// simJoiners bounds the simulated agents' concurrent joins.
const simJoiners = 128

// simStats is what the simulated agents saw.
type simStats struct {
	Sent, Acked, Resyncs, Failed atomic.Int64
	mu                           sync.Mutex
	maxGap                       []time.Duration // per agent: the longest time between two acks
}

// simConnsPerReplica bounds the simulated agents' connections to each replica.
const simConnsPerReplica = 1024

// simTenant owns the simulated agents' sandboxes (seedSimSandboxes).
const simTenant = "bench-sim"

// simHeldID names simulated agent i's k-th held sandbox.
func simHeldID(i, k int) string { return fmt.Sprintf("%s-sb-%d", simAgentID(i), k) }

// simAgentID names simulated agent i (from 0).
func simAgentID(i int) string { return fmt.Sprintf("bench-sim-%05d", i+1) }

// seedSimSandboxes records, as running on their agents, the sandboxes the n simulated agents
// will hold, as a real fleet's store would: without them, every delta's AGT-6 check found its
// sandbox unknown (ended) and tried to stop it on an address that is not there, a cost no
// real fleet pays. 16 writers; the rows expire in a day.
func seedSimSandboxes(ctx context.Context, st berth.Store, n int) error {
	now := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			for k := range simAgentHeld {
				sb := berth.Sandbox{ID: simHeldID(i, k), Template: "shell", Tenant: simTenant, AgentID: simAgentID(i),
					State: berth.SandboxRunning, MemoryMiB: 64, VCPUs: 1, CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour)}
				if err := st.CreateSandbox(gctx, sb, "bench", now); err != nil {
					return fmt.Errorf("seed the simulated agents' sandboxes: %w", err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// runSimAgents runs n simulated agents against urls until ctx ends; ready is closed once every
// one has joined and sent its first heartbeat (or ctx ended).
func runSimAgents(ctx context.Context, urls []string, nodeToken string, n int, interval time.Duration, st *simStats, ready chan<- struct{}) {
	// The simulated agents share connections, at most simConnsPerReplica to each replica: one
	// process cannot hold 10,000 agents' connections on both ends (two descriptors each, and
	// 20,000 is a common hard limit). A heartbeat that finds them all busy waits in this
	// client for one, so a starved run shows as late acks, not as failures of the replica.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxConnsPerHost: simConnsPerReplica, MaxIdleConnsPerHost: simConnsPerReplica, IdleConnTimeout: time.Minute}}
	st.maxGap = make([]time.Duration, n)
	var joined sync.WaitGroup
	joined.Add(n)
	// Joins go at most simJoiners at a time: 10,000 at once open a connection each on both
	// ends and exhaust this process's file descriptors (the replicas share it).
	joinSlots := make(chan struct{}, simJoiners)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { simAgent(ctx, hc, urls[i%len(urls)], nodeToken, i, n, interval, st, &joined, joinSlots) })
	}
	go func() { joined.Wait(); close(ready) }()
	wg.Wait()
}

func simAgent(ctx context.Context, hc *http.Client, url, nodeToken string, i, n int, interval time.Duration, st *simStats, joined *sync.WaitGroup, joinSlots chan struct{}) {
	once := sync.OnceFunc(joined.Done)
	defer once()
	id := simAgentID(i)
	opts := []client.Option{client.WithHTTPClient(hc), client.WithDeadline(time.Nanosecond)}
	select {
	case joinSlots <- struct{}{}:
	case <-ctx.Done():
		return
	}
	secret, err := client.New(url, nodeToken, opts...).JoinAgent(ctx, id)
	<-joinSlots
	if err != nil {
		st.Failed.Add(1)
		return
	}
	c := client.New(url, secret, opts...)
	held := make([]berth.HeldSandbox, simAgentHeld)
	for k := range held {
		held[k] = berth.HeldSandbox{ID: simHeldID(i, k), ResidentMiB: 64, Measured: true}
	}
	hb := berth.Heartbeat{AgentID: id, Address: "http://127.0.0.1:1", Status: berth.AgentActive, BootID: server.NewKeySecret()[:16],
		MemoryAdmission: berth.AdmissionWorkingSet, MemoryMiBTotal: 65536, CPUTotal: 8}
	var acked int64
	last := time.Now()
	// Each agent's heartbeats are due at its own phase of the interval, whatever the answers.
	next := time.Now().Add(time.Duration(int64(interval) * int64(i) / int64(n)))
	for seq := int64(1); ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		next = next.Add(interval)
		hb.Seq, hb.HeartbeatAt = seq, time.Now()
		hb.Delta, hb.BaseSeq, hb.Sandboxes = false, 0, held
		if acked > 0 {
			k := int(seq) % len(held)
			held[k].ResidentMiB = 64 + 32*(seq%2) // one sandbox's working set moves past the threshold
			hb.Delta, hb.BaseSeq, hb.Sandboxes = true, acked, held[k:k+1]
		}
		st.Sent.Add(1)
		ack, err := c.HeartbeatAck(ctx, hb)
		switch {
		case err != nil:
			st.Failed.Add(1)
			acked = 0
		case ack.Resync:
			st.Resyncs.Add(1)
			acked = 0
		default:
			st.Acked.Add(1)
			acked = ack.Seq
			now := time.Now()
			if gap := now.Sub(last); seq > 1 && gap > st.gap(i) {
				st.setGap(i, gap)
			}
			last = now
			once()
		}
	}
}

func (s *simStats) gap(i int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxGap[i]
}

func (s *simStats) setGap(i int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxGap[i] = d
}

// staleAgents counts the simulated agents that went longer than limit between two acks.
func (s *simStats) staleAgents(limit time.Duration) (int, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, g := range s.maxGap {
		if g > limit {
			n++
		}
	}
	return n, slices.Max(append([]time.Duration{0}, s.maxGap...))
}
