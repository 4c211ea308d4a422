package agent

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/preempt"
)

// TestCase_C15_DefaultSoftCordonEnds: with the default soft cordon, an AWS rebalance
// recommendation that no interruption follows cordons the host at once, keeps it cordoned
// past the shortest lag to an interruption seen in the field (17 min: a warning that lapsed
// sooner would never cover one), and the agent's own measure loop puts it back in service
// long before the longest (almost 9 h), with no call from anyone (C15, SPOT-1). Time is the
// measure loop's input: no clock runs.
func TestCase_C15_DefaultSoftCordonEnds(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionCommitted, 2048, &fakeRuntime{})
	a.cfg.PressureSource = func() (float64, bool) { return 0, true } // the host's own pressure decides nothing here
	ctx := context.Background()
	t0 := time.Now()
	a.HandleNotice(preempt.Notice{Provider: "aws", Kind: preempt.KindRebalance, ID: "aws-rebalance-1", Soft: true}, t0)
	for _, tc := range []struct {
		after    time.Duration
		cordoned bool
	}{
		{0, true},
		{time.Minute, true},
		{17 * time.Minute, true},
		{9 * time.Hour, false},
	} {
		now := t0.Add(tc.after)
		a.measureOnce(ctx, now)
		hb := a.Heartbeat(now)
		if cordoned := hb.Status == berth.AgentDraining || !hb.IntakeOpen; cordoned != tc.cordoned {
			t.Fatalf("%v after the recommendation: status %s, intake open %t; want cordoned %t (default soft cordon %v)",
				tc.after, hb.Status, hb.IntakeOpen, tc.cordoned, a.cfg.SoftCordon)
		}
	}
	if err := create(a, "s1", 512); err != nil {
		t.Fatalf("create after the soft cordon ended: %v", err)
	}
}
