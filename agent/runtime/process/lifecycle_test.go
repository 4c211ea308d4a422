package process

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

// Stop kills every process of the sandbox, background ones included, and removes its cgroup
// and directory (AGT-7); a second Stop is fine.
func TestStopKillsTree(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-stop", 256)
			run(t, r, "sb-stop", berth.ExecRequest{Cmd: []string{"sh", "-c", "sleep 1000 & sleep 1000 & exit 0"}})
			pids := sandboxPids(t, r, "sb-stop")
			if len(pids) != 3 {
				t.Fatalf("sandbox processes = %v, want the init and two sleeps", pids)
			}
			starts := map[int]string{}
			for _, pid := range pids {
				starts[pid] = startTime(pid)
			}
			sb := held(r, "sb-stop")
			if err := r.Stop(context.Background(), "sb-stop"); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			for pid, st := range starts {
				if st != "" && startTime(pid) == st {
					t.Errorf("pid %d survived Stop", pid)
				}
			}
			if _, err := os.Stat(sb.dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("sandbox dir after Stop: %v, want it gone", err)
			}
			if sb.cgroup != "" {
				if _, err := os.Stat(sb.cgroup); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("cgroup after Stop: %v, want it gone", err)
				}
			}
			if err := r.Stop(context.Background(), "sb-stop"); err != nil {
				t.Errorf("second Stop: %v", err)
			}
			if _, err := r.Measure("sb-stop"); berth.ErrorCode(err) != berth.ESandboxNotFound {
				t.Errorf("Measure after Stop = %v, want %s", err, berth.ESandboxNotFound)
			}
			// The id is free again.
			startSandbox(t, r, "sb-stop", 256)
		})
	}
}

func TestErrors(t *testing.T) {
	r := newRuntime(t, IsolateOff)
	startSandbox(t, r, "sb-err", 256)
	ctx := context.Background()
	exec := func(id string, cmd ...string) error {
		_, err := r.Exec(ctx, id, berth.ExecRequest{Cmd: cmd})
		return err
	}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"exec unknown id", exec("nope", "true"), berth.ESandboxNotFound},
		{"write unknown id", r.WriteFile(ctx, "nope", "/tmp/x", bytes.NewReader(nil)), berth.ESandboxNotFound},
		{"read unknown id", func() error { _, err := readAll(r.ReadFile(ctx, "nope", "/tmp/x")); return err }(), berth.ESandboxNotFound},
		{"measure unknown id", func() error { _, err := r.Measure("nope"); return err }(), berth.ESandboxNotFound},
		{"empty cmd", exec("sb-err"), berth.EInvalidRequest},
		{"empty program", exec("sb-err", ""), berth.EInvalidRequest},
		{"negative timeout", func() error {
			_, err := r.Exec(ctx, "sb-err", berth.ExecRequest{Cmd: []string{"true"}, TimeoutS: -1})
			return err
		}(), berth.EInvalidRequest},
		{"relative write path", r.WriteFile(ctx, "sb-err", "tmp/x", bytes.NewReader(nil)), berth.EInvalidRequest},
		{"relative read path", func() error { _, err := readAll(r.ReadFile(ctx, "sb-err", "x")); return err }(), berth.EInvalidRequest},
		{"file too large", r.WriteFile(ctx, "sb-err", "/tmp/x", bytes.NewReader(make([]byte, sbinit.MaxFileBytes+1))), berth.ETooLarge},
		{"duplicate id", r.Start(ctx, Spec{ID: "sb-err", MemoryMiB: 256}), berth.EConflict},
		{"bad id", r.Start(ctx, Spec{ID: "../etc", MemoryMiB: 256}), berth.EInvalidRequest},
		{"empty id", r.Start(ctx, Spec{MemoryMiB: 256}), berth.EInvalidRequest},
		{"no memory", r.Start(ctx, Spec{ID: "sb-zero"}), berth.EInvalidRequest},
		{"stop unknown id", r.Stop(ctx, "nope"), ""},
	}
	for _, tc := range cases {
		if got := berth.ErrorCode(tc.err); got != tc.want {
			t.Errorf("%s: error %v has code %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := r.Start(ctx, Spec{ID: "sb-late", MemoryMiB: 256}); berth.ErrorCode(err) != berth.EUnavailable {
		t.Errorf("Start after Close = %v, want %s", err, berth.EUnavailable)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{{}, {Dir: t.TempDir(), Isolate: "maybe"}} {
		if _, err := New(cfg); berth.ErrorCode(err) != berth.EInvalidRequest {
			t.Errorf("New(%+v) = %v, want %s", cfg, err, berth.EInvalidRequest)
		}
	}
}

// A background process that touches 100 MiB is measured (SPEC §13): the measurement grows by
// 100 MiB ± 20 % over the idle sandbox's (the python interpreter adds a few MiB). The growth,
// not the total, is judged: uncontained, the init's own resident set is in the total, and on
// a loaded machine it reached 15–23 MiB, which put a right measurement (123 MiB) over a bound
// on the total.
func TestMeasureBackgroundProcess(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-mem", 512)
			before, err := r.Measure("sb-mem")
			if err != nil {
				t.Fatalf("Measure: %v", err)
			}
			if !before.Seen || before.Exited || before.ResidentMiB > 50 {
				t.Errorf("idle Measure = %+v, want seen, not exited, a few MiB", before)
			}
			run(t, r, "sb-mem", berth.ExecRequest{Cmd: []string{"sh", "-c",
				`python3 -c "b=bytes(range(256))*(100*4096); import time; time.sleep(600)" >/dev/null 2>&1 &`}})
			var last Measurement
			grew := func() int64 { return last.ResidentMiB - before.ResidentMiB }
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("idle %+v, last %+v", before, last)
				}
			})
			waitFor(t, "the measurement to grow by 100 MiB ± 20 %", func() bool {
				last, err = r.Measure("sb-mem")
				if err != nil {
					t.Fatalf("Measure: %v", err)
				}
				return grew() >= 80 && grew() <= 120
			})
			if !last.Seen || last.Exited {
				t.Errorf("Measure = %+v, want seen and not exited", last)
			}
		})
	}
}

