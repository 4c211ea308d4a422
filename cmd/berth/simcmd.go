package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/sim"
	"github.com/spf13/cobra"
)

// newSimCmd is `berth sim` (SIM-1), first slice: the seed arithmetic per admission mode and
// the ledger burst, through the same admission and placement code the server runs.
func newSimCmd() *cobra.Command {
	cfg := sim.Config{Hosts: 1, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, GuestMiB: 4 << 10, TouchMiB: 300, Creates: 1000, Seed: 1}
	replicas := 4
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate admission and placement on a fleet with Berth's own code (SIM-1, first slice)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Hosts < 1 || cfg.Hosts > 100000 || cfg.Creates < 0 || cfg.Creates > 10_000_000 || cfg.HostMiB <= 0 || cfg.GuestMiB <= 0 {
				return berth.Errorf(berth.EInvalidRequest, "need 1–100000 hosts, ≤ 10M creates and positive sizes")
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ADMISSION\tADMITTED\tPER_HOST\tREFUSED\tOOM_EVENTS")
			for _, mode := range []string{berth.AdmissionCommitted, berth.AdmissionWorkingSet, berth.AdmissionNone} {
				c := cfg
				c.Mode = mode
				r := sim.Run(c)
				refused := 0
				for _, n := range r.Refused {
					refused += n
				}
				fmt.Fprintf(tw, "%s\t%d\t%.1f\t%d\t%d\n", mode, r.Admitted, r.PerHost, refused, r.OOMEvents)
			}
			room := (cfg.HostMiB - cfg.HeadroomMiB) / cfg.GuestMiB * cfg.GuestMiB
			shared, per := sim.Burst(sim.BurstConfig{Replicas: replicas, AdmittableMiB: room, Mode: berth.AdmissionCommitted,
				GuestMiB: cfg.GuestMiB, Creates: 10 * replicas})
			fmt.Fprintf(tw, "\nLEDGER (burst of %d over %d replicas, room for %d)\tADMITTED\n", 10*replicas, replicas, room/cfg.GuestMiB)
			fmt.Fprintf(tw, "shared\t%d\nper-replica\t%d\n", shared, per)
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Hosts, "hosts", cfg.Hosts, "hosts")
	f.Int64Var(&cfg.HostMiB, "host-mb", cfg.HostMiB, "memory per host, MiB")
	f.Int64Var(&cfg.HeadroomMiB, "headroom-mb", cfg.HeadroomMiB, "headroom per host, MiB")
	f.Int64Var(&cfg.GuestMiB, "guest-mb", cfg.GuestMiB, "configured memory per guest, MiB")
	f.Int64Var(&cfg.TouchMiB, "touch-mb", cfg.TouchMiB, "memory an idle guest really touches, MiB")
	f.IntVar(&cfg.Creates, "creates", cfg.Creates, "creates to place")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed (same seed, same output)")
	f.IntVar(&replicas, "replicas", replicas, "replicas in the ledger burst")
	return cmd
}
