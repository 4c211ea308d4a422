package escape

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// filesWriteHostPath (ISO-3): the files API must write inside the sandbox's root only. It
// PUTs host paths directly (/var/tmp, /root, /, the test's host directory, berth dev's data
// directory), through symlinks the sandbox makes to host locations (/, /var/tmp, /root, the
// data directory, a climbing relative link, /proc/1/root, /proc/self/root, /proc/self/cwd),
// and through /proc's magic links themselves; exec tries the same with a shell. Then it
// looks ON THE HOST: no file carrying the attempt's random name may exist in any of those
// places, nor anywhere under the data directory or the test's directories.
func filesWriteHostPath(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "shell", sandboxOpts{})
	name := "berth-escape-" + randHex(8)
	links := map[string]string{
		"/tmp/hostroot": "/", "/tmp/vartmp": "/var/tmp", "/tmp/rootdir": "/root", "/tmp/datadir": d.Data,
		"/tmp/hostdir": d.HostDir, "/tmp/up": "../../../../../../../..", "/tmp/p1root": "/proc/1/root",
		"/tmp/selfroot": "/proc/self/root", "/tmp/selfcwd": "/proc/self/cwd", "/tmp/d/deep": "../../../../var/tmp",
	}
	var script strings.Builder
	script.WriteString("mkdir -p /tmp/d\n")
	for l, target := range links {
		fmt.Fprintf(&script, "ln -sfn '%s' '%s'\n", target, l)
	}
	c.mustSh(t, id, 30, script.String())

	paths := []string{
		"/var/tmp/" + name + "-proof.txt", "/root/" + name, "/" + name, "/etc/" + name, "/usr/" + name,
		d.HostDir + "/" + name, d.Data + "/" + name, "/tmp/" + name + "-own", // the last one is the sandbox's own /tmp: fine
		"/tmp/hostroot/var/tmp/" + name + "-via-root-link", "/tmp/vartmp/" + name + "-via-vartmp-link",
		"/tmp/rootdir/" + name + "-via-root-dir-link", "/tmp/datadir/" + name + "-via-data-link",
		"/tmp/hostdir/" + name + "-via-hostdir-link", "/tmp/up/var/tmp/" + name + "-via-climbing-link",
		"/tmp/p1root/var/tmp/" + name + "-via-proc1root-link", "/tmp/selfroot/var/tmp/" + name + "-via-selfroot-link",
		"/tmp/selfcwd/" + name + "-via-selfcwd-link", "/tmp/d/deep/" + name + "-via-deep-link",
		"/proc/1/root/var/tmp/" + name + "-via-proc1root", "/proc/self/root/var/tmp/" + name + "-via-procselfroot",
		"/proc/1/cwd/" + name + "-via-proc1cwd", "/proc/self/cwd/" + name + "-via-procselfcwd",
		"/proc/1/root" + d.HostDir + "/" + name + "-via-proc1root-hostdir",
		"/tmp/../var/tmp/" + name + "-dotdot", "/tmp/hostroot/../var/tmp/" + name + "-dotdot-link",
	}
	results := map[string]string{}
	var mu sync.Mutex
	parallelEach(paths, 4, func(p string) {
		st, body := c.put(t, id, p, []byte("written by "+t.Name()))
		mu.Lock()
		results[p] = fmt.Sprintf("%d %s", st, strings.TrimSpace(body))
		mu.Unlock()
	})
	// The same from exec, with a shell.
	var sh strings.Builder
	for _, p := range []string{"/var/tmp/" + name + "-exec", "/root/" + name + "-exec", "/tmp/hostroot/var/tmp/" + name + "-exec-link",
		"/tmp/p1root/var/tmp/" + name + "-exec-p1root", "/proc/1/root/var/tmp/" + name + "-exec-proc1root",
		"/tmp/datadir/" + name + "-exec-data", "/tmp/hostdir/" + name + "-exec-hostdir", "/tmp/up/var/tmp/" + name + "-exec-up"} {
		fmt.Fprintf(&sh, "echo x > '%s' 2>/dev/null && echo \"WROTE %s\"\n", p, p)
	}
	rsh := c.mustSh(t, id, 30, sh.String()+"echo PROBE-DONE")

	// On the host.
	var found []string
	for _, dir := range []string{"/var/tmp", "/root", "/", "/etc", "/usr", "/tmp", os.TempDir()} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.Contains(e.Name(), name) {
				found = append(found, filepath.Join(dir, e.Name()))
			}
		}
	}
	for _, root := range []string{d.Data, d.HostDir} {
		filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err == nil && strings.Contains(e.Name(), name) {
				found = append(found, p)
			}
			return nil
		})
	}
	if len(found) > 0 {
		var tried strings.Builder
		for _, p := range paths {
			fmt.Fprintf(&tried, "\n    PUT %s → %s", p, results[p])
		}
		escaped(t, d, "files API / exec writes landed on the host", "host files created: ", found, tried.String(), "\n  exec: ", rsh.Stdout)
	}
	for _, p := range []string{"/tmp/../var/tmp/" + name + "-dotdot", "/tmp/hostroot/../var/tmp/" + name + "-dotdot-link"} {
		if !strings.HasPrefix(results[p], "400 ") {
			t.Errorf("%s: PUT of the unclean path %s answered %s, want 400 invalid_request", d.Runtime, p, results[p])
		}
	}
	// Sanity: the sandbox's own /tmp took its file (the API works), and it is not on the host.
	if st, body := c.get(t, id, "/tmp/"+name+"-own"); st != 200 {
		t.Errorf("%s: the control write to the sandbox's own /tmp did not read back: %d %s", d.Runtime, st, body)
	}
	t.Logf("PUT answers: %v\nexec: %s", results, rsh.Stdout)
}