// A sandbox whose init dies reads as exited; Stop still cleans up.
func TestMeasureSeesExit(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-exit", 256)
			held(r, "sb-exit").proc.Kill()
			waitFor(t, "the init to be seen gone", func() bool {
				m, err := r.Measure("sb-exit")
				return err == nil && m.Exited && !m.Seen
			})
			if _, err := r.Exec(context.Background(), "sb-exit", berth.ExecRequest{Cmd: []string{"true"}}); berth.ErrorCode(err) != berth.ESandboxNotFound {
				t.Errorf("Exec in an exited sandbox = %v, want %s", err, berth.ESandboxNotFound)
			}
			if err := r.Stop(context.Background(), "sb-exit"); err != nil {
				t.Errorf("Stop: %v", err)
			}
		})
	}
}

// New cleans what a crashed runtime with the same Dir left behind: its inits and their
// processes, cgroups and directories.
func TestNewCleansLeftovers(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			old := newRuntimeIn(t, dir, mode)
			startSandbox(t, old, "sb-left", 256)
			run(t, old, "sb-left", berth.ExecRequest{Cmd: []string{"sh", "-c", "sleep 1000 &"}})
			pids := sandboxPids(t, old, "sb-left")
			starts := map[int]string{}
			for _, pid := range pids {
				starts[pid] = startTime(pid)
			}
			sb := held(old, "sb-left")

			// old "crashed": it never stopped its sandbox. A new runtime takes over the Dir.
			newRuntimeIn(t, dir, mode)
			for pid, st := range starts {
				if st != "" && startTime(pid) == st {
					t.Errorf("pid %d of the crashed run survived New", pid)
				}
			}
			if _, err := os.Stat(sb.dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("leftover dir: %v, want it gone", err)
			}
			if sb.cgroup != "" {
				if _, err := os.Stat(sb.cgroup); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("leftover cgroup: %v, want it gone", err)
				}
			}
		})
	}
}

// Two runtimes with different Dirs may hold the same sandbox id without stepping on each
// other, and New of one does not clean the other's sandboxes.
func TestRuntimesDoNotCollide(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			a := newRuntime(t, mode)
			startSandbox(t, a, "sb-same", 256)
			b := newRuntime(t, mode)
			startSandbox(t, b, "sb-same", 256)
			for _, r := range []*Runtime{a, b} {
				if res := run(t, r, "sb-same", berth.ExecRequest{Cmd: []string{"echo", "alive"}}); strings.TrimSpace(res.Stdout) != "alive" {
					t.Errorf("Exec = %+v, want alive", res)
				}
			}
		})
	}
}
