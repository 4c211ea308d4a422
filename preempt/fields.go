package preempt

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// DefaultTimeout bounds each metadata call of the AWS and Azure watchers (token PUT, GETs,
// Azure's Ack POST), and is the slack GCP's client allows past its server-side wait (C28).
// A link-local metadata service answers in milliseconds; two seconds only cuts off a call
// that will never answer, such as an IMDSv2 token PUT whose reply a hop limit of 1 drops.
const DefaultTimeout = 2 * time.Second

// reply is one metadata answer: its status, header and (bounded) body.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// call makes one metadata request under a deadline of timeout, and reads at most limit bytes
// of the body inside the same deadline, so a server that sends headers and then stalls is cut
// off too (C28). hdr holds header name/value pairs; body nil sends none. Any status is a
// reply; err (wrapping context.DeadlineExceeded when the deadline passed) means none came.
func call(ctx context.Context, hc *http.Client, timeout time.Duration, method, url string, body []byte, limit int64, hdr ...string) (reply, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return reply{}, fmt.Errorf("preempt: %s %s: %w", method, url, err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("preempt: %w", err) // *url.Error names method and URL
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return reply{}, fmt.Errorf("preempt: %s %s: read body: %w", method, url, err)
	}
	return reply{resp.StatusCode, resp.Header, b}, nil
}

// statusError is a metadata reply with a status the caller cannot use.
type statusError struct{ status int }

func (e *statusError) Error() string { return fmt.Sprintf("metadata answered status %d", e.status) }

// link tracks whether a metadata endpoint answers, so a run of failures is logged once when
// it starts and once when it ends rather than on every poll (C28).
type link struct{ failing bool }

func (l *link) fail(log *slog.Logger, provider, what string, err error) {
	if !l.failing {
		log.Warn("preemption watcher: metadata call failed; retrying every poll (C28)",
			"provider", provider, "call", what, "err", err)
	}
	l.failing = true
}

func (l *link) ok(log *slog.Logger, provider, what string) {
	if l.failing {
		log.Info("preemption watcher: metadata call answers again", "provider", provider, "call", what)
	}
	l.failing = false
}

// memo remembers, per key, when something was first seen: the first sighting of a notice
// whose deadline cannot be read anchors its fallback deadline, and the log line about it is
// written once, however often the cloud repeats the notice (C29). Keys not seen again by the
// next sweep are forgotten.
type memo struct {
	first map[string]time.Time
	live  map[string]bool
}

// see records key and reports when it was first seen and whether that is now.
func (m *memo) see(key string, now time.Time) (first time.Time, isNew bool) {
	if m.first == nil {
		m.first, m.live = map[string]time.Time{}, map[string]bool{}
	}
	m.live[key] = true
	if t, ok := m.first[key]; ok {
		return t, false
	}
	m.first[key] = now
	return now, true
}

// sweep forgets keys not seen since the last sweep. Call it only after a round that read the
// provider's whole answer: a timed-out call is not the end of a notice.
func (m *memo) sweep() {
	for k := range m.first {
		if !m.live[k] {
			delete(m.first, k)
		}
	}
	clear(m.live)
}

// field is one time field of a notice document, as the provider sent it.
type field struct {
	provider, id, name, raw string
	zoned, zoneless         []string // layouts; zoneless ones are read as UTC
}

// read parses f. A time with a zone is taken as is. A time without one is read as UTC (the
// caller's provider documents UTC) and logged once. An empty, malformed or zero time cannot be
// read: ok is false, first is when this notice's field was first seen (the anchor for the
// provider's minimum window), and the raw text is logged once per notice ID (C29).
func (m *memo) read(log *slog.Logger, now time.Time, f field) (t, first time.Time, ok bool) {
	raw := strings.TrimSpace(f.raw)
	for _, layout := range f.zoned {
		if t, err := time.Parse(layout, raw); err == nil && !t.IsZero() {
			return t, time.Time{}, true
		}
	}
	for _, layout := range f.zoneless {
		if t, err := time.ParseInLocation(layout, raw, time.UTC); err == nil && !t.IsZero() {
			if _, isNew := m.see("utc "+f.id+" "+f.name, now); isNew {
				log.Warn("preemption notice: time has no zone; taken as UTC as the provider documents (C29)",
					"provider", f.provider, "id", f.id, "field", f.name, "raw", f.raw, "utc", t)
			}
			return t, time.Time{}, true
		}
	}
	first, isNew := m.see("bad "+f.id+" "+f.name, now)
	if isNew {
		log.Warn("preemption notice: time field unreadable; acting on the provider's minimum window (C29)",
			"provider", f.provider, "id", f.id, "field", f.name, "raw", f.raw)
	}
	return time.Time{}, first, false
}

// rawText is a JSON value as text: a string's contents, "" for null or absent, else the JSON
// itself (a number, say), so an unexpected shape still yields stable text for IDs and logs.
func rawText(v json.RawMessage) string {
	var s string
	if len(v) == 0 || json.Unmarshal(v, &s) == nil {
		return s
	}
	return string(v)
}

// idPart is raw as it may go into a Notice.ID: the text itself when short and printable, else
// a hash of it. Either way the same raw text gives the same ID on every poll (C13, C29).
func idPart(raw string) string {
	if len(raw) <= 64 && !strings.ContainsFunc(raw, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
		return raw
	}
	sum := sha256.Sum256([]byte(raw))
	return "sha256-" + hex.EncodeToString(sum[:8])
}

func logOr(l *slog.Logger) *slog.Logger { return cmp.Or(l, slog.Default()) }
