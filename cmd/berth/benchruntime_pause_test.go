package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// rtPauseMemory is the sandbox size for a guest holding size MiB.
func rtPauseMemory(size int64) int64 {
	switch {
	case size <= 64:
		return 256
	case size <= 512:
		return 1024
	}
	return size + 1024
}

type rtPauseRun struct {
	residentMiB            int64
	imageMiB, storedMiB    float64
	checkpointMS, uploadMS int64
	fetchMS, restoreMS     int64
	afterRestoreMS         int64
	pause, resume          time.Duration
	freedMiB               int64
	sameSum                bool
}

var rtPauseReason = regexp.MustCompile(`(\d+) MiB resident, a ([0-9.]+) MiB image \(([0-9.]+) MiB stored\) in (\d+) ms \+ (\d+) ms upload`)

// pauseResume creates a stateful python sandbox of rtPauseMemory(size) MiB whose guest holds
// size MiB (mode random or sparse), waits until the agent measures it, pauses it, resumes
// it and compares the guest's checksums, then deletes it. With late, it also reads the
// resident memory 30 s after the resume.
func (s *benchRT) pauseResume(t *testing.T, tap *rtLogTap, size int64, mode string, late bool) (rtPauseRun, error) {
	t.Helper()
	var r rtPauseRun
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sb, err := s.c.CreateSandbox(ctx, berth.CreateRequest{Template: "python", MemoryMiB: rtPauseMemory(size), Stateful: true})
	if err != nil {
		return r, fmt.Errorf("create: %w", err)
	}
	s.cleanupSandbox(t, sb.ID)
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		_ = s.c.DeleteSandbox(dctx, sb.ID)
	}()
	if err := s.c.WriteFile(ctx, sb.ID, "/tmp/hold.py", []byte(rtHoldPy)); err != nil {
		return r, fmt.Errorf("write hold.py: %w", err)
	}
	res, err := s.c.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"sh", "-c",
		fmt.Sprintf("nohup python3 /tmp/hold.py %d %s >/tmp/hold.log 2>&1 &", size, mode)}})
	if err != nil || res.ExitCode != 0 {
		return r, fmt.Errorf("start the guest: %+v, %v", res, err)
	}
	fill := time.Now()
	before, err := s.waitFile(ctx, sb.ID, "/tmp/sum-before", "/tmp/hold.log", 10*time.Minute)
	if err != nil {
		log, _ := s.c.ReadFile(ctx, sb.ID, "/tmp/hold.log")
		return r, fmt.Errorf("%w (guest log: %s)", err, rtTail(log))
	}
	fillTook := time.Since(fill)
	pid, err := s.c.ReadFile(ctx, sb.ID, "/tmp/hold.pid")
	if err != nil {
		return r, err
	}
	// The agent measures every second: wait until its reading holds the array and is stable.
	s.settled(t, sb.ID, size)
	statBefore := rtCgroupStat(sb.ID)
	availLoaded := rtMemAvailableMiB()

	start := time.Now()
	paused, err := s.c.PauseSandbox(ctx, sb.ID)
	r.pause = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("pause: %w", err)
	}
	m := rtPauseReason.FindStringSubmatch(paused.Reason)
	if paused.State != berth.SandboxPaused || m == nil {
		return r, fmt.Errorf("pause: state %s, reason %q", paused.State, paused.Reason)
	}
	r.residentMiB, _ = strconv.ParseInt(m[1], 10, 64)
	r.imageMiB, _ = strconv.ParseFloat(m[2], 64)
	r.storedMiB, _ = strconv.ParseFloat(m[3], 64)
	r.checkpointMS, _ = strconv.ParseInt(m[4], 10, 64)
	r.uploadMS, _ = strconv.ParseInt(m[5], 10, 64)
	time.Sleep(2 * time.Second) // real: a measurement: the kernel frees the sentry's memory as its cgroup goes
	r.freedMiB = rtMemAvailableMiB() - availLoaded
	onDisk := rtDirSize(filepath.Join(s.st.dataDir, "snapshots", sb.ID))

	start = time.Now()
	resumed, err := s.c.ResumeSandbox(ctx, sb.ID)
	r.resume = time.Since(start)
	if err != nil || resumed.State != berth.SandboxRunning {
		return r, fmt.Errorf("resume: %s, %w", resumed.State, err)
	}
	if rec, ok := tap.find("sandbox restored", sb.ID); ok {
		r.fetchMS, _ = strconv.ParseInt(rec["fetch_ms"], 10, 64)
		r.restoreMS, _ = strconv.ParseInt(rec["restore_ms"], 10, 64)
		// From the agent's "restored" to the server's "resumed": the store's transition and
		// the deletion of the image from the snapshot store, before the API answers.
		if srv, ok := tap.find("sandbox resumed", sb.ID); ok {
			a, _ := strconv.ParseInt(rec["time"], 10, 64)
			b, _ := strconv.ParseInt(srv["time"], 10, 64)
			r.afterRestoreMS = (b - a) / 1e6
		}
	}
	res, err = s.c.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"sh", "-c", "kill -USR1 " + strings.TrimSpace(string(pid))}})
	if err != nil || res.ExitCode != 0 {
		return r, fmt.Errorf("signal the guest after the resume: %+v, %v", res, err)
	}
	after, err := s.waitFile(ctx, sb.ID, "/tmp/sum-after", "/tmp/hold.log", 10*time.Minute)
	if err != nil {
		return r, fmt.Errorf("after the resume: %w", err)
	}
	r.sameSum = after == before && len(before) == 64
	resAfter := s.settled(t, sb.ID, 1)
	statAfter := rtCgroupStat(sb.ID)
	if late {
		// Does the restored sentry give back what the restore took? A reading 30 s on.
		time.Sleep(30 * time.Second) // real: a measurement of a gVisor sentry 30 s on
		mib, _ := s.resident(t, sb.ID)
		statAfter += fmt.Sprintf("; 30 s later: resident %d MiB, %s", mib, rtCgroupStat(sb.ID))
	}
	s.notes = append(s.notes, fmt.Sprintf("%d MiB %s (%s): filled in %s; resident %d MiB before the pause, %d MiB after the resume; host MemAvailable +%d MiB after the pause; %.1f MiB on disk in the store; pause %s, resume %s; sha256 %s… %s; cgroup memory.stat MiB before the pause: %s; after the resume: %s",
		size, sb.ID, mode, fillTook.Round(10*time.Millisecond), r.residentMiB, resAfter, r.freedMiB, float64(onDisk)/(1<<20),
		rtMS(r.pause), rtMS(r.resume), before[:min(12, len(before))], map[bool]string{true: "same after the resume", false: "DIFFERS after the resume: " + after}[r.sameSum], statBefore, statAfter))
	return r, nil
}

