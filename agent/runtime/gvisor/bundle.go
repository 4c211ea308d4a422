package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth/agent/runtime/rootfs"
)

// sandboxUID is the user every process of a sandbox runs as (the "sandbox" user of the
// built-in /etc/passwd), with no capabilities.
const sandboxUID = 1000

// hostPidsPerGuest is the host tasks one guest process may cost the sentry on the ptrace
// platform (a stub process and its threads; measured ~7 here), for the host pids backstop.
const hostPidsPerGuest = 16

// bundleSpec is what one sandbox's OCI config is made of.
type bundleSpec struct {
	ID        string
	MemoryMiB int64
	TmpMiB    int64
	PidsLimit int
	Layout    rootfs.Layout
	Init      initBinary
	VolumeDir string // "" for none
	Cgroup    string // cgroupsPath
}

// tmpMiB is the size of a sandbox's /tmp: cfg when set, else half its memory, at least 16.
func tmpMiB(cfg, memoryMiB int64) int64 {
	if cfg > 0 {
		return cfg
	}
	return max(memoryMiB/2, 16)
}

// ociSpec builds the container's config (ISO-1, ISO-2): a read-only root, the layout's
// host directories read-only, a bounded tmpfs /tmp, the init directory read-only at /.berth
// with a small tmpfs for its socket, the volume (if any) at /tmp/volume, no /sys, uid 1000
// with no capabilities and no_new_privs, RLIMIT_NPROC of PidsLimit, and the memory limit of
// the sandbox's size in its own cgroup with a host pids backstop.
func ociSpec(b bundleSpec) *specs.Spec {
	mem := b.MemoryMiB << 20
	hostPids := int64(b.PidsLimit*hostPidsPerGuest + 256)
	nproc := uint64(b.PidsLimit)
	hostname := b.ID
	if len(hostname) > 63 {
		hostname = hostname[:63]
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%dm", b.TmpMiB)}},
	}
	for _, bind := range b.Layout.Binds {
		mounts = append(mounts, specs.Mount{Destination: bind.Target, Type: "bind", Source: bind.Source,
			Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	mounts = append(mounts,
		specs.Mount{Destination: berthDir, Type: "bind", Source: b.Init.dir, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: runDir, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "mode=1777", "size=1m"}},
	)
	if b.VolumeDir != "" {
		mounts = append(mounts, specs.Mount{Destination: "/tmp/volume", Type: "bind", Source: b.VolumeDir,
			Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	return &specs.Spec{
		Version: "1.0.2",
		Process: &specs.Process{
			User: specs.User{UID: sandboxUID, GID: sandboxUID},
			Args: append(append([]string{}, b.Init.argv...), initArg),
			Env:  []string{"PATH=" + defaultPath, "HOME=/tmp", "LANG=C.UTF-8"},
			Cwd:  "/tmp",
			// No capabilities at all: the lists are present and empty.
			Capabilities:    &specs.LinuxCapabilities{Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{}},
			NoNewPrivileges: true,
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NPROC", Hard: nproc, Soft: nproc}},
		},
		Root:     &specs.Root{Path: b.Layout.Dir, Readonly: true},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}},
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &mem, Swap: &mem},
				Pids:   &specs.LinuxPids{Limit: &hostPids},
			},
			CgroupsPath: b.Cgroup,
		},
	}
}

// defaultPath is the PATH of a sandbox's processes.
const defaultPath = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

// writeBundle writes the OCI bundle of one sandbox into dir (config.json).
func writeBundle(dir string, b bundleSpec) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("gvisor: bundle: %w", err)
	}
	data, err := json.MarshalIndent(ociSpec(b), "", "  ")
	if err != nil {
		return fmt.Errorf("gvisor: bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return fmt.Errorf("gvisor: bundle: %w", err)
	}
	return nil
}
