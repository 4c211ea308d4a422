package berth

import (
	"strings"
	"testing"
	"time"
)

// TestQuarantinePolicy pins PLC-9's arithmetic: quarantine from the After-th consecutive
// failure, doubling on probation up to the cap; a success resets.
func TestQuarantinePolicy(t *testing.T) {
	q := QuarantinePolicy{After: 3, Backoff: 30 * time.Second, MaxBackoff: 2 * time.Minute}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for failures, want := range map[int]time.Duration{0: 0, 2: 0, 3: 30 * time.Second, 4: time.Minute, 5: 2 * time.Minute, 50: 2 * time.Minute} {
		got := q.Until(failures, now)
		if (want == 0) != got.IsZero() || (want != 0 && got.Sub(now) != want) {
			t.Errorf("Until(%d) = %v, want now+%v", failures, got, want)
		}
	}
	c := q.Apply(2, time.Time{}, true, now)
	if c.Failures != 3 || c.To != string(AgentQuarantined) || !c.Until.Equal(now.Add(30*time.Second)) {
		t.Errorf("third failure: %+v", c)
	}
	if c := q.Apply(1, time.Time{}, true, now); c.Failures != 2 || c.To != "" || !c.Until.IsZero() {
		t.Errorf("second failure: %+v", c)
	}
	if c := q.Apply(4, now, false, now); c.Failures != 0 || !c.Until.IsZero() || c.To != string(AgentActive) {
		t.Errorf("success on probation: %+v", c)
	}
	if c := q.Apply(1, time.Time{}, false, now); c.Failures != 0 || c.To != "" {
		t.Errorf("success with one earlier failure: %+v", c)
	}
	if c := (QuarantinePolicy{}).Apply(100, time.Time{}, true, now); !c.Until.IsZero() || c.To != "" {
		t.Errorf("a zero policy never quarantines: %+v", c)
	}
}

// TestCheckAgentID: host names and the default "<host>-<hex>" ids pass; control characters,
// separators, paths, spaces and over-long ids are invalid_request (issue 15).
func TestCheckAgentID(t *testing.T) {
	for _, ok := range []string{"a1", "host-1", "ip-10-0-0-5.ec2.internal-1a2b3c4d", "bench_sim:01", strings.Repeat("x", 128)} {
		if err := CheckAgentID(ok); err != nil {
			t.Errorf("CheckAgentID(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "a\x00b", "../../x", "a b", "a\nb", "ä", "a/b", strings.Repeat("x", 129)} {
		if err := CheckAgentID(bad); ErrorCode(err) != EInvalidRequest {
			t.Errorf("CheckAgentID(%q) = %v, want invalid_request", bad, err)
		}
	}
}

// TestCheckReason: a drain reason of up to MaxReasonBytes bytes of UTF-8 passes, counted in
// bytes, not characters; one byte more, a NUL or invalid UTF-8 is invalid_request (AGT-5).
func TestCheckReason(t *testing.T) {
	for _, ok := range []string{"", "operator", "spot notice ⏎ maintenance", strings.Repeat("x", MaxReasonBytes), strings.Repeat("é", MaxReasonBytes/2)} {
		if err := CheckReason(ok); err != nil {
			t.Errorf("CheckReason(%d bytes) = %v, want nil", len(ok), err)
		}
	}
	for _, bad := range []string{strings.Repeat("x", MaxReasonBytes+1), strings.Repeat("é", MaxReasonBytes/2) + "x", "a\x00b", "a\xffb", "\xc3"} {
		if err := CheckReason(bad); ErrorCode(err) != EInvalidRequest {
			t.Errorf("CheckReason(%q…, %d bytes) = %v, want invalid_request", bad[:min(len(bad), 8)], len(bad), err)
		}
	}
}
