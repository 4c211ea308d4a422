package server

import (
	"container/list"
	"sync"
	"time"
)

// agentCalls runs one kind of background call to agents (AGT-6 stop rounds, the sweeper's
// deletes): at most one to each agent at a time and limit in all, in the order they were
// asked for. A call asked for while every slot is taken waits in a queue, one place per
// agent, and starts the moment a slot frees; the place holds one piece of work per key (a
// sandbox's delete, an agent's stop round), run one after another in the agent's slot, and an
// ask for a key already waiting replaces its work. A call asked for while its agent's own
// call runs is dropped, for the caller to ask again later (the next heartbeat, the next
// sweep).
//
// Why a queue: the calls were first refused outright when no slot was free, and agents whose
// calls never answered (each held its slot for AgentTimeout, 30 s) and that asked again the
// moment a call ended took every slot back as it freed — an honest agent heartbeating every
// 10 s got 0 of 24 tries in 6 s (an attack on stop 29). Remembering refused agents and making
// others yield to them (a second version) still let a pool of agent ids, joined once, take
// each freed slot before an honest agent asked again: 40 ids held it off for 5 minutes. In a
// queue every agent waits behind the ones that asked before it, so an honest agent's wait is
// bounded by the agents queued ahead of it (at most limit calls of AgentTimeout at a time),
// not by how often others ask; and no slot idles while anyone waits, so a replica meeting
// 10,000 agents at once still runs their calls back to back. What it does not bound: the join
// token mints agent ids, and each id an attacker joins is one place in the queue.
//
// A queued call whose agent has not asked again for expiry (three heartbeat intervals, 30 s
// by default) before the latest ask of any agent is dropped when its turn comes: its agent
// left, or no longer needs it.
type agentCalls struct {
	mu      sync.Mutex
	limit   int
	expiry  time.Duration
	clock   func() time.Time
	running map[string]bool          // agent id → a call of its runs
	queue   *list.List               // of *agentCall, asked for longest ago first
	queued  map[string]*list.Element // agent id → its place in queue
	// lastAsk is the clock at the latest run: finish, in a call's goroutine, judges expiry by
	// it rather than read the clock off its callers' goroutines.
	lastAsk time.Time
}

// agentCall is a queued call: its agent, its work by key in the order first asked, and when
// its agent last asked. One key's work replaced another's (a later delete of the same agent
// in the same round) until an attack showed a delete asked for each round starving the one
// asked for before it.
type agentCall struct {
	agentID string
	keys    []string
	work    map[string]func()
	asked   time.Time
}

// add puts work under key, in place of a waiting one.
func (q *agentCall) add(key string, work func()) {
	if _, ok := q.work[key]; !ok {
		q.keys = append(q.keys, key)
	}
	q.work[key] = work
}

// run runs the waiting work, in the order first asked.
func (q *agentCall) run() {
	for _, k := range q.keys {
		q.work[k]()
	}
}

// newAgentCalls returns room for limit calls at once (≥ 1); a queued call is dropped when its
// agent has not asked again for expiry.
func newAgentCalls(limit int, expiry time.Duration, clock func() time.Time) *agentCalls {
	return &agentCalls{limit: max(limit, 1), expiry: expiry, clock: clock, running: map[string]bool{},
		queue: list.New(), queued: map[string]*list.Element{}}
}

// run asks for a call of agentID's, key naming what it does. When a slot is free and no other
// agent waits for one, now runs at once in its own goroutine (started true). Otherwise, unless
// agentID's own call runs (the ask is dropped), later — work that holds only what it needs
// while it waits — waits under key in agentID's place in the queue and runs in its goroutine
// when a slot frees (started false).
func (c *agentCalls) run(agentID, key string, now, later func()) (started bool) {
	at := c.clock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastAsk = at
	if c.running[agentID] {
		return false
	}
	if e, ok := c.queued[agentID]; ok {
		call := e.Value.(*agentCall)
		call.add(key, later)
		call.asked = at
		return false
	}
	if c.queue.Len() > 0 || len(c.running) >= c.limit {
		call := &agentCall{agentID: agentID, work: map[string]func(){}, asked: at}
		call.add(key, later)
		c.queued[agentID] = c.queue.PushBack(call)
		return false
	}
	c.startLocked(agentID, now)
	return true
}

// startLocked runs work as agentID's call in a slot; when it returns, the slot goes to the
// queue's next call.
func (c *agentCalls) startLocked(agentID string, work func()) {
	c.running[agentID] = true
	go func() {
		defer c.finish(agentID)
		work()
	}()
}

// finish gives agentID's slot back and starts the queued calls that now have one, dropping
// those whose agents stopped asking.
func (c *agentCalls) finish(agentID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.running, agentID)
	for len(c.running) < c.limit && c.queue.Len() > 0 {
		call := c.queue.Remove(c.queue.Front()).(*agentCall)
		delete(c.queued, call.agentID)
		if c.lastAsk.Sub(call.asked) <= c.expiry {
			c.startLocked(call.agentID, call.run)
		}
	}
}

// busy reports whether a call of agentID's runs or waits (for tests and callers that wait
// for one).
func (c *agentCalls) busy(agentID string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, waits := c.queued[agentID]
	return c.running[agentID] || waits
}