// settled waits (at most 60 s) until the agent has measured sandbox id at least atLeast MiB
// with two equal readings in a row, and returns the reading.
func (s *benchRT) settled(t *testing.T, id string, atLeast int64) int64 {
	var last int64 = -1
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		mib, measured := s.resident(t, id)
		if measured && mib >= atLeast && mib == last {
			return mib
		}
		last = mib
		time.Sleep(1500 * time.Millisecond) // real: polls a gVisor guest's resident memory until it settles
	}
	return last
}

// rtCgroupStat summarises the memory cgroup of gvisor sandbox id (cgroup v1 or v2), MiB.
func rtCgroupStat(id string) string {
	paths, _ := filepath.Glob("/sys/fs/cgroup/memory/berth-gvisor/*/" + id + "/memory.stat")
	if len(paths) == 0 {
		paths, _ = filepath.Glob("/sys/fs/cgroup/berth-gvisor/*/" + id + "/memory.stat")
	}
	if len(paths) == 0 {
		return "no cgroup"
	}
	b, err := os.ReadFile(paths[0])
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v1 := strings.Contains(string(b), "total_rss ")
		if v1 != strings.HasPrefix(f[0], "total_") {
			continue
		}
		switch strings.TrimPrefix(f[0], "total_") {
		case "rss", "anon", "cache", "file", "shmem", "active_file", "inactive_file":
			v, _ := strconv.ParseInt(f[1], 10, 64)
			out = append(out, fmt.Sprintf("%s %d", strings.TrimPrefix(f[0], "total_"), v>>20))
		}
	}
	return strings.Join(out, ", ")
}

// waitFile polls until path exists in sandbox id and returns its content; it gives up early
// when the guest's log (errlog) shows a Python error.
func (s *benchRT) waitFile(ctx context.Context, id, path, errlog string, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		b, err := s.c.ReadFile(ctx, id, path)
		if err == nil {
			return strings.TrimSpace(string(b)), nil
		}
		if l, lerr := s.c.ReadFile(ctx, id, errlog); lerr == nil && strings.Contains(string(l), "Error") {
			return "", fmt.Errorf("the guest failed: %s", rtTail(l))
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %s after %s: %v", path, limit, err)
		}
		time.Sleep(250 * time.Millisecond) // real: a file a gVisor guest writes
	}
}

func rtMemAvailableMiB() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb >> 10
		}
	}
	return 0
}

func rtDirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
		return nil
	})
	return n
}
