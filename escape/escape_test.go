package escape

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// attempt is one way out that must fail. Parallel attempts run side by side on one berth
// dev; the others run first, one at a time.
type attempt struct {
	name     string
	parallel bool
	run      func(t *testing.T, d *dev)
}

// attempts, in the order of the issue (see doc.go).
var attempts = []attempt{
	{"00_normal_use", false, normalUse},
	{"01_files_write_host_path", true, filesWriteHostPath},
	{"02_files_read_host_file", true, filesReadHostFile},
	{"03_exec_read_host_file", true, execReadHostFile},
	{"04_exec_find_berth_dev_environ", true, execFindBerthEnviron},
	{"05_exec_mount_namespace_chroot", true, execMountGames},
	{"06_exec_reach_host_network", true, execReachHostNetwork},
	{"07_memory_limit", true, memoryLimit},
	{"08_pids_limit", true, pidsLimitAttempt},
	{"09_tmp_fill", true, tmpFill},
	{"10_other_sandboxes_and_tenants", true, otherSandboxes},
	{"11a_proc_sys_writes", true, procSysWrites},
	{"11b_dev_access", true, devAccess},
	{"11c_ptrace", true, ptraceOthers},
	{"11d_init_socket_and_berth_dir", true, initSocket},
	{"11e_setuid_binaries", true, setuidBinaries},
	{"11f_kernel_log", true, kernelLog},
	{"11g_session_keyring", true, sessionKeyring},
	{"11h_controlling_terminal", true, controllingTerminal},
	{"11i_init_descriptors_host_write", true, initDescriptorsWrite},
	{"11j_init_impostor_refusal", true, initImpostor},
}

// diskMu serialises the attempts that measure the host's free disk space (09) with the one
// that may consume it (11i), across runtimes, so that one's writes are not blamed on the
// other.
var diskMu sync.Mutex

// TestEscape runs every attempt against a real berth dev of each runtime this host can run
// isolated (ISO-1, ISO-2, ISO-3).
func TestEscape(t *testing.T) {
	for _, rt := range []string{"gvisor", "process"} {
		t.Run(rt, func(t *testing.T) {
			if why := unavailable(rt); why != "" {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s runtime cannot run here (%s), and CI is set: the escape suite must cover it", rt, why)
				}
				t.Skipf("%s runtime skipped: %s (set CI to make this a failure)", rt, why)
			}
			t.Parallel()
			d := startDev(t, rt)
			// Runs after every attempt, before berth dev stops (cleanups run last-in first-out).
			t.Cleanup(func() {
				if err := d.alive(); err != nil {
					t.Errorf("%s: berth dev did not survive the attempts: %v\n%s", rt, err, tail(d.log(), 3000))
				}
			})
			for _, a := range attempts {
				t.Run(a.name, func(t *testing.T) {
					if a.parallel {
						t.Parallel()
					}
					a.run(t, d)
				})
			}
		})
	}
}

// unavailable says why runtime rt cannot run isolated here, or "".
func unavailable(rt string) string {
	switch rt {
	case "gvisor":
		if _, err := exec.LookPath("runsc"); err != nil {
			return "runsc is not installed"
		}
		if os.Geteuid() != 0 {
			return "runsc needs root"
		}
	case "process":
		if os.Geteuid() != 0 {
			return "the process runtime isolates only as root (without it, only --insecure runs)"
		}
	}
	return ""
}

// escaped reports a successful attempt: the test fails saying which attempt, on which
// runtime, how, and what it got.
func escaped(t *testing.T, d *dev, how string, got ...any) {
	t.Helper()
	t.Errorf("ESCAPE (%s runtime, %s): %s\n  got: %s", d.Runtime, t.Name(), how, strings.TrimSpace(fmt.Sprint(got...)))
}

// containsAny returns the first of needles in s, or "".
func containsAny(s string, needles ...string) string {
	for _, n := range needles {
		if n != "" && strings.Contains(s, n) {
			return n
		}
	}
	return ""
}

// secrets are the host-side contents no sandbox may ever see.
func (d *dev) secrets() []string {
	return []string{d.SecretText, d.PublicText, d.VarTmpText, d.AdminKey, d.KeySecret, d.Marker}
}

// hostTargets are the host files attempts 02, 03 and 05 try to read.
func (d *dev) hostTargets() []string {
	return []string{d.Secret, d.Public, d.VarTmp, d.Data + "/admin.key"}
}

// normalUse checks that a sandbox works at all on this runtime — Python runs, a file written
// through the files API reads back the same both ways — so that the suite cannot pass by
// everything being broken.
func normalUse(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	r := c.exec(t, id, 30, "", "python3", "-c", "print(2+2)")
	if !r.ok() || r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "4" {
		t.Fatalf("%s: python3 -c 'print(2+2)' did not print 4: %s", d.Runtime, r)
	}
	want := "hello from the escape suite " + randHex(8)
	if st, body := c.put(t, id, "/tmp/hello.txt", []byte(want)); st != 204 {
		t.Fatalf("%s: PUT /tmp/hello.txt: %d %s", d.Runtime, st, body)
	}
	if st, body := c.get(t, id, "/tmp/hello.txt"); st != 200 || body != want {
		t.Fatalf("%s: GET /tmp/hello.txt: %d %q, want %q", d.Runtime, st, body, want)
	}
	if r := c.exec(t, id, 30, "", "cat", "/tmp/hello.txt"); !r.ok() || r.Stdout != want {
		t.Fatalf("%s: cat /tmp/hello.txt: %s", d.Runtime, r)
	}
	if r := c.sh(t, id, 30, "echo from-exec > /tmp/back.txt"); !r.ok() || r.ExitCode != 0 {
		t.Fatalf("%s: writing /tmp from exec: %s", d.Runtime, r)
	}
	if st, body := c.get(t, id, "/tmp/back.txt"); st != 200 || body != "from-exec\n" {
		t.Fatalf("%s: GET a file exec wrote: %d %q", d.Runtime, st, body)
	}
}
