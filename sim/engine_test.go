package sim

import (
	"bytes"
	"encoding/csv"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/placement"
	"github.com/google/go-cmp/cmp"
)

// smallFleet is a scenario with every moving part on: 3 replicas with stale caches, growth
// and spikes, SDK retries, and host losses with and without notice.
func smallFleet(seed uint64) (Scenario, func() Workload) {
	s := Scenario{Hosts: 20, HostMiB: 16 << 10, HeadroomMiB: 1 << 10, Replicas: 3, RefreshEvery: 2 * time.Second,
		Retry: true, RetryAfter: true, Seed: seed,
		Failures: Failures{LossPerHostHour: 0.5, NoticeFrac: 0.7, Notices: []time.Duration{30 * time.Second, 120 * time.Second},
			LinkMiBps: 50, CanSnapshot: true}}
	m := IdleModel{Creates: 3000, RatePerSec: 5, MemoryMiB: 2 << 10, TouchMiB: 300, TouchJitter: 0.5, LifetimeMedian: 2 * time.Minute,
		LifetimeSigma: 1, GrowthFrac: 0.1, GrowthOver: 2 * time.Minute, SpikeProb: 0.1, SpikeFrac: 0.8, SpikeFor: time.Minute,
		ReconstructibleFrac: 0.5, Seed: seed}
	return s, func() Workload { return NewIdle(m) }
}

