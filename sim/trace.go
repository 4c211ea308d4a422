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
	"time"
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
	return ReadPods(f, path)
}

// ReadPods reads a pod list CSV from rd as LoadPods does: only the columns memory_mib,
// creation_time and deletion_time are needed, in any order. path names rd in errors.
func ReadPods(rd io.Reader, path string) (pods []Pod, skipped int, err error) {
	r := csv.NewReader(bufio.NewReader(rd))
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
	return ReadUtil(f, path)
}

// ReadUtil reads a utilisation series CSV from f as LoadUtil does: gzip when path ends in
// ".gz". path names f in errors.
func ReadUtil(f io.Reader, path string) ([][]float64, error) {
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

// TraceConfig replays pods on Hosts hosts of HostMiB each in one admission mode, each pod's
// resident = configured × a utilisation series (pod i follows series i mod len) stepping every
// TickSeconds (default 300). Gate turns the pressure gate and ADM-9 eviction on; Retry makes
// refused pods retry with the SDK's backoff instead of being dropped.
type TraceConfig struct {
	Hosts       int
	HostMiB     int64
	HeadroomMiB int64
	Mode        string
	TickSeconds int64
	Gate        bool
	Retry       bool
}

// TraceResult is a replay's outcome: creates admitted and refused (dropped or given up), the
// time-averaged number of live guests per host, kernel OOM kills and ADM-9 evictions.
type TraceResult struct {
	Admitted, Refused int
	MeanPerHost       float64
	OOMEvents         int
	Evictions         int
}

// Replay runs pods through the engine, and so through the real admission and placement code
// (SIM-1).
func Replay(cfg TraceConfig, pods []Pod, util [][]float64) TraceResult {
	s := Scenario{Hosts: cfg.Hosts, HostMiB: cfg.HostMiB, HeadroomMiB: cfg.HeadroomMiB, Retry: cfg.Retry, RetryAfter: cfg.Retry}
	r := s.Run(Policy{Mode: cfg.Mode, Gate: cfg.Gate}, NewTrace(TraceWorkload{Pods: pods, Util: util, Step: time.Duration(cfg.TickSeconds) * time.Second}))
	return TraceResult{Admitted: r.Admitted, Refused: r.Creates - r.Admitted, MeanPerHost: r.MeanPerHost, OOMEvents: r.OOMKills, Evictions: r.Evictions}
}
