package sim

import (
	"fmt"
	"runtime"
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
// (ADM-8 + ADM-9, on by default) and ":trust" (the agent's local gate off, AGT-2). The spec is
// the policy's name. Errors are invalid_request.
func ParsePolicy(spec string) (Policy, error) {
	parts := strings.Split(strings.TrimSpace(spec), ":")
	p := Policy{Name: strings.TrimSpace(spec), Mode: parts[0], Strategy: placement.Spread, Gate: true}
	if !admission.ValidMode(p.Mode) {
		return p, berth.Errorf(berth.EInvalidRequest, "policy %q: admission mode must be committed, working-set or none", spec)
	}
	for _, t := range parts[1:] {
		switch t {
		case placement.Spread, placement.Pack:
			p.Strategy = t
		case "shared":
			p.PerReplicaLedger = false
		case "per-replica":
			p.PerReplicaLedger = true
		case "gate":
			p.Gate = true
		case "nogate":
			p.Gate = false
		case "trust":
			p.TrustScheduler = true
		default:
			return p, berth.Errorf(berth.EInvalidRequest, "policy %q: unknown option %q (spread, pack, shared, per-replica, gate, nogate, trust)", spec, t)
		}
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
