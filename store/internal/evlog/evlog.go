// Package evlog lets a store hand the events a transaction wrote to a logger after the
// commit, never before (LIF-3: every event is also logged as structured JSON; a rolled-back
// transaction logs nothing). The shared SQL store (store/internal/sqlstore) uses it; events
// are collected per transaction, keyed by the transaction value itself.
package evlog

import (
	"sync"
	"sync/atomic"

	"github.com/berth-dev/berth"
)

// open maps a transaction in progress to the events it wrote so far.
var open sync.Map // tx → *[]berth.Event

// Hook holds the function events go to; the zero value logs nothing.
type Hook struct {
	fn atomic.Pointer[func(berth.Event)]
}

// Set replaces the function (nil stops logging).
func (h *Hook) Set(fn func(berth.Event)) {
	if fn == nil {
		h.fn.Store(nil)
		return
	}
	h.fn.Store(&fn)
}

// Begin starts collecting the events of transaction tx. Call done(true) after a commit (the
// events go to the hook) or done(false) after a rollback; either way tx is forgotten.
func (h *Hook) Begin(tx any) (done func(committed bool)) {
	if h.fn.Load() == nil {
		return func(bool) {}
	}
	events := &[]berth.Event{}
	open.Store(tx, events)
	return func(committed bool) {
		open.Delete(tx)
		if committed {
			h.Committed(*events...)
		}
	}
}

// Committed hands evs, written by a statement that committed on its own (no transaction of
// the store's), to the hook.
func (h *Hook) Committed(evs ...berth.Event) {
	if fn := h.fn.Load(); fn != nil {
		for _, e := range evs {
			(*fn)(e)
		}
	}
}

// Add records e as written by transaction tx, if its events are being collected.
func Add(tx any, e berth.Event) {
	if v, ok := open.Load(tx); ok {
		events := v.(*[]berth.Event)
		*events = append(*events, e)
	}
}
