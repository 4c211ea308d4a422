package preempt

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// AWS polls IMDSv2 (SPOT-1): a session token from PUT /latest/api/token (refreshed on 401),
// then spot/instance-action (404 until a notice with action and time) and the rebalance
// recommendation (an early warning, sent as a Soft notice).
//
// IMDS answers only about the instance that asks, and neither document names an instance, so
// there is no target field to check (C27 concerns Azure, whose events name their VMs).
type AWS struct {
	BaseURL string        // default http://169.254.169.254
	Poll    time.Duration // between rounds; default 5 s
	// Timeout bounds each call — the token PUT and each GET, body included; default
	// DefaultTimeout (2 s). A call that never answers fails after it, and the watcher tries
	// again next round (C28).
	Timeout time.Duration
	Client  *http.Client
	Log     *slog.Logger     // nil: slog.Default()
	Now     func() time.Time // nil: time.Now; anchors fallback deadlines (C29)
}

// awsWindow is the notice AWS documents for a spot interruption: two minutes. A notice whose
// time cannot be read goes at first sight plus this (C29).
const awsWindow = 2 * time.Minute

const (
	awsActionPath    = "/latest/meta-data/spot/instance-action"
	awsRebalancePath = "/latest/meta-data/events/recommendations/rebalance"
)

// awsTimes are the layouts of AWS's time fields: RFC 3339, or the same without a zone, which
// is read as UTC because AWS documents these times in UTC (C29).
var awsTimes = field{provider: "aws", zoned: []string{time.RFC3339Nano},
	zoneless: []string{"2006-01-02T15:04:05", "2006-01-02 15:04:05"}}

// awsRun is one Watch's state: the token and what each endpoint's notices looked like.
type awsRun struct {
	base, token         string
	hc                  *http.Client
	timeout             time.Duration
	log                 *slog.Logger
	now                 func() time.Time
	action, rebalance   memo
	tokenLink           link
	actionLink, rebLink link
}

// Watch implements Watcher.
func (a AWS) Watch(ctx context.Context, out chan<- Notice) error {
	r := &awsRun{
		base:    strings.TrimSuffix(cmp.Or(a.BaseURL, "http://169.254.169.254"), "/"),
		hc:      cmp.Or(a.Client, defaultClient),
		timeout: cmp.Or(max(a.Timeout, 0), DefaultTimeout),
		log:     logOr(a.Log),
		now:     cmpOrNow(a.Now),
	}
	poll := cmp.Or(max(a.Poll, 0), 5*time.Second)
	for {
		for _, n := range r.round(ctx) {
			if !send(ctx, out, n) {
				return ctx.Err()
			}
		}
		if !sleep(ctx, poll) {
			return ctx.Err()
		}
	}
}

// round fetches a token if it has none, then reads both documents once.
func (r *awsRun) round(ctx context.Context) []Notice {
	if r.token == "" {
		rep, err := call(ctx, r.hc, r.timeout, http.MethodPut, r.base+"/latest/api/token", nil, 4096,
			"X-aws-ec2-metadata-token-ttl-seconds", "21600")
		if err == nil && rep.status != http.StatusOK {
			err = &statusError{rep.status}
		}
		if err != nil {
			r.tokenLink.fail(r.log, "aws", "token PUT", err)
			return nil
		}
		r.tokenLink.ok(r.log, "aws", "token PUT")
		if r.token = strings.TrimSpace(string(rep.body)); r.token == "" {
			return nil
		}
	}
	var out []Notice
	if n, ok := r.instanceAction(ctx); ok {
		out = append(out, n)
	}
	if r.token != "" {
		if n, ok := r.rebalanceNotice(ctx); ok {
			out = append(out, n)
		}
	}
	return out
}

// get reads one document: ok with the body on a 200, not ok (after forgetting the endpoint's
// notices) on a 404, not ok on anything else; a 401 drops the token for a new one next round.
func (r *awsRun) get(ctx context.Context, path string, m *memo, l *link) ([]byte, bool) {
	rep, err := call(ctx, r.hc, r.timeout, http.MethodGet, r.base+path, nil, 1<<16, "X-aws-ec2-metadata-token", r.token)
	if err != nil {
		l.fail(r.log, "aws", "GET "+path, err)
		return nil, false
	}
	l.ok(r.log, "aws", "GET "+path)
	switch rep.status {
	case http.StatusOK:
		return rep.body, true
	case http.StatusNotFound:
		m.sweep() // no notice now: a later one is new
	case http.StatusUnauthorized:
		r.token = "" // expired: fetch a new one next round
	}
	return nil, false
}

// instanceAction reads spot/instance-action. A 200 there is a notice whatever its body says:
// an unreadable time gets AWS's two-minute window from first sight, and a body that is no JSON
// object at all is still a terminate notice, its ID built from the raw body (C29).
func (r *awsRun) instanceAction(ctx context.Context) (Notice, bool) {
	body, ok := r.get(ctx, awsActionPath, &r.action, &r.actionLink)
	if !ok {
		return Notice{}, false
	}
	defer r.action.sweep()
	now := r.now()
	var doc struct {
		Action json.RawMessage `json:"action"`
		Time   json.RawMessage `json:"time"`
	}
	n := Notice{Provider: "aws", Kind: KindTerminate}
	f := awsTimes
	f.name = "time"
	if err := json.Unmarshal(body, &doc); err != nil {
		n.ID = "aws-instance-action-" + idPart(string(body))
		f.raw = string(body)
	} else {
		f.raw = rawText(doc.Time)
		n.ID = "aws-" + idPart(rawText(doc.Action)) + "-" + idPart(f.raw)
	}
	f.id = n.ID
	t, first, ok := r.action.read(r.log, now, f)
	n.Deadline = t
	if !ok {
		n.Deadline = first.Add(awsWindow)
	}
	return n, true
}

// rebalanceNotice reads the rebalance recommendation: a 200 is a soft notice (C15) even when
// noticeTime cannot be read (logged once, C29). noticeTime is when AWS raised the warning, not
// a deadline — an interruption may never follow — so the notice carries none.
func (r *awsRun) rebalanceNotice(ctx context.Context) (Notice, bool) {
	body, ok := r.get(ctx, awsRebalancePath, &r.rebalance, &r.rebLink)
	if !ok {
		return Notice{}, false
	}
	defer r.rebalance.sweep()
	var doc struct {
		NoticeTime json.RawMessage `json:"noticeTime"`
	}
	f := awsTimes
	f.name = "noticeTime"
	if err := json.Unmarshal(body, &doc); err != nil {
		f.raw = string(body)
	} else {
		f.raw = rawText(doc.NoticeTime)
	}
	n := Notice{Provider: "aws", Kind: KindRebalance, Soft: true, ID: "aws-rebalance-" + idPart(f.raw)}
	f.id = n.ID
	r.rebalance.read(r.log, r.now(), f)
	return n, true
}
