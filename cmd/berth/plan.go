package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/evacuate"
	"github.com/spf13/cobra"
)

// The most `berth plan` (PLAN-1) takes of its flags: generous past any real host, and low
// enough that nothing it prints overflows. --link-gbps 1e300 printed "+Inf MiB/s" (1e300 ×
// 1e9 bits is past the largest float64), --memory-mb 1e308 a 300-digit rate, and
// --interruption-rate or --guests near their limits an infinite or 20-digit loss. Within
// these bounds the largest product plan prints, memory ÷ the shortest notice × guests, is
// about 1e24 MiB/s, finite. The durations need none: Go's durations end at about 292 years.
// A value above a bound is invalid_request (exit 2) naming the flag.
const (
	// maxPlanLinkGbps is 1,000,000 Gbps (1 Pbit/s): over a thousand times the fastest host
	// port sold today (800 Gbps).
	maxPlanLinkGbps = 1_000_000
	// maxPlanGuestMiB is 1 PiB (2^30 MiB) for one guest: the largest single machines hold
	// tens of TiB.
	maxPlanGuestMiB = 1 << 30
	// maxPlanInterruptionsPerHour is one interruption a second per host; spot hosts see
	// well under one an hour.
	maxPlanInterruptionsPerHour = 3600
	// maxPlanGuests is a million guests on one host.
	maxPlanGuests = 1_000_000
)

// newPlanCmd is `berth plan` (PLAN-1): the spot-suitability arithmetic for a workload.
func newPlanCmd() *cobra.Command {
	var memMiB, linkGbps, rate float64
	var unit, notice, cordon time.Duration
	var guests int
	authoritative := "outside"
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Is a workload fit for spot capacity? Loss per hour, evacuation rates, which pool (PLAN-1)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if authoritative != "outside" && authoritative != "inside" {
				return berth.Errorf(berth.EInvalidRequest, "--authoritative must be outside or inside")
			}
			if memMiB <= 0 || notice <= 0 || linkGbps < 0 || rate < 0 || guests < 1 {
				return berth.Errorf(berth.EInvalidRequest, "need --memory-mb > 0, --notice > 0, --guests ≥ 1 and non-negative rates")
			}
			if err := checkUpTo(upTo{"--memory-mb", memMiB, maxPlanGuestMiB, "MiB"}, upTo{"--link-gbps", linkGbps, maxPlanLinkGbps, "Gbps"},
				upTo{"--interruption-rate", rate, maxPlanInterruptionsPerHour, "per hour"}, upTo{"--guests", float64(guests), maxPlanGuests, ""}); err != nil {
				return err
			}
			w := evacuate.Workload{
				MemoryMiB: memMiB, UnitSeconds: unit.Seconds(), AuthoritativeOutside: authoritative == "outside",
				InterruptionsPerHour: rate, NoticeSeconds: notice.Seconds(), LinkMiBps: linkGbps * 1e9 / 8 / (1 << 20),
				GuestsPerHost: guests, CordonSeconds: cordon.Seconds(),
			}
			a := evacuate.Spot(w)
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "expected loss per host-hour\t%.0f guest-seconds of work redone (%.2f/h × %d guests × half a %s unit)\n",
				a.ExpectedLossPerHour, rate, guests, unit)
			fmt.Fprintf(tw, "rate to evacuate one guest\t%.1f MiB/s (%.0f MiB in %s)\n", a.PerGuestMiBps, memMiB, notice)
			fmt.Fprintf(tw, "rate to evacuate the host\t%.1f MiB/s (%d guests)\n", a.PerHostMiBps, guests)
			fmt.Fprintf(tw, "link\t%.1f MiB/s (%.2f Gbps)\n", w.LinkMiBps, linkGbps)
			fmt.Fprintf(tw, "guests that leave in time\t%d of %d\n", a.GuestsThatFit, guests)
			fmt.Fprintf(tw, "cordon beats the notice\t%v (%s vs %s)\n", a.CordonBeatsNotice, cordon, notice)
			fmt.Fprintf(tw, "pool\t%s: %s\n", a.Pool, a.Reason)
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.Float64Var(&memMiB, "memory-mb", 4096, "memory of one guest, MiB")
	f.DurationVar(&unit, "unit", 10*time.Minute, "length of one unit of work")
	f.StringVar(&authoritative, "authoritative", authoritative, "where the authoritative copy lives: outside (rebuildable) or inside the guest")
	f.Float64Var(&rate, "interruption-rate", 0.05, "interruptions per host per hour")
	f.DurationVar(&notice, "notice", 30*time.Second, "preemption notice window")
	f.Float64Var(&linkGbps, "link-gbps", 1, "host link rate, Gbps")
	f.IntVar(&guests, "guests", 20, "guests per host")
	f.DurationVar(&cordon, "cordon", time.Second, "time for a cordon to reach every replica (PLC-5)")
	return cmd
}
