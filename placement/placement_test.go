package placement

import (
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/google/go-cmp/cmp"
)

// now is the server's clock for every test: time is an input.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano()

// host returns a fresh, healthy, stateful-pool committed host with 64 GiB admittable and
// 8 free cores; opts adjust it.
func host(id string, opts ...func(*Host)) Host {
	h := Host{
		ID:            id,
		LastSeenNano:  now - int64(5*time.Second),
		IntakeOpen:    true,
		Region:        "eu-west",
		Mode:          berth.AdmissionCommitted,
		AdmittableMiB: 64 << 10,
		CPUTotal:      16,
		CPUUsed:       8,
	}
	for _, o := range opts {
		o(&h)
	}
	return h
}

func seenAgo(d time.Duration) func(*Host) { return func(h *Host) { h.LastSeenNano = now - int64(d) } }
func admittable(m int64) func(*Host)      { return func(h *Host) { h.AdmittableMiB = m } }
func pending(m int64) func(*Host)         { return func(h *Host) { h.PendingMiB = m } }
func mode(m string) func(*Host)           { return func(h *Host) { h.Mode = m } }
func restores(h *Host)                    { h.CanRestore = true }

func pool(p string) func(*Host)   { return func(h *Host) { h.Pool = p } }
func region(r string) func(*Host) { return func(h *Host) { h.Region = r } }

var (
	draining    = func(h *Host) { h.Draining = true }
	quarantined = func(h *Host) { h.Quarantined = true }
	closed      = func(h *Host) { h.IntakeOpen = false }
	preemptible = func(h *Host) { h.Preemptible = true }
)

// rejected builds a Decision.Rejected array from reason counts.
func rejected(counts map[Reason]int) [numReasons]int {
	var a [numReasons]int
	for r, n := range counts {
		a[r] = n
	}
	return a
}

