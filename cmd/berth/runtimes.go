package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// snapshot stores

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/gvisor"
	"github.com/berth-dev/berth/agent/runtime/process"
)

// Runtime choices of --runtime (ISO-4).
const (
	runtimeAuto    = "auto"
	runtimeGVisor  = "gvisor"
	runtimeProcess = "process"
)

// runtimeFlags are the sandbox runtime knobs of `berth dev` and `berth agent` (ISO-1…4).
type runtimeFlags struct {
	Runtime   string
	Insecure  bool
	Runsc     string
	Platform  string
	TmpMiB    int64
	PidsLimit int
	Rootfs    []string // template=DIR
}

func defaultRuntimeFlags() runtimeFlags { return runtimeFlags{Runtime: runtimeAuto, PidsLimit: 512} }

// register adds the flags to f.
func (r *runtimeFlags) register(f *pflag.FlagSet) {
	f.StringVar(&r.Runtime, "runtime", r.Runtime, "sandbox runtime: auto (gvisor when runsc is installed, else process), gvisor or process (ISO-4)")
	f.BoolVar(&r.Insecure, "insecure", false, "allow the process runtime without isolation (not root): plain processes that see the host, for development only")
	f.StringVar(&r.Runsc, "runsc", "", "runsc binary for the gvisor runtime (default: runsc on PATH)")
	f.StringVar(&r.Platform, "platform", "", "gVisor platform (default: systrap when runsc has it, else ptrace)")
	f.Int64Var(&r.TmpMiB, "tmp-mb", 0, "size of each sandbox's /tmp, MiB (default: half its memory, at least 16; ISO-2)")
	f.IntVar(&r.PidsLimit, "pids-limit", r.PidsLimit, "processes a sandbox may run (ISO-2)")
	f.StringSliceVar(&r.Rootfs, "template-rootfs", nil, "NAME=DIR: sandboxes of template NAME get the unpacked root file system DIR instead of the built-in one (repeatable)")
}

// pick resolves "auto": gvisor when runsc is on this host, else process. It says why.
func (r runtimeFlags) pick() (string, string, error) {
	switch r.Runtime {
	case runtimeGVisor, runtimeProcess:
		return r.Runtime, "asked for with --runtime", nil
	case runtimeAuto, "":
		if _, err := gvisor.Find(r.Runsc); err == nil {
			return runtimeGVisor, "runsc is installed", nil
		}
		return runtimeProcess, "runsc is not installed (Debian: apt-get install runsc)", nil
	}
	return "", "", berth.Errorf(berth.EInvalidRequest, "--runtime must be auto, gvisor or process, not %q", r.Runtime)
}

// open starts one agent's runtime in dir; close stops its sandboxes; about says, for a
// person, which runtime it is and why ("gvisor (runsc is installed; platform ptrace)").
func (r runtimeFlags) open(dir string, log *slog.Logger) (rt agent.Runtime, closeFn func() error, about string, err error) {
	choice, why, err := r.pick()
	if err != nil {
		return nil, nil, "", err
	}
	rootfs := map[string]string{}
	for _, kv := range r.Rootfs {
		name, path, ok := strings.Cut(kv, "=")
		if !ok || name == "" || !filepath.IsAbs(path) {
			return nil, nil, "", berth.Errorf(berth.EInvalidRequest, "--template-rootfs wants NAME=/absolute/dir, not %q", kv)
		}
		rootfs[name] = path
	}
	switch choice {
	case runtimeGVisor:
		g, err := gvisor.New(gvisor.Config{Dir: dir, Runsc: r.Runsc, Platform: r.Platform, TmpMiB: r.TmpMiB,
			PidsLimit: r.PidsLimit, Rootfs: rootfs, Logger: log})
		if err != nil {
			return nil, nil, "", err
		}
		log.Info("sandbox runtime: gvisor", "why", why, "platform", g.Platform(), "runsc", g.Version())
		return gvisor.AgentRuntime(g), g.Close, fmt.Sprintf("gvisor (%s; platform %s; pause and resume available)", why, g.Platform()), nil
	default:
		p, err := process.New(process.Config{Dir: dir, Insecure: r.Insecure, TmpMiB: r.TmpMiB,
			PidsLimit: r.PidsLimit, Rootfs: rootfs, Logger: log})
		if err != nil {
			return nil, nil, "", err
		}
		about := fmt.Sprintf("process (%s; isolated as root, no pause)", why)
		if p.Isolated() {
			log.Info("sandbox runtime: process", "why", why, "isolated", true)
		} else {
			about = "process WITHOUT isolation (--insecure): plain processes that see this host; never run untrusted code"
			log.Warn("sandbox runtime: "+about, "why", why)
		}
		return process.AgentRuntime(p), p.Close, about, nil
	}
}

// openSnapshotStore opens the snapshot store at url (SPOT-4; file:// here, made if missing).
// An empty url means none: the agent then neither checkpoints nor restores.
func openSnapshotStore(ctx context.Context, url string) (*blob.Bucket, error) {
	if url == "" {
		return nil, nil
	}
	if dir, ok := strings.CutPrefix(url, "file://"); ok {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
	}
	b, err := blob.OpenBucket(ctx, url)
	if err != nil {
		return nil, berth.Errorf(berth.EInvalidRequest, "snapshot store %q: %v", url, err)
	}
	return b, nil
}
