package berth

import (
	"errors"
	"math"
	"testing"
)

// TestQuotaCheck pins ADM-11's arithmetic at its edges: the last sandbox and MiB that fit, one
// more that does not, no limit at 0, and a request so large that adding it to the usage would
// overflow int64 (it used to wrap negative and be admitted).
func TestQuotaCheck(t *testing.T) {
	q := Quota{Tenant: "acme", MaxSandboxes: 2, MaxMemoryMiB: 1000}
	for _, tt := range []struct {
		count       int
		mem, add    int64
		q           Quota
		wantAllowed bool
	}{
		{1, 0, 1000, q, true},
		{2, 0, 1, q, false},
		{1, 999, 1, q, true},
		{1, 999, 2, q, false},
		{1, 1, math.MaxInt64, q, false},
		{0, 0, math.MaxInt64, Quota{Tenant: "acme"}, true},
		{100, math.MaxInt64 - 1, math.MaxInt64, Quota{Tenant: "acme", MaxSandboxes: 1000}, true},
	} {
		err := tt.q.Check(tt.count, tt.mem, tt.add)
		if got := err == nil; got != tt.wantAllowed || tt.q.Allows(tt.count, tt.mem, tt.add) != tt.wantAllowed {
			t.Errorf("%+v.Check(%d, %d, %d) = %v; want allowed %v", tt.q, tt.count, tt.mem, tt.add, err, tt.wantAllowed)
		}
		if err != nil && !errors.Is(err, ErrOverQuota) {
			t.Errorf("Check error %v does not wrap ErrOverQuota", err)
		}
	}
}

// TestQuotaRefusalSaysWhatWasAsked (a new user's report): a refusal said what the tenant uses
// and its limits but not the size asked, so "0 sandboxes and 0 MiB of 1 sandboxes, 300 MiB"
// refusing a 512 MiB sandbox read as a bug. The message names the size asked and each limit;
// a limit of 0 reads "no limit".
func TestQuotaRefusalSaysWhatWasAsked(t *testing.T) {
	for _, tt := range []struct {
		q         Quota
		count     int
		mem, add  int64
		wantError string
	}{
		{Quota{Tenant: "acme", MaxSandboxes: 1, MaxMemoryMiB: 300}, 0, 0, 512,
			"tenant acme asks for a 512 MiB sandbox, over its quota: it uses 0 of 1 sandboxes and 0 of 300 MiB"},
		{Quota{Tenant: "acme", MaxSandboxes: 2}, 2, 768, 256,
			"tenant acme asks for a 256 MiB sandbox, over its quota: it uses 2 of 2 sandboxes and 768 MiB (no limit)"},
		{Quota{Tenant: "acme", MaxMemoryMiB: 1000}, 3, 900, 200,
			"tenant acme asks for a 200 MiB sandbox, over its quota: it uses 3 sandboxes (no limit) and 900 of 1000 MiB"},
	} {
		err := tt.q.Check(tt.count, tt.mem, tt.add)
		var r *QuotaRefusal
		if !errors.As(err, &r) || !errors.Is(err, ErrOverQuota) || err.Error() != tt.wantError {
			t.Errorf("%+v.Check(%d, %d, %d) = %v\nwant %q (a *QuotaRefusal wrapping ErrOverQuota)", tt.q, tt.count, tt.mem, tt.add, err, tt.wantError)
		}
	}
}
