package preempt

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
)

// AWS polls IMDSv2 (SPOT-1): a session token from PUT /latest/api/token (refreshed on 401),
// then spot/instance-action (404 until a notice with action and time) and the rebalance
// recommendation (an early warning, sent as a Soft notice). BaseURL defaults to
// http://169.254.169.254; Poll to 5 s.
type AWS struct {
	BaseURL string
	Poll    time.Duration
	Client  *http.Client
}

// Watch implements Watcher.
func (a AWS) Watch(ctx context.Context, out chan<- Notice) error {
	base := strings.TrimSuffix(cmp.Or(a.BaseURL, "http://169.254.169.254"), "/")
	hc := cmp.Or(a.Client, defaultClient)
	poll := cmp.Or(max(a.Poll, 0), 5*time.Second)
	token := ""
	for {
		if token == "" {
			token = a.token(ctx, hc, base)
		}
		if token != "" {
			var action struct {
				Action string    `json:"action"`
				Time   time.Time `json:"time"`
			}
			switch a.get(ctx, hc, base+"/latest/meta-data/spot/instance-action", token, &action) {
			case http.StatusOK:
				if action.Action != "" && !send(ctx, out, Notice{Provider: "aws", Kind: KindTerminate,
					ID: "aws-" + action.Action + "-" + action.Time.UTC().Format(time.RFC3339), Deadline: action.Time}) {
					return ctx.Err()
				}
			case http.StatusUnauthorized:
				token = "" // expired: fetch a new one next round
			}
			var rebalance struct {
				NoticeTime time.Time `json:"noticeTime"`
			}
			if a.get(ctx, hc, base+"/latest/meta-data/events/recommendations/rebalance", token, &rebalance) == http.StatusOK &&
				!rebalance.NoticeTime.IsZero() {
				if !send(ctx, out, Notice{Provider: "aws", Kind: KindRebalance, Soft: true,
					ID: "aws-rebalance-" + rebalance.NoticeTime.UTC().Format(time.RFC3339)}) {
					return ctx.Err()
				}
			}
		}
		if !sleep(ctx, poll) {
			return ctx.Err()
		}
	}
}

func (a AWS) token(ctx context.Context, hc *http.Client, base string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/latest/api/token", nil)
	if err != nil {
		return ""
	}
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "21600")
	resp, err := hc.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// get fetches u with the token and decodes a 200 into v; it returns the status (0 on error).
func (a AWS) get(ctx context.Context, hc *http.Client, u, token string, v any) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0
	}
	req.Header.Set("X-aws-ec2-metadata-token", token)
	resp, err := hc.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(v); err != nil {
			return 0
		}
	}
	return resp.StatusCode
}
