package sim

import (
	"bufio"
	"compress/gzip"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/placement"
)

// Pod is one trace entry: arrival and departure in seconds (Departure 0: never), configured
// memory in MiB (the Alibaba pod list, SIM-1).
type Pod struct {
	Arrival, Departure int64
	MemoryMiB          int64
}

// LoadPods reads the Alibaba pod list CSV (name, cpu_milli, memory_mib, …, creation_time,
// deletion_time, …). Rows it cannot parse are skipped and counted.
func LoadPods(path string) (pods []Pod, skipped int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	r := csv.NewReader(bufio.NewReader(f))
	head, err := r.Read()
	if err != nil {
		return nil, 0, fmt.Errorf("sim: %s: %w", path, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, need := range []string{"memory_mib", "creation_time", "deletion_time"} {
		if _, ok := col[need]; !ok {
			return nil, 0, fmt.Errorf("sim: %s has no %s column", path, need)
		}
	}
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			skipped++
			continue
		}
		mem, e1 := strconv.ParseInt(rec[col["memory_mib"]], 10, 64)
		arr, e2 := strconv.ParseInt(rec[col["creation_time"]], 10, 64)
		dep, e3 := strconv.ParseInt(rec[col["deletion_time"]], 10, 64)
		if e1 != nil || e2 != nil || e3 != nil || mem <= 0 || arr < 0 {
			skipped++
			continue
		}
		if dep <= arr {
			dep = 0
		}
		pods = append(pods, Pod{Arrival: arr, Departure: dep, MemoryMiB: mem})
	}
	return pods, skipped, nil
}

// LoadUtil reads the Alibaba memory-utilisation series (value, timestamp_anon, container_ip;
// gzip or plain) into one series per container, ordered by time. Values are resident ÷
// configured; slightly negative readings are kept here and clamped where used (C07).
func LoadUtil(path string) ([][]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rd io.Reader = bufio.NewReader(f)
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(rd)
		if err != nil {
			return nil, fmt.Errorf("sim: %s: %w", path, err)
		}
		defer gz.Close()
		rd = gz
	}
	r := csv.NewReader(rd)
	if _, err := r.Read(); err != nil {
		return nil, fmt.Errorf("sim: %s: %w", path, err)
	}
	type sample struct {
		ts float64
		v  float64
	}
	byContainer := map[string][]sample{}
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil || len(rec) < 3 {
			continue
		}
		v, e1 := strconv.ParseFloat(rec[0], 64)
		ts, e2 := strconv.ParseFloat(rec[1], 64)
		if e1 != nil || e2 != nil {
			continue
		}
		byContainer[rec[2]] = append(byContainer[rec[2]], sample{ts, v})
	}
	keys := make([]string, 0, len(byContainer))
	for k := range byContainer {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic order
	out := make([][]float64, 0, len(keys))
	for _, k := range keys {
		s := byContainer[k]
		slices.SortFunc(s, func(a, b sample) int { return int(a.ts - b.ts) })
		vals := make([]float64, len(s))
		for i, x := range s {
			vals[i] = x.v
		}
		out = append(out, vals)
	}
	return out, nil
}

// TraceConfig replays pods on hosts of HostMiB each, measuring every TickSeconds, with each
// pod's resident = configured × a utilisation series (pod i follows series i mod len).
type TraceConfig struct {
	Hosts       int
	HostMiB     int64
	HeadroomMiB int64
	Mode        string
	TickSeconds int64
}

// TraceResult is a replay's outcome: creates admitted and refused, the mean number of live
// guests per host over the measurement ticks, and OOM events (host-ticks whose resident
// memory exceeded the host's total).
type TraceResult struct {
	Admitted, Refused int
	MeanPerHost       float64
	OOMEvents         int
}

type traceGuest struct {
	pod  int
	mem  int64
	born int64
}

// Replay runs pods through the real admission and placement code (SIM-1).
func Replay(cfg TraceConfig, pods []Pod, util [][]float64) TraceResult {
	type event struct {
		t      int64
		arrive bool
		pod    int
	}
	var events []event
	for i, p := range pods {
		events = append(events, event{p.Arrival, true, i})
		if p.Departure > 0 {
			events = append(events, event{p.Departure, false, i})
		}
	}
	slices.SortStableFunc(events, func(a, b event) int {
		if a.t != b.t {
			return int(a.t - b.t)
		}
		if a.arrive != b.arrive { // departures first at the same instant
			if a.arrive {
				return 1
			}
			return -1
		}
		return a.pod - b.pod
	})
	tick := max(cfg.TickSeconds, 1)
	hosts := make([][]traceGuest, cfg.Hosts)
	guests := make([][]admission.Guest, cfg.Hosts)
	where := map[int]int{}
	snap := make([]placement.Host, cfg.Hosts)
	resident := func(g traceGuest, t int64) int64 {
		if len(util) == 0 {
			return g.mem
		}
		s := util[g.pod%len(util)]
		u := s[int((t-g.born)/tick)%len(s)]
		r, _ := admission.ClampResident(int64(u*float64(g.mem)), g.mem) // negative readings are 0 (C07)
		return r
	}
	refresh := func(h int, t int64) {
		guests[h] = guests[h][:0]
		for _, g := range hosts[h] {
			guests[h] = append(guests[h], admission.Guest{ConfiguredMiB: g.mem, ResidentMiB: resident(g, t), Measured: t > g.born})
		}
		snap[h] = placement.Host{ID: "h", LastSeenNano: 1, IntakeOpen: true, Mode: cfg.Mode, CPUTotal: 1,
			AdmittableMiB: admission.Admittable(admission.Host{Mode: cfg.Mode, TotalMiB: cfg.HostMiB,
				HeadroomMiB: cfg.HeadroomMiB, IntakeOpen: true, Guests: guests[h]})}
	}
	for h := range hosts {
		refresh(h, 0)
	}
	res := TraceResult{}
	var ticks, live int64
	nextTick := int64(0)
	measure := func(t int64) {
		for h := range hosts {
			var sum int64
			for _, g := range hosts[h] {
				sum += resident(g, t)
			}
			if sum > cfg.HostMiB {
				res.OOMEvents++
			}
			live += int64(len(hosts[h]))
			refresh(h, t)
		}
		ticks++
	}
	for _, e := range events {
		for nextTick <= e.t {
			measure(nextTick)
			nextTick += tick
		}
		if !e.arrive {
			h, ok := where[e.pod]
			if !ok {
				continue
			}
			hosts[h] = slices.DeleteFunc(hosts[h], func(g traceGuest) bool { return g.pod == e.pod })
			delete(where, e.pod)
			refresh(h, e.t)
			continue
		}
		d := placement.Pick(snap, placement.Request{MemoryMiB: pods[e.pod].MemoryMiB}, 1, placement.Options{}, uint64(e.pod)+1)
		if d.Index < 0 {
			res.Refused++
			continue
		}
		res.Admitted++
		hosts[d.Index] = append(hosts[d.Index], traceGuest{pod: e.pod, mem: pods[e.pod].MemoryMiB, born: e.t})
		where[e.pod] = d.Index
		refresh(d.Index, e.t)
	}
	if ticks > 0 && cfg.Hosts > 0 {
		res.MeanPerHost = float64(live) / float64(ticks) / float64(cfg.Hosts)
	}
	return res
}
