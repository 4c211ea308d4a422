package preempt

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode"
)

// Azure polls Scheduled Events (SPOT-1); Preempt and Terminate are interruptions. The same
// event comes back on every poll until it happens: its EventId is the Notice.ID, so the agent
// acts once (C13). Ack tells Azure the host is ready (StartRequests).
//
// Scheduled Events reach every VM of a scale set, and each event's Resources lists the VMs it
// applies to (C27). This VM's name comes from instance metadata (compute/name); an event
// applies here when its Resources is empty or lists that name (case-insensitively, as Azure
// names are). An event for another VM is never sent, so the agent never acks it (an ack lets
// Azure start that VM's eviction early). Until the name can be read — the watcher retries
// every poll — an event with non-empty Resources cannot be attributed: it is logged at error
// level once per event and not acted on; events with empty Resources still are.
type Azure struct {
	BaseURL string        // default http://169.254.169.254
	Poll    time.Duration // between polls; default 1 s
	// Timeout bounds each call — the events GET, the name GET and Ack's calls, body
	// included; default DefaultTimeout (2 s). A call that never answers fails after it and
	// the watcher polls again (C28).
	Timeout time.Duration
	Client  *http.Client
	Log     *slog.Logger     // nil: slog.Default()
	Now     func() time.Time // nil: time.Now; anchors fallback deadlines (C29)
}

// Errors from Ack and event attribution (C27).
var (
	ErrNotThisVM     = errors.New("preempt: the event's Resources do not list this VM")
	ErrVMNameUnknown = errors.New("preempt: this VM's name cannot be read, so an event naming VMs cannot be attributed")
	ErrNoSuchEvent   = errors.New("preempt: no such scheduled event")
)

const (
	azurePath     = "/metadata/scheduledevents?api-version=2020-07-01"
	azureNamePath = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
)

// azureWindows are the minimum notices Azure documents per event type: Preempt 30 s,
// Terminate 5 min (configurable 5–15). An event whose NotBefore cannot be read — including
// an empty one, which Azure documents for an event that may start at any moment — goes at
// first sight plus this (C29).
var azureWindows = map[string]struct {
	kind   string
	window time.Duration
}{"Preempt": {KindPreempt, 30 * time.Second}, "Terminate": {KindTerminate, 5 * time.Minute}}

// azureTimes: NotBefore is RFC 1123 in GMT ("Mon, 30 Nov 2026 10:00:30 GMT"); without a zone
// it is read as UTC, the zone Azure documents, and logged (C29).
var azureTimes = field{provider: "azure", zoned: []string{time.RFC1123, time.RFC1123Z, time.RFC3339Nano},
	zoneless: []string{"Mon, 02 Jan 2006 15:04:05", "2006-01-02T15:04:05"}}

// azureEvent is the part of a scheduled event Berth reads.
type azureEvent struct {
	EventID   string          `json:"EventId"`
	EventType string          `json:"EventType"`
	Resources []string        `json:"Resources"`
	NotBefore json.RawMessage `json:"NotBefore"`
}

type azureConf struct {
	base    string
	hc      *http.Client
	timeout time.Duration
	log     *slog.Logger
	now     func() time.Time
}

func (z Azure) conf() azureConf {
	return azureConf{
		base:    strings.TrimSuffix(cmp.Or(z.BaseURL, "http://169.254.169.254"), "/"),
		hc:      cmp.Or(z.Client, defaultClient),
		timeout: cmp.Or(max(z.Timeout, 0), DefaultTimeout),
		log:     logOr(z.Log),
		now:     cmpOrNow(z.Now),
	}
}

// Watch implements Watcher.
func (z Azure) Watch(ctx context.Context, out chan<- Notice) error {
	c := z.conf()
	poll := cmp.Or(max(z.Poll, 0), time.Second)
	var seen memo
	var nameLink, eventsLink link
	name := ""
	for {
		if name == "" {
			var err error
			if name, err = c.vmName(ctx); err != nil {
				nameLink.fail(c.log, "azure", "GET compute/name", err)
			} else {
				nameLink.ok(c.log, "azure", "GET compute/name")
			}
		}
		events, err := c.events(ctx)
		if err != nil {
			eventsLink.fail(c.log, "azure", "GET scheduledevents", err)
		} else {
			eventsLink.ok(c.log, "azure", "GET scheduledevents")
			for _, raw := range events {
				if n, ok := c.notice(raw, name, &seen); ok && !send(ctx, out, n) {
					return ctx.Err()
				}
			}
			seen.sweep()
		}
		if !sleep(ctx, poll) {
			return ctx.Err()
		}
	}
}

