package main

import (
	"time"

	"github.com/berth-dev/berth"

	"github.com/spf13/pflag"
)

// defaultRetention is --retention's default: terminal sandboxes, their events and ended
// reservations' events are deleted a week after they end (issue 15, point 5).
const defaultRetention = 7 * 24 * time.Hour

// registerRetention adds --retention to f, for `berth server` and `berth dev`.
func registerRetention(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "retention", *d, "delete terminal sandboxes, their events and ended reservations' events this long after they end (0: keep forever)")
}

// checkRetention refuses a negative --retention (invalid_request), before anything starts.
func checkRetention(d time.Duration) error {
	if d < 0 {
		return berth.Errorf(berth.EInvalidRequest, "--retention must be 0 (keep forever) or positive, not %s", d)
	}
	return nil
}

// retentionConfig maps the flag to server.Config.Retention, where a negative value keeps
// everything (0 there means the default); a negative flag is refused by the caller.
func retentionConfig(flag time.Duration) time.Duration {
	if flag == 0 {
		return -1
	}
	return flag
}