// TestPLC1_PLC10_Filters runs one table over every filter: which host is chosen, the charge
// it was judged with and how many hosts each filter rejected.
func TestPLC1_PLC10_Filters(t *testing.T) {
	const gib = 1 << 10
	tests := []struct {
		name  string
		hosts []Host
		req   Request
		opt   Options
		want  Decision
	}{
		{
			name:  "C10 stale host with the most free memory is never chosen",
			hosts: []Host{host("stale", seenAgo(15*time.Minute), admittable(1<<20)), host("fresh", admittable(8*gib))},
			req:   Request{MemoryMiB: 2 * gib},
			want:  Decision{Index: 1, ChargeMiB: 2 * gib, Total: 2, Live: 1, Rejected: rejected(map[Reason]int{ReasonStale: 1})},
		},
		{
			name:  "C10 the only host is stale",
			hosts: []Host{host("stale", seenAgo(15*time.Minute), admittable(1<<20))},
			req:   Request{MemoryMiB: 2 * gib},
			want:  Decision{Index: -1, Total: 1, Live: 0, Rejected: rejected(map[Reason]int{ReasonStale: 1})},
		},
		{
			name:  "PLC-1 default cutoff is 30 s: exactly 30 s is live, one ns more is stale",
			hosts: []Host{host("old", seenAgo(30*time.Second+1), admittable(1<<20)), host("edge", seenAgo(30*time.Second))},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 1, Rejected: rejected(map[Reason]int{ReasonStale: 1})},
		},
		{
			name:  "PLC-1 configured cutoff",
			hosts: []Host{host("a", seenAgo(11*time.Second), admittable(1<<20)), host("b", seenAgo(9*time.Second))},
			req:   Request{MemoryMiB: gib},
			opt:   Options{StaleAfterNano: int64(10 * time.Second)},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 1, Rejected: rejected(map[Reason]int{ReasonStale: 1})},
		},
		{
			name:  "stale wins over draining: a host is counted under the first filter it fails",
			hosts: []Host{host("a", seenAgo(time.Hour), draining), host("b", draining), host("c")},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: 2, ChargeMiB: gib, Total: 3, Live: 2, Rejected: rejected(map[Reason]int{ReasonStale: 1, ReasonDraining: 1})},
		},
		{
			name:  "AGT-5 draining hosts are live but never chosen",
			hosts: []Host{host("a", draining, admittable(1<<20)), host("b", draining)},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: -1, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonDraining: 2})},
		},
		{
			name:  "PLC-9 quarantined",
			hosts: []Host{host("a", quarantined, admittable(1<<20)), host("b")},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonQuarantined: 1})},
		},
		{
			name:  "ADM-8 intake closed",
			hosts: []Host{host("a", closed, admittable(1<<20)), host("b")},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonPressure: 1})},
		},
		{
			name:  "region mismatch",
			hosts: []Host{host("a", region("us-east"), admittable(1<<20)), host("b")},
			req:   Request{MemoryMiB: gib, Region: "eu-west"},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonRegionMismatch: 1})},
		},
		{
			name:  "no region requested accepts any region",
			hosts: []Host{host("a", region("us-east"), admittable(1<<20)), host("b")},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: 0, ChargeMiB: gib, Total: 2, Live: 2},
		},
		{
			name:  "POOL-1 a host without pool is stateful",
			hosts: []Host{host("a", pool(""), admittable(1<<20)), host("b", pool(berth.PoolEphemeral))},
			req:   Request{MemoryMiB: gib, Pool: berth.PoolStateful},
			want:  Decision{Index: 0, ChargeMiB: gib, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonPoolMismatch: 1})},
		},
		{
			name:  "requested pool excludes the other pool",
			hosts: []Host{host("a", pool(""), admittable(1<<20)), host("b", pool(berth.PoolEphemeral))},
			req:   Request{MemoryMiB: gib, Pool: berth.PoolEphemeral},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonPoolMismatch: 1})},
		},
		{
			name:  "POOL-2 stateless work may run on either pool",
			hosts: []Host{host("a", pool(berth.PoolEphemeral), preemptible, admittable(1<<20)), host("b", pool(berth.PoolStateful))},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: 0, ChargeMiB: gib, Total: 2, Live: 2},
		},
		{
			name:  "POOL-2 stateful work only on the stateful pool",
			hosts: []Host{host("a", pool(berth.PoolEphemeral), admittable(1<<20)), host("b", pool(berth.PoolStateful))},
			req:   Request{MemoryMiB: gib, Stateful: true},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonPoolMismatch: 1})},
		},
		{
			name:  "POOL-3 stateful work never on a preemptible host",
			hosts: []Host{host("a", pool(berth.PoolStateful), preemptible, admittable(1<<20)), host("b")},
			req:   Request{MemoryMiB: gib, Stateful: true},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonPoolMismatch: 1})},
		},
		{
			name:  "POOL-2 a volume pins the sandbox to its host",
			hosts: []Host{host("a", admittable(1<<20)), host("vol-host"), host("c", admittable(1<<20))},
			req:   Request{MemoryMiB: gib, VolumeHost: "vol-host"},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 3, Live: 3, Rejected: rejected(map[Reason]int{ReasonPoolMismatch: 2})},
		},
		{
			name:  "POOL-2 a volume needs the stateful pool even when its host is ephemeral",
			hosts: []Host{host("vol-host", pool(berth.PoolEphemeral))},
			req:   Request{MemoryMiB: gib, VolumeHost: "vol-host"},
			want:  Decision{Index: -1, Total: 1, Live: 1, Rejected: rejected(map[Reason]int{ReasonPoolMismatch: 1})},
		},
		{
			name:  "PAUSE-1 a resume goes only to a host whose runtime restores images",
			hosts: []Host{host("a", admittable(1<<20)), host("gv", restores), host("c", admittable(1<<20))},
			req:   Request{MemoryMiB: gib, Restore: true},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 3, Live: 3, Rejected: rejected(map[Reason]int{ReasonCannotRestore: 2})},
		},
		{
			name:  "PLC-7 excluded hosts count as saturated",
			hosts: []Host{host("a", admittable(1<<20)), host("b", admittable(1<<19)), host("c")},
			req:   Request{MemoryMiB: gib, Exclude: []int{0, 1}},
			want:  Decision{Index: 2, ChargeMiB: gib, Total: 3, Live: 3, Rejected: rejected(map[Reason]int{ReasonSaturated: 2})},
		},
		{
			name:  "PLC-7 out-of-range exclusions are ignored",
			hosts: []Host{host("a")},
			req:   Request{MemoryMiB: gib, Exclude: []int{-1, 7}},
			want:  Decision{Index: 0, ChargeMiB: gib, Total: 1, Live: 1},
		},
		{
			name:  "ADM-7 insufficient memory is no_capacity material",
			hosts: []Host{host("a", admittable(gib-1)), host("b", admittable(4*gib), pending(3*gib+1))},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: -1, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonInsufficientMemory: 2})},
		},
		{
			name:  "ADM-7 a host too small is counted even after a better host was found",
			hosts: []Host{host("big"), host("small", admittable(gib-1)), host("smaller", admittable(0))},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: 0, ChargeMiB: gib, Total: 3, Live: 3, Rejected: rejected(map[Reason]int{ReasonInsufficientMemory: 2})},
		},
		{
			name:  "ADM-7 pending above admittable never fits, even charged nothing",
			hosts: []Host{host("none", mode(berth.AdmissionNone), admittable(100), pending(101))},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: -1, Total: 1, Live: 1, Rejected: rejected(map[Reason]int{ReasonInsufficientMemory: 1})},
		},
		{
			name:  "ADM-7 exact fit after pending",
			hosts: []Host{host("a", admittable(4*gib), pending(3*gib))},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: 0, ChargeMiB: gib, Total: 1, Live: 1},
		},
		{
			name:  "ADM-4 working-set host judges the reserve, not the full size",
			hosts: []Host{host("committed", admittable(2*gib)), host("ws", mode(berth.AdmissionWorkingSet), admittable(gib))},
			req:   Request{MemoryMiB: 4 * gib},
			want:  Decision{Index: 1, ChargeMiB: gib, Total: 2, Live: 2, Rejected: rejected(map[Reason]int{ReasonInsufficientMemory: 1})},
		},
		{
			name:  "ADM-4 stateful request is charged in full on a working-set host",
			hosts: []Host{host("ws", mode(berth.AdmissionWorkingSet), admittable(2*gib))},
			req:   Request{MemoryMiB: 4 * gib, Stateful: true},
			want:  Decision{Index: -1, Total: 1, Live: 1, Rejected: rejected(map[Reason]int{ReasonInsufficientMemory: 1})},
		},
		{
			name:  "ADM-4 none host is charged nothing",
			hosts: []Host{host("none", mode(berth.AdmissionNone), admittable(0))},
			req:   Request{MemoryMiB: 4 * gib},
			want:  Decision{Index: 0, ChargeMiB: 0, Total: 1, Live: 1},
		},
		{
			name:  "C07 a negative published admittable with huge pending never wraps into a fit",
			hosts: []Host{host("bad", admittable(-5), pending(1<<63-1))},
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: -1, Total: 1, Live: 1, Rejected: rejected(map[Reason]int{ReasonInsufficientMemory: 1})},
		},
		{
			name:  "no hosts at all",
			hosts: nil,
			req:   Request{MemoryMiB: gib},
			want:  Decision{Index: -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Pick(tt.hosts, tt.req, now, tt.opt, 1)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Pick (-want +got):\n%s", diff)
			}
			for _, shift := range []uint{0, blockShift} { // one host per block, and one block
				got := newSnapshot(append([]Host(nil), tt.hosts...), shift).Pick(tt.req, now, tt.opt, 1)
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("Snapshot.Pick, blocks of %d (-want +got):\n%s", 1<<shift, diff)
				}
			}
		})
	}
}

