package sim

// evKind is what an event does when the virtual clock reaches it.
type evKind uint8

const (
	evArrive    evKind = iota // the workload's next create arrives
	evAttempt                 // id: create; an (SDK re)try or an evacuation recreate
	evChange                  // id: guest; its resident memory changes (workload model)
	evDepart                  // id: guest; its lifetime ends
	evHeartbeat               // id: host; the agent heartbeats (AGT-1)
	evTick                    // id: host; the agent's 1 s measurement while critical or gated (ADM-8, ADM-9)
	evDeath                   // id: host; the host is gone
	evCordon                  // id: host; a cordon reaches every replica's placement (PLC-5)
	evLoss                    // the host-loss process fires
	evExpire                  // id: reservation; its TTL ends (LED-2)
	evSample                  // the report samples density and refusals
)

// event is one entry of the virtual clock. Events at the same instant run in the order
// they were scheduled (seq), so a run never depends on anything but its inputs.
type event struct {
	at   int64 // virtual nanoseconds since the start of the run
	seq  uint64
	kind evKind
	id   int32
}

func (a event) before(b event) bool { return a.at < b.at || (a.at == b.at && a.seq < b.seq) }

// eventHeap is a binary min-heap of events ordered by (at, seq). Typed rather than
// container/heap: a 1,000,000-create run pushes tens of millions of events.
type eventHeap struct {
	ev  []event
	seq uint64
}

func (h *eventHeap) push(at int64, kind evKind, id int32) {
	h.seq++
	h.ev = append(h.ev, event{at: at, seq: h.seq, kind: kind, id: id})
	i := len(h.ev) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.ev[i].before(h.ev[p]) {
			break
		}
		h.ev[i], h.ev[p] = h.ev[p], h.ev[i]
		i = p
	}
}

func (h *eventHeap) len() int { return len(h.ev) }

func (h *eventHeap) top() event { return h.ev[0] }

func (h *eventHeap) pop() event {
	top := h.ev[0]
	n := len(h.ev) - 1
	h.ev[0] = h.ev[n]
	h.ev = h.ev[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.ev[l].before(h.ev[m]) {
			m = l
		}
		if r < n && h.ev[r].before(h.ev[m]) {
			m = r
		}
		if m == i {
			break
		}
		h.ev[i], h.ev[m] = h.ev[m], h.ev[i]
		i = m
	}
	return top
}
