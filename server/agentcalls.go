package server

import (
	"container/list"
	"sync"
	"time"
)

// agentCalls bounds one kind of background call to agents (AGT-6 stop rounds, the sweeper's
// deletes): at most one to each agent at a time and limit in all. A call that finds its
// agent's turn or every slot taken is not queued — its caller tries again later (the next
// heartbeat, the next sweep) — but an agent refused for want of a slot is remembered, and an
// agent whose call ended after that refusal yields to it: it takes a slot only when fewer
// such refused agents wait than slots are free. An agent with no call ended since, such as
// one meeting this replica for the first time, takes a free slot at once, so a replica that
// meets 10,000 agents still runs their rounds as fast as slots free.
//
// Without it, agents whose calls never answered (each held its slot for AgentTimeout, 30 s)
// and that asked again the moment a call ended took every slot back as it freed: an honest
// agent heartbeating every 10 s got 0 of 24 tries in 6 s (an attack on stop 29). Now each of
// them has at most one call between an honest agent's refusal and its turn; an attacker who
// mints agent ids with the join token gets one call per id, no more.
//
// A refused agent that has not asked again for expiry (three heartbeat intervals, 30 s by
// default) is forgotten — it left, or no longer needs the call — so no one yields long to an
// agent that will not come back; one that asks after that is refused anew.
type agentCalls struct {
	mu      sync.Mutex
	limit   int
	expiry  time.Duration
	clock   func() time.Time
	seq     uint64                   // orders refusals and ends
	running map[string]bool          // agent id → a call of its runs
	queue   *list.List               // of *agentWaiter, refused longest ago first
	waiting map[string]*list.Element // agent id → its place in queue
	ended   map[string]uint64        // agent id → seq of its last call's end, while any agent waits
}

// agentWaiter is an agent refused for want of a slot: when (seq), and when it last asked.
type agentWaiter struct {
	id    string
	seq   uint64
	asked time.Time
}

// newAgentCalls returns room for limit calls at once (≥ 1); a refused agent is remembered
// for expiry after it last asked.
func newAgentCalls(limit int, expiry time.Duration, clock func() time.Time) *agentCalls {
	return &agentCalls{limit: max(limit, 1), expiry: expiry, clock: clock, running: map[string]bool{},
		queue: list.New(), waiting: map[string]*list.Element{}, ended: map[string]uint64{}}
}

// start takes agentID's turn and a slot, and returns the function that gives both back; ok
// is false, with nothing taken, when agentID's call runs, or when no slot is free for it —
// every slot taken, or the free ones due to agents refused before its last call ended.
func (c *agentCalls) start(agentID string) (done func(), ok bool) {
	now := c.clock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running[agentID] {
		return nil, false
	}
	if !c.slotFor(agentID, now) {
		if e, queued := c.waiting[agentID]; queued {
			e.Value.(*agentWaiter).asked = now
		} else {
			c.seq++
			c.waiting[agentID] = c.queue.PushBack(&agentWaiter{id: agentID, seq: c.seq, asked: now})
		}
		return nil, false
	}
	if e, queued := c.waiting[agentID]; queued {
		c.queue.Remove(e)
		delete(c.waiting, agentID)
	}
	c.running[agentID] = true
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.running, agentID)
		if c.queue.Len() > 0 { // with no one waiting, an end orders nothing
			c.seq++
			c.ended[agentID] = c.seq
		}
	}, true
}

// slotFor reports whether a free slot is agentID's: fewer agents refused before its last call
// ended wait than slots are free. It forgets, on its way down the queue, the waiters that
// stopped asking, and what it knows of ends once no one waits.
func (c *agentCalls) slotFor(agentID string, now time.Time) bool {
	free := c.limit - len(c.running)
	if free <= 0 {
		return false
	}
	ended := c.ended[agentID] // 0: no call of its ended while anyone waited
	ahead := 0
	for e := c.queue.Front(); e != nil && ahead < free; {
		w, next := e.Value.(*agentWaiter), e.Next()
		switch {
		case now.Sub(w.asked) > c.expiry:
			c.queue.Remove(e)
			delete(c.waiting, w.id)
		case w.seq > ended:
			next = nil // refused after agentID's call ended, as is everyone behind
		case w.id != agentID:
			ahead++
		}
		e = next
	}
	if c.queue.Len() == 0 {
		clear(c.ended)
	}
	return ahead < free
}

// busy reports whether a call of agentID's runs (for tests and callers that wait for one).
func (c *agentCalls) busy(agentID string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running[agentID]
}
