package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// fakeClock is a Clock whose Sleep returns at once, advancing Now by the slept duration and
// recording it. onSleep, when set, runs first and may fail the sleep (or block on ctx).
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	sleeps  []time.Duration
	onSleep func(ctx context.Context, d time.Duration) error
}

func newFakeClock(now time.Time) *fakeClock { return &fakeClock{now: now} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// maxFakeSleeps stops a runaway retry loop (a regression) instead of hanging the test.
const maxFakeSleeps = 1000

var errRunaway = errors.New("fake clock: over 1000 waits, the retry loop does not end")

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if len(c.Sleeps()) >= maxFakeSleeps {
		return errRunaway
	}
	if c.onSleep != nil {
		if err := c.onSleep(ctx, d); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// reply is one scripted answer. hangup closes the connection without answering.
type reply struct {
	status int
	header map[string]string
	body   string
	hangup bool
}

// seen is one request the scripted server received.
type seen struct {
	Method   string
	Path     string // escaped
	RawQuery string
	Header   http.Header
	Body     string
}

// scripted answers requests with its replies in order, repeating the last one forever.
type scripted struct {
	mu      sync.Mutex
	replies []reply
	got     []seen
	first   chan struct{} // closed when the first request arrives
}

// newScripted starts a real HTTP server on 127.0.0.1 that plays replies.
func newScripted(t *testing.T, replies ...reply) (*httptest.Server, *scripted) {
	t.Helper()
	s := &scripted{replies: replies, first: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	return srv, s
}

func (s *scripted) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	i := len(s.got)
	s.got = append(s.got, seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Clone(), string(body)})
	rep := s.replies[min(i, len(s.replies)-1)]
	if i == 0 {
		close(s.first)
	}
	s.mu.Unlock()
	if rep.hangup {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	for k, v := range rep.header {
		if v == "" {
			w.Header()[k] = nil // suppresses the server's own Date header
			continue
		}
		w.Header().Set(k, v)
	}
	w.WriteHeader(rep.status)
	io.WriteString(w, rep.body)
}

func (s *scripted) Seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.got...)
}

// errBody returns a berth.ErrorBody as JSON.
func errBody(code string, retryAfterS int) string {
	b, _ := json.Marshal(berth.ErrorBody{Error: berth.ErrorDetail{
		Code: code, Message: code + " (test)", Retryable: retryAfterS > 0,
		RetryAfterS: retryAfterS, RequestID: "req-1",
	}})
	return string(b)
}

// refusal is a 503 no_capacity with an optional Retry-After header ("" for none).
func refusal(retryAfter string) reply {
	r := reply{status: 503, body: errBody(berth.ENoCapacity, 0)}
	if retryAfter != "" {
		r.header = map[string]string{"Retry-After": retryAfter}
	}
	return r
}

const sandboxJSON = `{"id":"sb-1","template":"python","tenant":"t1","agent_id":"a1","state":"running",` +
	`"memory_mb":512,"vcpus":1,"stateful":false,"created_at":"2030-01-02T03:04:05Z","expires_at":"2030-01-02T04:04:05Z"}`

var sandboxWant = berth.Sandbox{
	ID: "sb-1", Template: "python", Tenant: "t1", AgentID: "a1", State: berth.SandboxRunning,
	MemoryMiB: 512, VCPUs: 1,
	CreatedAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC),
	ExpiresAt: time.Date(2030, 1, 2, 4, 4, 5, 0, time.UTC),
}

// half is a WithRand source that always gives 0.5, so a jittered sleep is exactly half the
// window.
func half() float64 { return 0.5 }
