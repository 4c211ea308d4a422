package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// heldJoins is a real SQLite store whose JoinAgent waits until release is closed, and says
// on entered when a join has reached it: a store slow to answer, held as long as the test
// needs.
type heldJoins struct {
	berth.Store
	entered chan string
	release chan struct{}
}

func (h heldJoins) JoinAgent(ctx context.Context, c berth.AgentCredential) error {
	h.entered <- c.AgentID
	<-h.release
	return h.Store.JoinAgent(ctx, c)
}

// TestJoinsBeyondTheSlotsAreRefusedAtOnce: a replica runs at most Config.MaxJoins joins at
// once; one more waits Config.JoinWait for a slot and is then refused with 503 unavailable
// and a Retry-After, before it reaches the store — so a fleet starting at once cannot queue
// thousands of joins on the store's connections until every one waits out its agent's
// deadline (10,000 bench agents: 2,003 joined in 200 s without the bound, none of them live).
// Once the slot is free, joins go through.
func TestJoinsBeyondTheSlotsAreRefusedAtOnce(t *testing.T) {
	held := heldJoins{entered: make(chan string, 4), release: make(chan struct{})}
	srv := newHarnessOn(t, func(st berth.Store) berth.Store { held.Store = st; return held },
		func(c *Config) { c.MaxJoins, c.JoinWait = 1, 50*time.Millisecond }).srv
	released := false
	t.Cleanup(func() {
		if !released {
			close(held.release)
		}
	})

	first := make(chan int, 1)
	go func() { code, _, _ := postJoin(srv.URL, "a-1"); first <- code }()
	if id := <-held.entered; id != "a-1" {
		t.Fatalf("the store saw a join of %q first, want a-1", id)
	}
	code, h, body := postJoin(srv.URL, "a-2")
	var eb berth.ErrorBody
	_ = json.Unmarshal([]byte(body), &eb)
	if code != http.StatusServiceUnavailable || eb.Error.Code != berth.EUnavailable || h.Get("Retry-After") != "1" ||
		!strings.Contains(eb.Error.Message, "1 agents are joining through this replica at once") {
		t.Fatalf("a join while the one slot is taken: %d Retry-After %q %s; want 503 unavailable, Retry-After 1", code, h.Get("Retry-After"), body)
	}
	select {
	case id := <-held.entered:
		t.Fatalf("the refused join of %s reached the store", id)
	default:
	}
	close(held.release)
	released = true
	if code := <-first; code != http.StatusCreated {
		t.Fatalf("the join that held the slot: %d, want 201", code)
	}
	if code, _, body := postJoin(srv.URL, "a-2"); code != http.StatusCreated {
		t.Fatalf("a-2 joining again with the slot free: %d %s, want 201", code, body)
	}
}