// filesReadHostFile (ISO-3): the files API must read inside the sandbox's root only. Its
// targets are a 0600 and a 0644 file in a 0755 directory of the test, a 0600 file in
// /var/tmp and berth dev's own admin.key, each by its host path, through symlinks to it, to
// "/" and climbing ones, and through /proc/<pid>/root and /proc/<pid>/cwd; then every
// /proc/{self,thread-self,1..4}/fd/N magic link, which on a bad runtime could name a host
// file the init holds open. No answer may carry any of the targets' contents.
func filesReadHostFile(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "shell", sandboxOpts{})
	var script strings.Builder
	script.WriteString("ln -sfn / /tmp/hostroot; ln -sfn ../../../../../../../.. /tmp/up; ln -sfn /proc/self/cwd/../../../../.. /tmp/cwdup\n")
	var paths []string
	for i, target := range d.hostTargets() {
		link := fmt.Sprintf("/tmp/link%d", i)
		fmt.Fprintf(&script, "ln -sfn '%s' %s\n", target, link)
		paths = append(paths, target, link, "/tmp/hostroot"+target, "/tmp/up"+target, "/tmp/cwdup"+target)
		for _, pid := range []string{"self", "thread-self", "1", "2", "3", "4"} {
			paths = append(paths, "/proc/"+pid+"/root"+target)
		}
		paths = append(paths, "/proc/1/cwd/../../../../.."+target, "/tmp/../.."+target) // unclean: refused
	}
	for _, pid := range []string{"self", "thread-self", "1", "2", "3", "4"} {
		for fd := range 10 {
			paths = append(paths, fmt.Sprintf("/proc/%s/fd/%d", pid, fd))
		}
		paths = append(paths, "/proc/"+pid+"/environ", "/proc/"+pid+"/cwd/admin.key")
	}
	c.mustSh(t, id, 30, script.String())

	var mu sync.Mutex
	readable := map[string]string{}
	parallelEach(paths, 4, func(p string) {
		st, body := c.get(t, id, p)
		if leaked := containsAny(body, d.secrets()...); leaked != "" {
			escaped(t, d, "GET files?path="+p+" read a host file", fmt.Sprintf("HTTP %d, body carries %q: %s", st, leaked, tail(body, 300)))
		}
		if st == 200 {
			mu.Lock()
			readable[p] = tail(body, 120)
			mu.Unlock()
		}
	})
	// A /proc/<pid>/fd/N that read at all was a magic link followed: where did it lead? The
	// init is pid 1; "self" in the files API is the init too.
	var sh strings.Builder
	var links []string
	for p := range readable {
		if strings.Contains(p, "/fd/") {
			q := strings.Replace(strings.Replace(p, "/proc/thread-self/", "/proc/1/", 1), "/proc/self/", "/proc/1/", 1)
			fmt.Fprintf(&sh, "echo \"LINK %s $(readlink %s)\"\n", p, q)
			links = append(links, p)
		}
	}
	if len(links) > 0 {
		r := c.mustSh(t, id, 30, sh.String())
		var host []string
		for _, line := range strings.Split(r.Stdout, "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "LINK" && strings.HasPrefix(f[2], "host:") {
				host = append(host, f[1]+" → "+f[2])
			}
		}
		if len(host) > 0 {
			escaped(t, d, "the files API followed /proc magic links out of the sandbox's root to host files (GET answered 200; ISO-3 says magic links are refused)",
				strings.Join(host, ", "), "\n  (on gvisor the init's fd 2 is runsc.log, a host file under the data directory; openat2 is missing there and the fallback openat follows magic links)")
		}
		t.Logf("magic links the files API read:\n%s", r.Stdout)
	}
	t.Logf("%d paths tried; readable (none carries a host secret): %q", len(paths), readable)
}

// parallelEach runs f on every item, n at a time.
func parallelEach(items []string, n int, f func(string)) {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(it)
		})
	}
	wg.Wait()
}
