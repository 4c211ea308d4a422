package sim

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/placement"
)

// Compare runs every policy on the same scenario and the same workload (a fresh stream from
// newWorkload per policy) and returns their reports in the order of policies (SIM-1). Runs
// are independent and go in parallel on the available cores; the reports do not depend on
// how they were scheduled.
func Compare(s Scenario, policies []Policy, newWorkload func() Workload) []Report {
	out := make([]Report, len(policies))
	sem := make(chan struct{}, max(runtime.GOMAXPROCS(0), 1))
	var wg sync.WaitGroup
	for i, p := range policies {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			out[i] = s.Run(p, newWorkload())
			<-sem
		}()
	}
	wg.Wait()
	return out
}

// ParsePolicy reads a policy spec: an admission mode (committed, working-set, none) followed by
// any of ":spread" / ":pack" (PLC-2), ":shared" / ":per-replica" (LED-1), ":gate" / ":nogate"
// (ADM-8 + ADM-9, on by default), ":trust" (the agent's local gate off, AGT-2) and, for
// working-set only, the reserve's knobs ":reserve=F" (a share of the configured size in
// (0, 1], default 0.25) and ":floor=N" (MiB, ≥ 0, default 512) (ADM-4): e.g.
// "working-set:reserve=0.1:floor=256". A knob left out keeps its ADM-4 default. The spec is the
// policy's name, so the summary and the CSV show the knobs. Errors are invalid_request.
func ParsePolicy(spec string) (Policy, error) {
	parts := strings.Split(strings.TrimSpace(spec), ":")
	p := Policy{Name: strings.TrimSpace(spec), Mode: parts[0], Strategy: placement.Spread, Gate: true}
	if !admission.ValidMode(p.Mode) {
		return p, berth.Errorf(berth.EInvalidRequest, "policy %q: admission mode must be committed, working-set or none", spec)
	}
	knobs := false
	for _, t := range parts[1:] {
		switch k, v, _ := strings.Cut(t, "="); {
		case t == placement.Spread || t == placement.Pack:
			p.Strategy = t
		case t == "shared":
			p.PerReplicaLedger = false
		case t == "per-replica":
			p.PerReplicaLedger = true
		case t == "gate":
			p.Gate = true
		case t == "nogate":
			p.Gate = false
		case t == "trust":
			p.TrustScheduler = true
		case k == "reserve" || k == "floor":
			if p.Mode != berth.AdmissionWorkingSet {
				return p, berth.Errorf(berth.EInvalidRequest, "policy %q: %s= applies to working-set admission only (ADM-4)", spec, k)
			}
			if !knobs {
				p.Reserve, knobs = admission.DefaultReservePolicy(), true
			}
			var err error
			if k == "reserve" {
				p.Reserve.Fraction, err = strconv.ParseFloat(v, 64)
			} else {
				p.Reserve.FloorMiB, err = strconv.ParseInt(v, 10, 64)
			}
			if err != nil {
				return p, berth.Errorf(berth.EInvalidRequest, "policy %q: %s=%q is not a number", spec, k, v)
			}
		default:
			return p, berth.Errorf(berth.EInvalidRequest, "policy %q: unknown option %q (spread, pack, shared, per-replica, gate, nogate, trust, reserve=F, floor=MiB)", spec, t)
		}
	}
	if knobs && p.Reserve.IsDefault() { // reserve=0:floor=0 is no reserve, not the zero value's default
		return p, berth.Errorf(berth.EInvalidRequest, "policy %q: reserve fraction 0 must lie in (0, 1]", spec)
	}
	if err := p.Reserve.Validate(); err != nil {
		return p, berth.Errorf(berth.EInvalidRequest, "policy %q: %s", spec, berth.ErrorMessage(err))
	}
	return p, nil
}

// ParsePolicies reads a comma-separated list of policy specs (see ParsePolicy).
func ParsePolicies(list string) ([]Policy, error) {
	var ps []Policy
	for _, spec := range strings.Split(list, ",") {
		if strings.TrimSpace(spec) == "" {
			continue
		}
		p, err := ParsePolicy(spec)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("sim: no policies in %q: %w", list, &berth.Error{Code: berth.EInvalidRequest, Message: "empty policy list"})
	}
	return ps, nil
}
