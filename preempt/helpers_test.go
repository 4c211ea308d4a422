package preempt

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"
)

// recorder is a slog.Handler that keeps every record, for asserting what was logged and how
// often.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recorder) WithGroup(string) slog.Handler            { return h }
func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// count counts the records at level whose attributes include every key, value pair in kv.
func (h *recorder) count(level slog.Level, kv ...string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level != level {
			continue
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		match := true
		for i := 0; i+1 < len(kv); i += 2 {
			match = match && attrs[kv[i]] == kv[i+1]
		}
		if match {
			n++
		}
	}
	return n
}

func newLog() (*slog.Logger, *recorder) {
	h := &recorder{}
	return slog.New(h), h
}

// within waits at most d for the next notice.
func within(t *testing.T, ch <-chan Notice, d time.Duration) Notice {
	t.Helper()
	select {
	case n := <-ch:
		return n
	case <-time.After(d):
		t.Fatalf("no notice within %v", d)
		return Notice{}
	}
}

// hangUntilCut returns a handler step that blocks until the client gives up on the request,
// as a metadata endpoint that never answers does (C28), and release, which ends every such
// wait; register release after the server's Close so it runs first. The body is drained
// first: only then does the server notice the client closing the connection.
func hangUntilCut() (hang func(*http.Request), release func()) {
	ch := make(chan struct{})
	return func(r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-ch:
		}
	}, sync.OnceFunc(func() { close(ch) })
}
