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
