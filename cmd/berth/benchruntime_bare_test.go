package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// rtBareRunsc runs runsc by hand on copies of a bundle Berth wrote, with Berth's global flags,
// its own --root and its own cgroup parent.
type rtBareRunsc struct {
	runsc    string
	platform string
	root     string
	cgroup   string // cgroup parent, e.g. /berth-bench-runsc-123
	trueDir  string // args: /bin/true
	initDir  string // args unchanged: Berth's init, which says "ok" and serves
	seq      int
}

func newRTBareRunsc(t *testing.T, runsc, platform string, config []byte) *rtBareRunsc {
	t.Helper()
	b := &rtBareRunsc{runsc: runsc, platform: platform, root: t.TempDir(), cgroup: fmt.Sprintf("/berth-bench-runsc-%d", os.Getpid())}
	dir := t.TempDir()
	b.trueDir, b.initDir = filepath.Join(dir, "true"), filepath.Join(dir, "init")
	for _, d := range []string{b.trueDir, b.initDir} {
		var spec specs.Spec
		if err := json.Unmarshal(config, &spec); err != nil {
			t.Fatalf("bundle config: %v", err)
		}
		if d == b.trueDir {
			spec.Process.Args = []string{"/bin/true"}
		}
		spec.Linux.CgroupsPath = "" // set per run
		out, _ := json.MarshalIndent(&spec, "", "  ")
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "config.json"), out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Whatever a failed run left: its containers, then the (empty) cgroup parents.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ents, _ := os.ReadDir(b.root)
		for _, e := range ents {
			if id, ok := strings.CutSuffix(e.Name(), ".state"); ok && strings.HasPrefix(id, "bare-") {
				b.cmd(ctx, "kill", id, "KILL").Run()
				b.cmd(ctx, "delete", "--force", id).Run()
			}
		}
		ctrls, _ := filepath.Glob("/sys/fs/cgroup/*" + b.cgroup)
		ctrls = append(ctrls, "/sys/fs/cgroup"+b.cgroup)
		for _, c := range ctrls {
			_ = os.Remove(c)
		}
	})
	return b
}

func (b *rtBareRunsc) cmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, b.runsc, append([]string{"--root", b.root, "--platform", b.platform, "--network", "none"}, args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	return cmd
}

// prepare sets a fresh container id and cgroup in the bundle dir.
func (b *rtBareRunsc) prepare(dir string) (string, error) {
	b.seq++
	id := fmt.Sprintf("bare-%d-%d", os.Getpid(), b.seq)
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return "", err
	}
	var spec specs.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return "", err
	}
	spec.Linux.CgroupsPath = b.cgroup + "/" + id
	spec.Hostname = id
	out, _ := json.MarshalIndent(&spec, "", "  ")
	return id, os.WriteFile(filepath.Join(dir, "config.json"), out, 0o600)
}

// runTrue times `runsc run` of /bin/true, from the command's start to its exit (the
// container is deleted by then).
func (b *rtBareRunsc) runTrue() (time.Duration, time.Duration, error) {
	id, err := b.prepare(b.trueDir)
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := b.cmd(ctx, "run", "--bundle", b.trueDir, id).CombinedOutput()
	took := time.Since(start)
	if err != nil {
		return 0, 0, fmt.Errorf("runsc run /bin/true: %v: %s", err, rtTail(out))
	}
	return took, 0, nil
}

// runInit times `runsc run` of the bundle as Berth writes it until its init prints "ok"
// (what the runtime's Start waits for), then times the teardown Berth's Stop does: runsc
// kill, the run's exit, runsc delete.
func (b *rtBareRunsc) runInit() (time.Duration, time.Duration, error) {
	id, err := b.prepare(b.initDir)
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := b.cmd(ctx, "run", "--bundle", b.initDir, id)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	line, rerr := bufio.NewReader(out).ReadString('\n')
	took := time.Since(start)
	go io.Copy(io.Discard, out)
	start = time.Now()
	b.cmd(ctx, "kill", id, "KILL").Run()
	werr := cmd.Wait()
	dout, derr := b.cmd(ctx, "delete", "--force", id).CombinedOutput()
	td := time.Since(start)
	switch {
	case strings.TrimSpace(line) != "ok":
		return 0, 0, fmt.Errorf("runsc run init: first line %q (%v), exit %v: %s", line, rerr, werr, rtTail([]byte(stderr.String())))
	case derr != nil && !strings.Contains(string(dout), "does not exist"):
		return 0, 0, fmt.Errorf("runsc delete: %v: %s", derr, rtTail(dout))
	}
	return took, td, nil
}

func rtTail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 600 {
		s = s[len(s)-600:]
	}
	return s
}

// rtHoldPy keeps a bytearray of argv[1] MiB alive: "random" fills it from os.urandom,
// "sparse" writes one byte per 4 KiB page (every page touched, mostly zero). It writes its
// pid to /tmp/hold.pid and the SHA-256 of the array to /tmp/sum-before, then waits; on
// SIGUSR1 it writes the SHA-256 of the same array again to /tmp/sum-after.
const rtHoldPy = `import hashlib, os, signal, sys
n = int(sys.argv[1]) << 20
b = bytearray(n)
if sys.argv[2] == "random":
    step = 1 << 20
    for i in range(0, n, step):
        b[i:i + step] = os.urandom(step)
else:
    b[::4096] = b"\x01" * len(range(0, n, 4096))

def put(name):
    with open("/tmp/sum.tmp", "w") as f:
        f.write(hashlib.sha256(b).hexdigest())
    os.rename("/tmp/sum.tmp", name)

signal.signal(signal.SIGUSR1, lambda *_: put("/tmp/sum-after"))
with open("/tmp/hold.pid", "w") as f:
    f.write(str(os.getpid()))
put("/tmp/sum-before")
while True:
    signal.pause()
`
