package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/placement"
)

// reasonNames lists placement's rejection reasons in its order (PLC-10).
func reasonNames() []string {
	var names []string
	for r := placement.Reason(0); r.String() != "unknown"; r++ {
		names = append(names, r.String())
	}
	return names
}

// WriteTable writes the side-by-side summary of reports as aligned text (SIM-1): density,
// refusals by code, kernel OOM kills, evictions, time from first refusal to success and
// evacuation saved %, then the scheduler's hops, refusals by host reason and host losses.
// The output is a function of the reports alone.
func WriteTable(w io.Writer, reports []Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tADMITTED\tGAVE_UP\tPER_HOST\tPEAK\tBUSIEST\tNO_CAPACITY\tNO_HEALTHY\tOOM_KILLS\tEVICTIONS\tTTS_P50_S\tTTS_P99_S\tEVAC_SAVED_%")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%.1f\t%.1f\t%d\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.0f\n", r.Policy, r.Admitted, r.Creates, r.GaveUp,
			r.MeanPerHost, r.PeakPerHost, r.BusiestHost, r.Refusals[berth.ENoCapacity], r.Refusals[berth.ENoHealthyAgents], r.OOMKills, r.Evictions,
			r.TTSP50, r.TTSP99, r.EvacSavedPct)
	}
	fmt.Fprintln(tw, "\nPOLICY\tLEDGER_RACES\tAGENT_REFUSALS\tCORDON_MISSES\tUNREACHABLE\tOVER_GRANTS\tREFUSED_THEN_OK")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", r.Policy, r.LedgerRaces, r.AgentRefusals, r.CordonMisses, r.Unreachable, r.OverGrants, r.RefusedThenOK)
	}
	var used []string
	for _, n := range reasonNames() {
		for _, r := range reports {
			if r.Reasons[n] > 0 {
				used = append(used, n)
				break
			}
		}
	}
	if len(used) > 0 {
		fmt.Fprintf(tw, "\nREFUSALS BY HOST REASON\t%s\n", strings.ToUpper(strings.Join(used, "\t")))
		for _, r := range reports {
			fmt.Fprint(tw, r.Policy)
			for _, n := range used {
				fmt.Fprintf(tw, "\t%d", r.Reasons[n])
			}
			fmt.Fprintln(tw)
		}
	}
	header := false
	for _, r := range reports {
		for _, l := range r.Losses {
			if l.Hosts == 0 {
				continue
			}
			if !header {
				fmt.Fprintln(tw, "\nPOLICY\tHOST_LOSS\tHOSTS\tGUESTS\tSAVED\tENDED\tLOST\tSAVED_%")
				header = true
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%.0f\n", r.Policy, l.Kind, l.Hosts, l.Guests, l.Saved, l.Ended, l.Lost, l.SavedPct())
		}
	}
	return tw.Flush()
}

// WriteCSV writes one row per report with a fixed header (SIM-1's `--csv`): the summary,
// refusals per host reason (reason_<name>) and one group of columns per host-loss kind.
func WriteCSV(w io.Writer, reports []Report) error {
	cw := csv.NewWriter(w)
	head := []string{"policy", "hosts", "creates", "admitted", "gave_up", "mean_per_host", "peak_per_host", "busiest_host",
		"refused_no_capacity", "refused_no_healthy_agents"}
	for _, n := range reasonNames() {
		head = append(head, "reason_"+n)
	}
	head = append(head, "ledger_races", "agent_refusals", "cordon_misses", "unreachable", "over_grants",
		"oom_kills", "evictions", "refused_then_ok", "tts_p50_s", "tts_p99_s", "evac_saved_pct")
	var kinds []string
	for _, r := range reports {
		for _, l := range r.Losses {
			if !slices.Contains(kinds, l.Kind) {
				kinds = append(kinds, l.Kind)
			}
		}
	}
	for _, k := range kinds {
		k = strings.ReplaceAll(k, " ", "_")
		head = append(head, k+"_hosts", k+"_guests", k+"_saved", k+"_ended", k+"_lost")
	}
	if err := cw.Write(head); err != nil {
		return err
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }
	d := strconv.Itoa
	for _, r := range reports {
		row := []string{r.Policy, d(r.Hosts), d(r.Creates), d(r.Admitted), d(r.GaveUp), f(r.MeanPerHost), f(r.PeakPerHost), d(r.BusiestHost),
			d(r.Refusals[berth.ENoCapacity]), d(r.Refusals[berth.ENoHealthyAgents])}
		for _, n := range reasonNames() {
			row = append(row, d(r.Reasons[n]))
		}
		row = append(row, d(r.LedgerRaces), d(r.AgentRefusals), d(r.CordonMisses), d(r.Unreachable), d(r.OverGrants),
			d(r.OOMKills), d(r.Evictions), d(r.RefusedThenOK), f(r.TTSP50), f(r.TTSP99), f(r.EvacSavedPct))
		for _, k := range kinds {
			var l LossStat
			for _, x := range r.Losses {
				if x.Kind == k {
					l = x
				}
			}
			row = append(row, d(l.Hosts), d(l.Guests), d(l.Saved), d(l.Ended), d(l.Lost))
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