// notice turns one event into a Notice when it is an interruption for this VM. Anything it
// skips for a reason worth knowing is logged once per event (C27, C29).
func (c azureConf) notice(raw json.RawMessage, name string, seen *memo) (Notice, bool) {
	now := c.now()
	var e azureEvent
	if err := json.Unmarshal(raw, &e); err != nil {
		if _, isNew := seen.see("undecodable "+idPart(string(raw)), now); isNew {
			c.log.Error("scheduled event unreadable; not acted on", "provider", "azure", "event", string(raw), "err", err)
		}
		return Notice{}, false
	}
	w, ok := azureWindows[e.EventType]
	if !ok {
		return Notice{}, false // Freeze, Reboot, Redeploy: no interruption
	}
	f := azureTimes
	f.name, f.raw = "NotBefore", rawText(e.NotBefore)
	n := Notice{Provider: "azure", Kind: w.kind, ID: e.EventID}
	if n.ID == "" { // documented as always present; keep the notice, with an ID stable per event
		n.ID = "azure-" + e.EventType + "-" + idPart(f.raw)
	}
	f.id = n.ID
	if err := applies(e.Resources, name); err != nil {
		if _, isNew := seen.see("skip "+n.ID+" "+err.Error(), now); isNew {
			level := slog.LevelInfo // another VM's event: expected on every scale-set member
			if errors.Is(err, ErrVMNameUnknown) {
				level = slog.LevelError // possibly ours, and the host is not cordoned for it
			}
			c.log.Log(context.Background(), level, "scheduled event not acted on (C27)", "provider", "azure",
				"id", n.ID, "type", e.EventType, "resources", e.Resources, "vm", name, "reason", err)
		}
		return Notice{}, false
	}
	t, first, ok := seen.read(c.log, now, f)
	n.Deadline = t
	if !ok {
		n.Deadline = first.Add(w.window)
	}
	return n, true
}

// applies reports nil when an event with these Resources applies to the VM called name:
// Resources is empty (the event is for every VM that sees it) or lists name. Otherwise it
// returns ErrNotThisVM, or ErrVMNameUnknown while name is "".
func applies(resources []string, name string) error {
	if len(resources) == 0 {
		return nil
	}
	if name == "" {
		return ErrVMNameUnknown
	}
	for _, r := range resources {
		if strings.EqualFold(strings.TrimSpace(r), name) {
			return nil
		}
	}
	return ErrNotThisVM
}

// vmName reads this VM's name from instance metadata; the documented answer is the bare name.
// An answer that is not one token (an error page, a JSON document) is refused, not taken for
// a name that would match nothing.
func (c azureConf) vmName(ctx context.Context) (string, error) {
	rep, err := call(ctx, c.hc, c.timeout, http.MethodGet, c.base+azureNamePath, nil, 1024, "Metadata", "true")
	if err == nil && rep.status != http.StatusOK {
		err = &statusError{rep.status}
	}
	if err != nil {
		return "", fmt.Errorf("azure: read this VM's name: %w", err)
	}
	name := strings.TrimSpace(string(rep.body))
	if name == "" || len(name) > 128 || strings.ContainsFunc(name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return "", fmt.Errorf("azure: read this VM's name: not a bare name: %.40q", name)
	}
	return name, nil
}

// events reads the Scheduled Events document; each event stays raw so one malformed event
// does not hide the others.
func (c azureConf) events(ctx context.Context) ([]json.RawMessage, error) {
	rep, err := call(ctx, c.hc, c.timeout, http.MethodGet, c.base+azurePath, nil, 1<<20, "Metadata", "true")
	if err == nil && rep.status != http.StatusOK {
		err = &statusError{rep.status}
	}
	if err != nil {
		return nil, fmt.Errorf("azure: read scheduled events: %w", err)
	}
	var doc struct {
		Events []json.RawMessage `json:"Events"`
	}
	if err := json.Unmarshal(rep.body, &doc); err != nil {
		return nil, fmt.Errorf("azure: read scheduled events: %w", err)
	}
	return doc.Events, nil
}

// Ack acknowledges an event so Azure may start it (StartRequests), after evacuation. It
// re-reads the document first and refuses, without posting, an event that is gone
// (ErrNoSuchEvent) or not attributable to this VM (ErrNotThisVM, ErrVMNameUnknown): acking a
// sibling's event would start its eviction early (C27). Each call has the watcher's Timeout.
func (z Azure) Ack(ctx context.Context, eventID string) error {
	c := z.conf()
	events, err := c.events(ctx)
	if err != nil {
		return fmt.Errorf("azure: ack %s: %w", eventID, err)
	}
	var ev *azureEvent
	for _, raw := range events {
		var e azureEvent
		if json.Unmarshal(raw, &e) == nil && e.EventID == eventID {
			ev = &e
			break
		}
	}
	if ev == nil {
		return fmt.Errorf("azure: ack %s: %w", eventID, ErrNoSuchEvent)
	}
	name := ""
	if len(ev.Resources) > 0 {
		if name, err = c.vmName(ctx); err != nil {
			return fmt.Errorf("azure: ack %s: %w: %w", eventID, ErrVMNameUnknown, err)
		}
	}
	if err := applies(ev.Resources, name); err != nil {
		return fmt.Errorf("azure: ack %s (resources %v, this VM %s): %w", eventID, ev.Resources, name, err)
	}
	body, _ := json.Marshal(map[string]any{"StartRequests": []map[string]string{{"EventId": eventID}}})
	rep, err := call(ctx, c.hc, c.timeout, http.MethodPost, c.base+azurePath, body, 4096,
		"Metadata", "true", "Content-Type", "application/json")
	if err == nil && rep.status/100 != 2 {
		err = &statusError{rep.status}
	}
	if err != nil {
		return fmt.Errorf("azure: ack %s: %w", eventID, err)
	}
	return nil
}