func allPolicies(t *testing.T) []Policy {
	ps, err := ParsePolicies("committed,working-set,none:nogate,working-set:pack,working-set:per-replica,working-set:nogate")
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func render(t *testing.T, r []Report) []byte {
	var b bytes.Buffer
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	if err := WriteCSV(&b, r); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestSIM1_SameSeedSameBytes: two runs with the same seed print byte-identical output (text
// and CSV), policies running in parallel; another seed prints something else.
func TestSIM1_SameSeedSameBytes(t *testing.T) {
	s, w := smallFleet(7)
	reports := Compare(s, allPolicies(t), w)
	for _, r := range reports {
		// Every create ends once: started or given up, even while evacuations queue creates.
		if r.Creates != 3000 || r.Admitted+r.GaveUp != r.Creates {
			t.Fatalf("%s: %d creates, %d admitted + %d given up", r.Policy, r.Creates, r.Admitted, r.GaveUp)
		}
		for _, l := range r.Losses { // a guest is saved, ends on its own or is lost: never two of them
			if l.Lost < 0 || l.Saved+l.Ended > l.Guests {
				t.Fatalf("%s: %+v", r.Policy, l)
			}
		}
	}
	a := render(t, reports)
	b := render(t, Compare(s, allPolicies(t), w))
	if !bytes.Equal(a, b) {
		t.Fatalf("same seed, different output:\n%s\nvs\n%s", a, b)
	}
	s2, w2 := smallFleet(8)
	if c := render(t, Compare(s2, allPolicies(t), w2)); bytes.Equal(a, c) {
		t.Fatalf("seeds 7 and 8 printed the same output:\n%s", a)
	}
	t.Logf("\n%s", a)
}

// TestSIM1_PoliciesSideBySide: on guests that grow and spike, committed never loses the bet;
// working-set packs more per host; without the pressure gate working-set meets the kernel
// OOM killer, with it the agent evicts first (ADM-8, ADM-9) and the kernel kills less; none
// admission loses the bet worst.
func TestSIM1_PoliciesSideBySide(t *testing.T) {
	s := Scenario{Hosts: 4, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, Replicas: 2, Retry: true, RetryAfter: true, Seed: 5}
	w := func() Workload {
		return NewIdle(IdleModel{Creates: 3000, RatePerSec: 2, MemoryMiB: 4 << 10, TouchMiB: 300, TouchJitter: 0.3,
			LifetimeMedian: 20 * time.Minute, LifetimeSigma: 0.5, GrowthFrac: 0.1, GrowthOver: 5 * time.Minute,
			SpikeProb: 0.2, SpikeFrac: 0.8, SpikeFor: time.Minute, Seed: 5})
	}
	ps, err := ParsePolicies("committed,working-set,working-set:nogate,none:nogate")
	if err != nil {
		t.Fatal(err)
	}
	r := Compare(s, ps, w)
	com, ws, ng, none := r[0], r[1], r[2], r[3]
	t.Logf("\n%s", render(t, r))
	if com.OOMKills != 0 || com.Evictions != 0 {
		t.Fatalf("committed lost the bet: %+v", com)
	}
	if ws.MeanPerHost < 3*com.MeanPerHost {
		t.Fatalf("working-set %.1f per host vs committed %.1f: want several times denser", ws.MeanPerHost, com.MeanPerHost)
	}
	if ng.OOMKills == 0 || ng.Evictions != 0 || ws.Evictions == 0 || ws.OOMKills >= ng.OOMKills {
		t.Fatalf("gate on: %d OOM kills, %d evictions; gate off: %d OOM kills, %d evictions", ws.OOMKills, ws.Evictions, ng.OOMKills, ng.Evictions)
	}
	if none.OOMKills <= ng.OOMKills {
		t.Fatalf("none admission %d OOM kills, working-set without gate %d: want none worse", none.OOMKills, ng.OOMKills)
	}
}

// TestSIM1_SpreadVsPack: spread levels creates over the hosts, pack fills the fullest host
// that fits (PLC-2).
func TestSIM1_SpreadVsPack(t *testing.T) {
	s := Scenario{Hosts: 10, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, Replicas: 2, Seed: 2}
	w := func() Workload {
		return NewIdle(IdleModel{Creates: 20, Interval: time.Second, MemoryMiB: 1 << 10, TouchMiB: 1 << 10})
	}
	ps, _ := ParsePolicies("committed:spread,committed:pack")
	r := Compare(s, ps, w)
	if r[0].Admitted != 20 || r[1].Admitted != 20 || r[0].BusiestHost > 3 || r[1].BusiestHost != 20 {
		t.Fatalf("spread: %d admitted, busiest host %d; pack: %d admitted, busiest host %d", r[0].Admitted, r[0].BusiestHost, r[1].Admitted, r[1].BusiestHost)
	}
}

// TestSIM1_HostLossEvacuation: a silent loss saves nothing (SPOT-5); under a notice the
// evacuation planner (evacuate.Triage, SPOT-3) moves guests smallest first inside link ×
// window, so a 120 s notice saves every guest and a 30 s notice only some; reconstructible
// guests are all saved even in 30 s.
func TestSIM1_HostLossEvacuation(t *testing.T) {
	run := func(reconstructible float64) Report {
		s := Scenario{Hosts: 6, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, Retry: true, RetryAfter: true, Seed: 4,
			Failures: Failures{LinkMiBps: 50, CanSnapshot: true, Scheduled: []ScheduledLoss{
				{At: time.Minute, Host: 0}, {At: time.Minute, Host: 1, Notice: 120 * time.Second}, {At: time.Minute, Host: 2, Notice: 30 * time.Second},
			}}}
		w := NewIdle(IdleModel{Creates: 30, Interval: time.Second, MemoryMiB: 1 << 10, TouchMiB: 512, ReconstructibleFrac: reconstructible})
		return s.Run(Policy{Mode: berth.AdmissionCommitted, Gate: true}, w)
	}
	r := run(0)
	silent, long, short := r.Losses[0], r.Losses[1], r.Losses[2] // notice kinds in order of first appearance: 120 s, 30 s
	if long.Kind != "notice 2m0s" || short.Kind != "notice 30s" {
		t.Fatalf("loss kinds %+v", r.Losses)
	}
	if silent.Hosts != 1 || silent.Guests == 0 || silent.Saved != 0 || silent.Lost != silent.Guests {
		t.Fatalf("silent loss: %+v", silent)
	}
	if long.Guests == 0 || long.Saved != long.Guests {
		t.Fatalf("120 s notice, 50 MiB/s: %+v, want every guest saved", long)
	}
	if short.Saved == 0 || short.Saved >= short.Guests {
		t.Fatalf("30 s notice, 50 MiB/s: %+v, want some but not all saved", short)
	}
	if all := run(1).Losses[2]; all.Saved != all.Guests {
		t.Fatalf("30 s notice, reconstructible guests: %+v, want all saved", all)
	}
	t.Logf("evacuation saved %.0f %% over all losses; %+v", r.EvacSavedPct, r.Losses)

	// Guests whose lifetime ends inside the window: a recreated one is saved once (its old copy
	// ending on the dying host is not also "ended"); one that ends before its move is ended.
	s := Scenario{Hosts: 4, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, Retry: true, RetryAfter: true, Seed: 4,
		Failures: Failures{LinkMiBps: 5, CanSnapshot: true, Scheduled: []ScheduledLoss{{At: time.Minute, Host: 1, Notice: 120 * time.Second}}}}
	for _, rf := range []float64{0, 1} {
		w := NewIdle(IdleModel{Creates: 40, Interval: time.Second, MemoryMiB: 1 << 10, TouchMiB: 512, LifetimeMedian: 100 * time.Second, ReconstructibleFrac: rf})
		l := s.Run(Policy{Mode: berth.AdmissionCommitted, Gate: true}, w).Losses[1]
		if l.Guests == 0 || l.Saved+l.Ended+l.Lost != l.Guests || l.Lost < 0 || (rf == 1 && l.Saved != l.Guests) || (rf == 0 && l.Ended == 0) {
			t.Fatalf("reconstructible %.0f, lifetimes ending inside the window: %+v", rf, l)
		}
	}
}

// TestSIM1_CordonDelayVsCache: Pick chooses a cordoned host when a replica's cache has not
// seen the cordon (PLC-5). Without the push, each replica that did not receive the cordon's
// heartbeat wastes one pick on it — then the ledger refuses (the cordon published admittable
// 0) and the refusal refreshes that replica's cache; with the cordon pushed to every replica
// in 0.5 s, fewer picks are wasted. Either way no create is lost: the next host takes it.
func TestSIM1_CordonDelayVsCache(t *testing.T) {
	const replicas = 4
	run := func(cordon time.Duration) Report {
		s := Scenario{Hosts: 10, HostMiB: 64 << 10, HeadroomMiB: 4 << 10, Replicas: replicas, RefreshEvery: 30 * time.Second,
			CordonDelay: cordon, Seed: 6, Failures: Failures{LinkMiBps: 1000, Scheduled: []ScheduledLoss{{At: 20 * time.Second, Host: 3, Notice: 120 * time.Second}}}}
		w := NewIdle(IdleModel{Creates: 1200, RatePerSec: 20, MemoryMiB: 256, TouchMiB: 100})
		return s.Run(Policy{Mode: berth.AdmissionWorkingSet, Gate: true}, w)
	}
	stale, pushed := run(-1), run(500*time.Millisecond)
	if stale.CordonMisses != replicas-1 || pushed.CordonMisses >= stale.CordonMisses || stale.Admitted != 1200 || pushed.Admitted != 1200 {
		t.Fatalf("cordon misses: %d without push (want %d), %d with a 0.5 s push; admitted %d, %d",
			stale.CordonMisses, replicas-1, pushed.CordonMisses, stale.Admitted, pushed.Admitted)
	}
}

// TestSIM1_RetriesWithSDKBackoff: a refused create retries in virtual time with the server's
// Retry-After or the SDK's full jitter (berth.Backoff, SDK-1) and mostly succeeds once room
// frees up; time from first refusal to success stays inside the SDK's 90 s deadline. Without
// retries every refusal is final.
func TestSIM1_RetriesWithSDKBackoff(t *testing.T) {
	run := func(retry, retryAfter bool) Report {
		s := Scenario{Hosts: 1, HostMiB: 8 << 10, Retry: retry, RetryAfter: retryAfter, Seed: 9}
		w := NewIdle(IdleModel{Creates: 60, RatePerSec: 0.5, MemoryMiB: 1 << 10, TouchMiB: 1 << 10, LifetimeMedian: 20 * time.Second})
		return s.Run(Policy{Mode: berth.AdmissionCommitted, Gate: true}, w)
	}
	none := run(false, false)
	if none.RefusedThenOK != 0 || none.GaveUp != none.Creates-none.Admitted || none.GaveUp == 0 {
		t.Fatalf("no retries: %+v", none)
	}
	for _, ra := range []bool{true, false} {
		r := run(true, ra)
		if r.Admitted <= none.Admitted || r.RefusedThenOK == 0 || r.TTSP50 <= 0 || r.TTSP99 > 90 || r.TTSP50 > r.TTSP99 {
			t.Fatalf("retry-after %v: %+v (without retries %d admitted)", ra, r, none.Admitted)
		}
		t.Logf("retry-after %v: %d/%d admitted, %d after a refusal, p50 %.1f s, p99 %.1f s", ra, r.Admitted, r.Creates, r.RefusedThenOK, r.TTSP50, r.TTSP99)
	}
}

// TestSIM1_IdleModel: a guest touches its base size, grows in steps, spikes for SpikeFor, and
// the model reports each change's age; the stream of creates is deterministic.
func TestSIM1_IdleModel(t *testing.T) {
	m := IdleModel{Creates: 50, RatePerSec: 1, MemoryMiB: 4096, TouchMiB: 300, GrowthFrac: 0.25, GrowthOver: 4 * time.Minute,
		SpikeProb: 1, SpikeFrac: 0.75, SpikeFor: time.Minute, SpikeWithin: time.Minute, LifetimeMedian: time.Hour, Seed: 1}
	w := NewIdle(m)
	a, ok := w.Next()
	if !ok || a.MemoryMiB != 4096 || a.Lifetime != int64(time.Hour) {
		t.Fatalf("first create %+v", a)
	}
	if r, _ := w.Resident(&a, 0); r != 300 && r != 3072 {
		t.Fatalf("resident at start %d", r)
	}
	var sizes []int64
	age := int64(0)
	for age >= 0 && len(sizes) < 20 {
		r, next := w.Resident(&a, age)
		if next >= 0 && next <= age {
			t.Fatalf("next change at age %d is not after %d", next, age)
		}
		sizes = append(sizes, r)
		age = next
	}
	if got := sizes[len(sizes)-1]; got != 300+1024 {
		t.Fatalf("resident after growth %d, want 300 + a quarter of 4096", got)
	}
	if !containsInt(sizes, 3072) {
		t.Fatalf("no spike to 3072 MiB in %v", sizes)
	}
	prev := a.At
	n := 1
	for {
		b, ok := w.Next()
		if !ok {
			break
		}
		if b.At < prev {
			t.Fatalf("arrivals out of order: %d after %d", b.At, prev)
		}
		prev, n = b.At, n+1
	}
	if n != 50 {
		t.Fatalf("%d creates, want 50", n)
	}
	a2, _ := NewIdle(m).Next()
	if a2 != a {
		t.Fatalf("same model, different first create: %+v vs %+v", a2, a)
	}
}

// TestSIM1_LifetimePastInt64 (`berth sim --lifetime 2562047h` admitted every create on one
// host, `--lifetime-sigma 50` the same): a lognormal lifetime draw past 2^63 ns converted to
// a negative int64 and the guest lived 1 s. Such a guest lives to the end of the run, as one
// without a lifetime does: the two runs report the same.
func TestSIM1_LifetimePastInt64(t *testing.T) {
	m := IdleModel{Creates: 200, RatePerSec: 1, MemoryMiB: 4096, TouchMiB: 300, LifetimeMedian: 2562047 * time.Hour,
		LifetimeSigma: 1, Seed: 1}
	w := NewIdle(m)
	for a, ok := w.Next(); ok; a, ok = w.Next() {
		if a.Lifetime < int64(time.Hour) {
			t.Fatalf("create %+v: lifetime %v drawn about a median of 292 years", a, time.Duration(a.Lifetime))
		}
	}
	s := Scenario{Hosts: 1, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, Replicas: 1, Seed: 1}
	forever := m
	forever.LifetimeMedian, forever.LifetimeSigma = 0, 0
	p := Policy{Mode: berth.AdmissionCommitted}
	long, none := s.Run(p, NewIdle(m)), s.Run(p, NewIdle(forever))
	if long.Admitted != none.Admitted || long.Admitted != 7 {
		t.Errorf("admitted %d with lifetimes past 2^63 ns, %d with guests that never leave; want 7 (a 32 GiB host) both", long.Admitted, none.Admitted)
	}
}

func containsInt(xs []int64, x int64) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestSIM1_TraceWorkload: a pod's resident follows its utilisation series step by step,
// slightly negative readings count as 0 (C07), and pods come in arrival order.
func TestSIM1_TraceWorkload(t *testing.T) {
	w := NewTrace(TraceWorkload{Pods: []Pod{{Arrival: 50, Departure: 0, MemoryMiB: 1000}, {Arrival: 10, Departure: 20, MemoryMiB: 2000}},
		Util: [][]float64{{-0.02, 0.5}}, Step: time.Minute})
	a, _ := w.Next()
	b, _ := w.Next()
	if _, ok := w.Next(); ok || a.At != 10e9 || a.Lifetime != 10e9 || b.At != 50e9 || b.Lifetime != 0 {
		t.Fatalf("pods %+v %+v", a, b)
	}
	if r, next := w.Resident(&b, 0); r != 0 || next != int64(time.Minute) {
		t.Fatalf("negative reading: %d MiB, next %d", r, next)
	}
	if r, _ := w.Resident(&b, int64(90*time.Second)); r != 500 {
		t.Fatalf("second step: %d MiB, want 500", r)
	}
	if r, _ := w.Resident(&b, int64(2*time.Minute)); r != 0 {
		t.Fatalf("the series wraps around: %d MiB", r)
	}
}

// TestSIM1_ParsePolicy: policy specs and their refusals (invalid_request).
func TestSIM1_ParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Policy
		err  bool
	}{
		{spec: "committed", want: Policy{Name: "committed", Mode: "committed", Strategy: "spread", Gate: true}},
		{spec: "working-set:pack:per-replica:nogate:trust", want: Policy{Name: "working-set:pack:per-replica:nogate:trust",
			Mode: "working-set", Strategy: "pack", PerReplicaLedger: true, TrustScheduler: true}},
		{spec: "none:gate:shared", want: Policy{Name: "none:gate:shared", Mode: "none", Strategy: "spread", Gate: true}},
		{spec: "working-set:reserve=0.1:floor=256:pack", want: Policy{Name: "working-set:reserve=0.1:floor=256:pack", Mode: "working-set",
			Strategy: "pack", Gate: true, Reserve: admission.ReservePolicy{Fraction: 0.1, FloorMiB: 256}}},
		{spec: "working-set:reserve=0.5", want: Policy{Name: "working-set:reserve=0.5", Mode: "working-set", Strategy: "spread", Gate: true,
			Reserve: admission.ReservePolicy{Fraction: 0.5, FloorMiB: 512}}}, // the floor keeps its default
		{spec: "working-set:floor=0", want: Policy{Name: "working-set:floor=0", Mode: "working-set", Strategy: "spread", Gate: true,
			Reserve: admission.ReservePolicy{Fraction: 0.25}}}, // a quarter, no floor
		{spec: "working-set:reserve=1", want: Policy{Name: "working-set:reserve=1", Mode: "working-set", Strategy: "spread", Gate: true,
			Reserve: admission.ReservePolicy{Fraction: 1, FloorMiB: 512}}},
		{spec: "lucky", err: true},
		{spec: "committed:fast", err: true},
		{spec: "committed:reserve=0.1", err: true}, // the reserve is working-set's alone
		{spec: "none:floor=256", err: true},
		{spec: "working-set:reserve=0", err: true},
		{spec: "working-set:reserve=0:floor=0", err: true},
		{spec: "working-set:reserve=1.5", err: true},
		{spec: "working-set:reserve=-0.1", err: true},
		{spec: "working-set:reserve=NaN", err: true},
		{spec: "working-set:reserve=abc", err: true},
		{spec: "working-set:floor=-1", err: true},
		{spec: "working-set:floor=0.5", err: true},
		{spec: "working-set:reserve", err: true},
	} {
		got, err := ParsePolicy(tc.spec)
		if tc.err {
			if berth.ErrorCode(err) != berth.EInvalidRequest {
				t.Errorf("%q: %v, want invalid_request", tc.spec, err)
			}
			continue
		}
		if err != nil || !cmp.Equal(tc.want, got) {
			t.Errorf("%q: %v (-want +got)\n%s", tc.spec, err, cmp.Diff(tc.want, got))
		}
	}
	if _, err := ParsePolicies(" , "); err == nil {
		t.Error("an empty policy list parsed")
	}
}

// TestSIM1_CSVAndPlots: the CSV has one row per policy under a fixed header, with the report's
// figures; the plots are PNG files.
func TestSIM1_CSVAndPlots(t *testing.T) {
	s, w := smallFleet(3)
	r := Compare(s, allPolicies(t)[:2], w)
	var b bytes.Buffer
	if err := WriteCSV(&b, r); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil || len(rows) != 3 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for i, rep := range r {
		row := rows[i+1]
		if row[col["policy"]] != rep.Policy || row[col["admitted"]] != strconv.Itoa(rep.Admitted) ||
			row[col["oom_kills"]] != strconv.Itoa(rep.OOMKills) || row[col["refused_no_capacity"]] != strconv.Itoa(rep.Refusals[berth.ENoCapacity]) {
			t.Fatalf("row %v for %+v", row, rep)
		}
	}
	dir := filepath.Join(t.TempDir(), "plots")
	files, err := WritePlots(dir, r)
	if err != nil || len(files) != 2 {
		t.Fatalf("%v %v", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil || !bytes.HasPrefix(data, []byte("\x89PNG")) {
			t.Fatalf("%s: %v, %d bytes", f, err, len(data))
		}
	}
}

// TestSIM1_EventOrder: the virtual clock runs events by time, and events at the same instant
// in the order they were scheduled.
func TestSIM1_EventOrder(t *testing.T) {
	var h eventHeap
	r := newRNG(1)
	for i := range 1000 {
		h.push(int64(r.next()%50), evAttempt, int32(i))
	}
	prev := event{at: -1}
	for h.len() > 0 {
		e := h.pop()
		if e.at < prev.at || (e.at == prev.at && e.seq < prev.seq) {
			t.Fatalf("%+v after %+v", e, prev)
		}
		prev = e
	}
}

// TestSIM1_ReserveKnobs: the working-set reserve's fraction and floor are knobs of a policy
// (ADM-4, SIM-1). On the idle workload arriving faster than heartbeats net reservations out,
// a smaller reserve admits more creates and a larger one fewer; ADM-4's knobs spelled out
// give the default run byte for byte; the knobs reach the policy's name in the table and CSV.
func TestSIM1_ReserveKnobs(t *testing.T) {
	s := Scenario{Hosts: 10, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, Replicas: 4, Seed: 1}
	w := func() Workload {
		return NewIdle(IdleModel{Creates: 5000, RatePerSec: 50, MemoryMiB: 4 << 10, TouchMiB: 300, Seed: 1})
	}
	ps, err := ParsePolicies("working-set,working-set:reserve=0.1:floor=256,working-set:reserve=0.5:floor=1024,working-set:reserve=0.25:floor=512")
	if err != nil {
		t.Fatal(err)
	}
	r := Compare(s, ps, w)
	out := render(t, r)
	t.Logf("\n%s", out)
	def, small, large, spelled := r[0], r[1], r[2], r[3]
	if !(small.Admitted > def.Admitted && def.Admitted > large.Admitted) {
		t.Fatalf("admitted: 0.1/256 %d, default %d, 0.5/1024 %d: want a smaller reserve to admit more",
			small.Admitted, def.Admitted, large.Admitted)
	}
	for _, x := range r {
		if x.OOMKills != 0 || x.Evictions != 0 {
			t.Fatalf("%s: idle guests touching 300 MiB lost the bet: %d OOM kills, %d evictions", x.Policy, x.OOMKills, x.Evictions)
		}
	}
	spelled.Policy = def.Policy
	if a, b := render(t, []Report{def}), render(t, []Report{spelled}); !bytes.Equal(a, b) {
		t.Fatalf("ADM-4's knobs spelled out differ from the default:\n%s\nvs\n%s", a, b)
	}
	for _, name := range []string{"working-set:reserve=0.1:floor=256", "working-set:reserve=0.5:floor=1024"} {
		if !bytes.Contains(out, []byte("\n"+name+" ")) || !bytes.Contains(out, []byte("\n"+name+",")) {
			t.Fatalf("the table or the CSV lacks %q", name)
		}
	}
}

// TestSIM1_LossPastInt64 (`berth sim --loss-rate 1e-300` lost the host at once and refused
// every create as stale): a loss drawn past 2^63 ns converted to a negative time. A loss that
// far away is past any run; the run reports what a run without losses does.
func TestSIM1_LossPastInt64(t *testing.T) {
	s, w := smallFleet(7)
	p := Policy{Mode: berth.AdmissionCommitted, Strategy: placement.Spread}
	none := s
	none.Failures.LossPerHostHour = 0
	tiny := s
	tiny.Failures.LossPerHostHour = 1e-300
	a, b := tiny.Run(p, w()), none.Run(p, w())
	if a.Admitted != b.Admitted || a.Admitted == 0 || !maps.Equal(a.Refusals, b.Refusals) {
		t.Errorf("--loss-rate 1e-300: admitted %d, refused %v; without losses: admitted %d, refused %v; want the same",
			a.Admitted, a.Refusals, b.Admitted, b.Refusals)
	}
}

// TestSIM1_ArrivalPastInt64: a Poisson arrival drawn past 2^63 ns arrived at a negative time,
// before the run. Drawn that far, it arrives at the cap, after every earlier one.
func TestSIM1_ArrivalPastInt64(t *testing.T) {
	w := NewIdle(IdleModel{Creates: 5, RatePerSec: 1e-300, MemoryMiB: 512, Seed: 1})
	last := int64(0)
	for a, ok := w.Next(); ok; a, ok = w.Next() {
		if a.At < last {
			t.Fatalf("arrival at %d ns after one at %d: time ran backwards", a.At, last)
		}
		last = a.At
	}
	if last <= 0 {
		t.Errorf("last arrival at %d ns at a rate of 1e-300/s, want far in the future", last)
	}
}
