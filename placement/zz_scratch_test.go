package placement

import (
	"fmt"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
)

var _ = admission.Fits

func pickOrig(hosts []Host, req Request, nowNano int64, opt Options, seed uint64) Decision {
	d := Decision{Index: -1, Total: len(hosts)}
	staleAfter := opt.StaleAfterNano
	if staleAfter <= 0 {
		staleAfter = DefaultStaleAfterNano
	}
	cutoff := nowNano - staleAfter
	pack := opt.Strategy == Pack
	needStatefulPool := req.Stateful || req.VolumeHost != ""
	chargeFull := max(req.MemoryMiB, 0)
	chargeReserve := admission.Charge(berth.AdmissionWorkingSet, req.MemoryMiB, req.Stateful)

	var best float64
	ties := uint64(0)
	rng := seed | 1
	for i := range hosts {
		h := &hosts[i]
		if h.LastSeenNano < cutoff {
			d.Rejected[ReasonStale]++
			continue
		}
		d.Live++
		switch {
		case h.Draining:
			d.Rejected[ReasonDraining]++
			continue
		case h.Quarantined:
			d.Rejected[ReasonQuarantined]++
			continue
		case !h.IntakeOpen:
			d.Rejected[ReasonPressure]++
			continue
		case req.Region != "" && h.Region != req.Region:
			d.Rejected[ReasonRegionMismatch]++
			continue
		case !poolAllowsOrig(h, req, needStatefulPool):
			d.Rejected[ReasonPoolMismatch]++
			continue
		case excludedOrig(req.Exclude, i):
			d.Rejected[ReasonSaturated]++
			continue
		}
		charge := chargeFull
		switch h.Mode {
		case berth.AdmissionWorkingSet:
			charge = chargeReserve
		case berth.AdmissionNone:
			charge = 0
		}
		free := h.AdmittableMiB - max(h.PendingMiB, 0)
		if !admission.Fits(h.AdmittableMiB, h.PendingMiB, charge) {
			d.Rejected[ReasonInsufficientMemory]++
			continue
		}
		var score float64
		if pack {
			score = -float64(free - charge)
		} else {
			score = 0.6*(h.CPUTotal-h.CPUUsed) + 0.3*float64(free-charge)/1024
			if h.StreamRestore {
				score += 5
			}
		}
		switch {
		case d.Index < 0 || score > best:
			d.Index, best, ties, d.ChargeMiB = i, score, 1, charge
		case score == best:
			// Reservoir sampling over equal scores: each tied host wins with probability
			// 1/ties, so identical hosts share a burst instead of herding (PLC-2).
			ties++
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			if rng%ties == 0 {
				d.Index, d.ChargeMiB = i, charge
			}
		}
	}
	return d
}

func poolAllowsOrig(h *Host, req Request, needStatefulPool bool) bool {
	pool := h.Pool
	if pool == "" {
		pool = berth.PoolStateful
	}
	if req.Pool != "" && req.Pool != pool {
		return false
	}
	if needStatefulPool && (pool != berth.PoolStateful || h.Preemptible) {
		return false
	}
	return req.VolumeHost == "" || req.VolumeHost == h.ID
}

func excludedOrig(ex []int, i int) bool {
	for _, e := range ex {
		if e == i {
			return true
		}
	}
	return false
}

func BenchmarkScratch(b *testing.B) {
	impls := map[string]func([]Host, Request, int64, Options, uint64) Decision{"orig": pickOrig, "new": Pick}
	for _, n := range []int{1000, 10000} {
		hosts := benchFleet(n, 42)
		for _, name := range []string{"orig", "new"} {
			f := impls[name]
			b.Run(fmt.Sprintf("%s/hosts=%d", name, n), func(b *testing.B) {
				var seed uint64
				for b.Loop() {
					seed++
					sinkDecision = f(hosts, benchRequest, now, Options{}, seed)
				}
			})
		}
	}
	_ = berth.AdmissionNone
}