// TestPLC4_Code: zero live hosts is no_healthy_agents, live hosts that do not fit is
// no_capacity (C10).
func TestPLC4_Code(t *testing.T) {
	tests := []struct {
		name  string
		hosts []Host
		want  string
	}{
		{"no hosts", nil, berth.ENoHealthyAgents},
		{"C10 only a 15-min stale host", []Host{host("a", seenAgo(15*time.Minute), admittable(1<<30))}, berth.ENoHealthyAgents},
		{"live but full", []Host{host("a", admittable(0))}, berth.ENoCapacity},
		{"live but draining", []Host{host("a", draining), host("b", seenAgo(time.Hour))}, berth.ENoCapacity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Pick(tt.hosts, Request{MemoryMiB: 1024}, now, Options{}, 7)
			if d.Index != -1 {
				t.Fatalf("Pick chose host %d, want none", d.Index)
			}
			if diff := cmp.Diff(tt.want, d.Code()); diff != "" {
				t.Errorf("Code (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCase_C21_HostsBreakdown: 12 hosts, 8 too full, 3 draining, 1 stale → the refusal body
// says exactly that.
func TestCase_C21_HostsBreakdown(t *testing.T) {
	var hosts []Host
	for i := range 8 {
		hosts = append(hosts, host(fmt.Sprintf("full-%d", i), admittable(512)))
	}
	for i := range 3 {
		hosts = append(hosts, host(fmt.Sprintf("drain-%d", i), draining))
	}
	hosts = append(hosts, host("stale", seenAgo(15*time.Minute)))

	d := Pick(hosts, Request{MemoryMiB: 2048}, now, Options{}, 3)
	if d.Index != -1 {
		t.Fatalf("Pick chose host %d, want none", d.Index)
	}
	want := map[string]int{"total": 12, "insufficient_memory": 8, "draining": 3, "stale": 1}
	if diff := cmp.Diff(want, d.Hosts()); diff != "" {
		t.Errorf("Hosts() (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(berth.ENoCapacity, d.Code()); diff != "" {
		t.Errorf("Code() (-want +got):\n%s", diff)
	}
	if got := (&Decision{}).Hosts(); !cmp.Equal(map[string]int{"total": 0}, got) {
		t.Errorf("empty decision Hosts() = %v, want only total 0", got)
	}
}

// TestPLC10_ReasonNames pins the stable names used in refusal bodies and metric labels.
func TestPLC10_ReasonNames(t *testing.T) {
	want := map[Reason]string{
		ReasonStale:              "stale",
		ReasonDraining:           "draining",
		ReasonQuarantined:        "quarantined",
		ReasonPressure:           "pressure",
		ReasonRegionMismatch:     "region_mismatch",
		ReasonPoolMismatch:       "pool_mismatch",
		ReasonCannotRestore:      "cannot_restore",
		ReasonSaturated:          "saturated",
		ReasonInsufficientMemory: "insufficient_memory",
		numReasons:               "unknown",
		Reason(255):              "unknown",
	}
	got := map[Reason]string{}
	for r := range want {
		got[r] = r.String()
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Reason names (-want +got):\n%s", diff)
	}
	if len(want) != int(numReasons)+2 {
		t.Errorf("a reason was added without a pinned name: numReasons = %d", numReasons)
	}
}

// TestADM4_PickChargesTheReservePolicy: Pick charges a stateless create on a working-set host
// the reserve policy of its options (ADM-4, SIM-1's knobs); the zero policy charges ADM-4's
// default, and a policy changes neither committed, none nor stateful charges.
func TestADM4_PickChargesTheReservePolicy(t *testing.T) {
	ws := mode(berth.AdmissionWorkingSet)
	small := admission.ReservePolicy{Fraction: 0.1, FloorMiB: 256}
	large := admission.ReservePolicy{Fraction: 0.5, FloorMiB: 1024}
	for _, tc := range []struct {
		name     string
		h        Host
		p        admission.ReservePolicy
		req      Request
		charge   int64
		rejected bool
	}{
		{name: "default", h: host("a", ws), req: Request{MemoryMiB: 4096}, charge: 1024},
		{name: "default spelled out", h: host("a", ws), p: admission.DefaultReservePolicy(), req: Request{MemoryMiB: 4096}, charge: 1024},
		{name: "0.1/256", h: host("a", ws), p: small, req: Request{MemoryMiB: 4096}, charge: 410},
		{name: "0.1/256 floor", h: host("a", ws), p: small, req: Request{MemoryMiB: 1024}, charge: 256},
		{name: "0.5/1024", h: host("a", ws), p: large, req: Request{MemoryMiB: 4096}, charge: 2048},
		{name: "stateful is full", h: host("a", ws), p: small, req: Request{MemoryMiB: 4096, Stateful: true}, charge: 4096},
		{name: "committed is full", h: host("a"), p: small, req: Request{MemoryMiB: 4096}, charge: 4096},
		{name: "none is free", h: host("a", mode(berth.AdmissionNone)), p: large, req: Request{MemoryMiB: 4096}, charge: 0},
		// 1 GiB left: the default reserve of 4 GiB (1024) fits, 0.5/1024's 2048 does not.
		{name: "default fits 1 GiB", h: host("a", ws, admittable(1024)), req: Request{MemoryMiB: 4096}, charge: 1024},
		{name: "0.5/1024 does not fit 1 GiB", h: host("a", ws, admittable(1024)), p: large, req: Request{MemoryMiB: 4096}, rejected: true},
		{name: "0.1/256 fits 500 MiB", h: host("a", ws, admittable(500)), p: small, req: Request{MemoryMiB: 4096}, charge: 410},
		{name: "default does not fit 500 MiB", h: host("a", ws, admittable(500)), req: Request{MemoryMiB: 4096}, rejected: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Pick([]Host{tc.h}, tc.req, now, Options{Reserve: tc.p}, 1)
			if tc.rejected {
				if d.Index != -1 || d.Rejected[ReasonInsufficientMemory] != 1 {
					t.Fatalf("want insufficient_memory, got %+v", d)
				}
				return
			}
			if d.Index != 0 || d.ChargeMiB != tc.charge {
				t.Fatalf("Index %d, charge %d; want 0, %d", d.Index, d.ChargeMiB, tc.charge)
			}
		})
	}
	// Pack over a mixed fleet: the policy changes which host is fullest-that-fits. With 1.5 GiB
	// and 3 GiB free, the default (1 GiB) packs onto the 1.5 GiB host; 0.5/1024 (2 GiB) only
	// fits the 3 GiB host.
	hosts := []Host{host("x", ws, admittable(1536)), host("y", ws, admittable(3072))}
	if d := Pick(hosts, Request{MemoryMiB: 4096}, now, Options{Strategy: Pack}, 3); d.Index != 0 || d.ChargeMiB != 1024 {
		t.Fatalf("default: %+v", d)
	}
	if d := Pick(hosts, Request{MemoryMiB: 4096}, now, Options{Strategy: Pack, Reserve: large}, 3); d.Index != 1 || d.ChargeMiB != 2048 ||
		d.Rejected[ReasonInsufficientMemory] != 1 {
		t.Fatalf("0.5/1024: %+v", d)
	}
}
