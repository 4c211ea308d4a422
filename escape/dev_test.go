package escape

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/logtest"
)

// pidsLimit is the --pids-limit every berth dev of the suite runs with (attempt 08): small,
// so that forking four times past it stays quick on a 2-core host.
const pidsLimit = 128

// dev is one running `berth dev` and what the attempts need to know about it. Only the test
// reads AdminKey (to create tenants, look up agents and read back state): every attempt
// itself uses tenant keys.
type dev struct {
	Runtime  string
	Data     string // --data, absolute
	URL      string
	Port     int
	PID      int
	AdminKey string
	Tenant   [2]client // tenant 1 and tenant 2, each with its own tenant key

	// What the operator's side holds, that no sandbox may reach.
	Marker     string // BERTH_ESCAPE_MARKER in berth dev's environment
	KeyDesc    string // the session keyring's secret key: description …
	KeySecret  string // … and payload
	HostDir    string // a 0755 directory of the test's on the host
	Secret     string // path of a 0600 file in HostDir …
	SecretText string // … and its content
	Public     string // a 0644 file in HostDir …
	PublicText string
	VarTmp     string // a 0600 file in /var/tmp …
	VarTmpText string
	AgentAddrs []string // the agents' internal API addresses (host:port)

	cmd      *exec.Cmd
	exited   chan struct{}
	ptmx     *os.File // the operator's terminal, our end
	pts      *os.File // its other end, berth dev's controlling terminal
	tty      logtest.Buffer
	logPath  string
	made     idList
	stopOnce sync.Once
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// freePort returns a port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// openPTY returns a new pseudo-terminal's master and slave.
func openPTY() (*os.File, *os.File, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlockpt: %w", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("ptsname: %w", err)
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// startDev starts `berth dev` on runtime rt, makes two tenants with a tenant key each and
// returns once the server answers. Cleanup stops it (SIGTERM, then SIGKILL after a bounded
// wait) and checks that none of its sandboxes survived.
func startDev(t *testing.T, rt string) *dev {
	t.Helper()
	top, err := os.MkdirTemp("", "besc-") // short: socket paths under it must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &dev{Runtime: rt, Data: filepath.Join(top, "data"), Port: freePort(t), exited: make(chan struct{})}
	d.URL = fmt.Sprintf("http://127.0.0.1:%d", d.Port)
	d.Marker = "BEM" + randHex(12)
	d.KeyDesc = "berth-escape-" + randHex(4)
	d.KeySecret = "BERTH-ESCAPE-KEY-" + randHex(12)
	d.logPath = filepath.Join(top, "berth-dev.log")

	// Host files no sandbox may read (attempts 02, 03, 05).
	d.HostDir = filepath.Join(top, "host")
	if err := os.Mkdir(d.HostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d.Secret, d.SecretText = filepath.Join(d.HostDir, "secret.txt"), "BERTH-ESCAPE-SECRET-"+randHex(12)
	d.Public, d.PublicText = filepath.Join(d.HostDir, "public.txt"), "BERTH-ESCAPE-PUBLIC-"+randHex(12)
	d.VarTmp, d.VarTmpText = "/var/tmp/berth-escape-"+randHex(6)+"-secret.txt", "BERTH-ESCAPE-VARTMP-"+randHex(12)
	for _, f := range []struct {
		path, text string
		mode       os.FileMode
	}{{d.Secret, d.SecretText, 0o600}, {d.Public, d.PublicText, 0o644}, {d.VarTmp, d.VarTmpText, 0o600}} {
		if err := os.WriteFile(f.path, []byte(f.text), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f.path, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Remove(d.VarTmp) })

	var errPTY error
	d.ptmx, d.pts, errPTY = openPTY()
	if errPTY != nil {
		t.Fatalf("pseudo-terminal: %v", errPTY)
	}
	go io.Copy(&d.tty, d.ptmx) // anything written to or echoed by the operator's terminal

	logf, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"dev", "--data", d.Data, "--listen", fmt.Sprintf("127.0.0.1:%d", d.Port),
		"--runtime", rt, "--agents", "2", "--pids-limit", strconv.Itoa(pidsLimit)}
	d.cmd = exec.Command(self, args...)
	d.cmd.Env = append(os.Environ(), launcherEnv+"=1", launcherBinEnv+"="+berthBin,
		keyringEnv+"=berth-escape-session", keyDescEnv+"="+d.KeyDesc, keySecretEnv+"="+d.KeySecret,
		markerEnvName+"="+d.Marker)
	d.cmd.Stdin, d.cmd.Stdout, d.cmd.Stderr = d.pts, logf, logf
	// A session of its own whose controlling terminal is the pseudo-terminal: berth dev in
	// an operator's terminal.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start berth dev: %v", err)
	}
	d.PID = d.cmd.Process.Pid
	go func() { d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.stop(t) })
	t.Logf("%s: berth dev pid %d, %s, data %s", rt, d.PID, d.URL, d.Data)

	// Up: admin.key written and /healthz answering (bounded).
	deadline := time.Now().Add(120 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(d.Data, "admin.key")); err == nil && len(bytes.TrimSpace(b)) > 0 {
			if resp, err := http.Get(d.URL + "/healthz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 && strings.Contains(d.log(), "Berth dev is up") {
					d.AdminKey = strings.TrimSpace(string(b))
					break
				}
			}
		}
		select {
		case <-d.exited:
			t.Fatalf("berth dev --runtime %s exited before it was up:\n%s", rt, tail(d.log(), 3000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("berth dev --runtime %s not up within 120 s:\n%s", rt, tail(d.log(), 3000))
		}
		time.Sleep(100 * time.Millisecond) // real: a real berth dev process coming up
	}

	admin := client{url: d.URL, key: d.AdminKey}
	for i := range 2 {
		name := fmt.Sprintf("esc%d", i+1)
		if st, body := admin.call(t, "POST", "/v1/tenants", map[string]string{"name": name}); st != 201 {
			t.Fatalf("create tenant %s: %d %s", name, st, body)
		}
		st, body := admin.call(t, "POST", "/v1/tenants/"+name+"/keys", map[string]string{"role": "tenant"})
		var k struct{ Key, Role string }
		if st != 201 || json.Unmarshal(body, &k) != nil || k.Key == "" || k.Role != "tenant" {
			t.Fatalf("create a tenant key for %s: %d %s", name, st, body)
		}
		d.Tenant[i] = client{url: d.URL, key: k.Key, tenant: name, made: &d.made}
	}
	var agents struct {
		Agents []struct {
			AgentID string `json:"agent_id"`
			Address string `json:"address"`
		} `json:"agents"`
	}
	if st, body := admin.call(t, "GET", "/v1/agents", nil); st == 200 && json.Unmarshal(body, &agents) == nil {
		for _, a := range agents.Agents {
			if host := strings.TrimPrefix(strings.TrimPrefix(a.Address, "http://"), "https://"); host != "" {
				d.AgentAddrs = append(d.AgentAddrs, strings.TrimSuffix(host, "/"))
			}
		}
	}
	return d
}

func (d *dev) log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// alive reports whether berth dev still runs and answers /healthz.
func (d *dev) alive() error {
	select {
	case <-d.exited:
		return fmt.Errorf("berth dev (pid %d) has exited: %v", d.PID, d.cmd.ProcessState)
	default:
	}
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(d.URL + "/healthz")
	if err != nil {
		return fmt.Errorf("berth dev does not answer /healthz: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("berth dev /healthz: %d", resp.StatusCode)
	}
	return nil
}

// stop ends berth dev: SIGTERM to its pid, SIGKILL after 60 s, then checks that no sandbox of
// it survived. It runs in cleanup, whatever the tests did.
func (d *dev) stop(t *testing.T) {
	d.stopOnce.Do(func() {
		if d.cmd.Process != nil {
			d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.exited:
			case <-time.After(60 * time.Second):
				t.Errorf("%s: berth dev (pid %d) did not stop within 60 s of SIGTERM: killed", d.Runtime, d.PID)
				d.cmd.Process.Kill()
				select {
				case <-d.exited:
				case <-time.After(10 * time.Second):
					t.Errorf("%s: berth dev (pid %d) survived SIGKILL for 10 s", d.Runtime, d.PID)
				}
			}
		}
		d.ptmx.Close()
		d.pts.Close()
		d.checkNoLeftovers(t)
	})
}

// checkNoLeftovers fails the test if a sandbox of this berth dev outlived it, and removes it.
func (d *dev) checkNoLeftovers(t *testing.T) {
	// No cgroup of any sandbox it ran may remain on the host.
	for _, id := range d.made.all() {
		for _, pat := range []string{"/sys/fs/cgroup/*/*/*/" + id, "/sys/fs/cgroup/*/*/" + id} {
			if m, _ := filepath.Glob(pat); len(m) > 0 {
				t.Errorf("%s: sandbox %s's cgroups outlived berth dev: %v", d.Runtime, id, m)
			}
		}
	}
	switch d.Runtime {
	case "gvisor":
		states, _ := filepath.Glob(filepath.Join(d.Data, "agents", "*", "state"))
		for _, st := range states {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			out, err := exec.CommandContext(ctx, "runsc", "--root", st, "list", "-quiet").CombinedOutput()
			cancel()
			if err != nil {
				t.Errorf("gvisor: runsc --root %s list: %v: %s", st, err, out)
				continue
			}
			if ids := strings.Fields(string(out)); len(ids) > 0 {
				t.Errorf("gvisor: sandboxes survived berth dev: runsc --root %s list shows %v", st, ids)
				for _, id := range ids {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					exec.CommandContext(ctx, "runsc", "--root", st, "delete", "--force", id).Run()
					cancel()
				}
			}
		}
	case "process":
		// Every init carries -dir=<data>/agents/<agent>/<id> on its command line.
		deadline := time.Now().Add(10 * time.Second)
		for {
			left := procsMentioning(d.Data)
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("process: sandbox processes survived berth dev: %v", left)
				for pid := range left {
					syscall.Kill(pid, syscall.SIGKILL) // inits of our own berth dev, by pid
				}
				return
			}
			time.Sleep(200 * time.Millisecond) // real: sandbox processes exiting after berth dev stops
		}
	}
}

// procsMentioning returns the host processes whose command line contains s.
func procsMentioning(s string) map[int]string {
	found := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if cmd := strings.ReplaceAll(string(b), "\x00", " "); strings.Contains(cmd, s) {
			found[pid] = cmd
		}
	}
	return found
}

// dirSizes returns the size of every regular file under root.
func dirSizes(root string) map[string]int64 {
	sizes := map[string]int64{}
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if e.Type().IsRegular() {
			if info, err := e.Info(); err == nil {
				sizes[p] = info.Size()
			}
		}
		return nil
	})
	return sizes
}

// grown lists the files under root that grew by more than min bytes since before.
func grown(before map[string]int64, root string, min int64) []string {
	var out []string
	for p, n := range dirSizes(root) {
		if n-before[p] > min {
			out = append(out, fmt.Sprintf("%s (+%d MiB)", p, (n-before[p])>>20))
		}
	}
	return out
}

// freeBytes is the free space of the file system holding path.
func freeBytes(path string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * st.Bsize
}

// sandboxHostDirs are the host directories of a sandbox's runtime state under berth dev's
// data directory: its OCI bundle (gvisor) or its directory (process).
func (d *dev) sandboxHostDirs(id string) []string {
	var dirs []string
	for _, pat := range []string{filepath.Join(d.Data, "agents", "*", "bundles", id), filepath.Join(d.Data, "agents", "*", id)} {
		m, _ := filepath.Glob(pat)
		dirs = append(dirs, m...)
	}
	return dirs
}

// cgroupDir finds a sandbox's host cgroup directory of controller ("memory", "pids"), waiting
// (bounded) for it to appear. "" when there is none.
func cgroupDir(id, controller string) string {
	pats := []string{
		filepath.Join("/sys/fs/cgroup", controller, "*", "*", id), // v1: <mount>/<parent>/<instance>/<id>
		filepath.Join("/sys/fs/cgroup", "*", "*", id),             // v2
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, p := range pats {
			if m, _ := filepath.Glob(p); len(m) > 0 {
				return m[0]
			}
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(100 * time.Millisecond) // real: a kernel cgroup directory appearing
	}
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// client talks to the API with one key.
type client struct {
	url, key string
	tenant   string
	made     *idList // every sandbox created through it, for the leftover check
}

// idList is a list of sandbox ids safe for concurrent use.
type idList struct {
	mu  sync.Mutex
	ids []string
}

func (l *idList) add(id string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.ids = append(l.ids, id)
	l.mu.Unlock()
}

func (l *idList) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ids...)
}

var httpClient = &http.Client{Timeout: 150 * time.Second}

// raw sends one request; body is JSON-encoded unless it is a []byte.
func (c client) raw(method, path string, body any) (int, []byte, error) {
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, c.url+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 80<<20))
	return resp.StatusCode, data, err
}

// call is raw that fails the test on a transport error.
func (c client) call(t *testing.T, method, path string, body any) (int, []byte) {
	t.Helper()
	st, data, err := c.raw(method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return st, data
}

// errCode is the "code" of an error body.
func errCode(body []byte) string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	json.Unmarshal(body, &e)
	return e.Error.Code
}

// sandboxOpts are the optional fields of a create.
type sandboxOpts struct {
	MemoryMiB int
	Volume    string
}

// create makes a sandbox of template and returns its id; it retries refusals (503) for up to
// 60 s and deletes the sandbox when the test ends.
func (c client) create(t *testing.T, template string, o sandboxOpts) string {
	t.Helper()
	req := map[string]any{"template": template}
	if o.MemoryMiB > 0 {
		req["memory_mb"] = o.MemoryMiB
	}
	if o.Volume != "" {
		req["volume"] = o.Volume
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, body := c.call(t, "POST", "/v1/sandboxes", req)
		if st == 201 {
			var sb struct{ ID, State string }
			if err := json.Unmarshal(body, &sb); err != nil || sb.ID == "" {
				t.Fatalf("create %s: %s", template, body)
			}
			c.made.add(sb.ID)
			t.Cleanup(func() { c.raw("DELETE", "/v1/sandboxes/"+sb.ID, nil) })
			return sb.ID
		}
		if st != 503 || time.Now().After(deadline) {
			t.Fatalf("create %v: %d %s", req, st, body)
		}
		time.Sleep(time.Second) // real: a real berth dev answering 503 until it has room
	}
}

// execResult is the answer of POST /exec: Status is the HTTP status; Code the error code of
// a non-200 answer.
type execResult struct {
	Status   int
	Code     string
	Body     string
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

func (r execResult) ok() bool { return r.Status == 200 }

func (r execResult) String() string {
	if r.Status != 200 {
		return fmt.Sprintf("HTTP %d %s", r.Status, tail(r.Body, 2000))
	}
	return fmt.Sprintf("exit %d\nstdout: %s\nstderr: %s", r.ExitCode, tail(r.Stdout, 6000), tail(r.Stderr, 2000))
}

// exec runs argv in sandbox id.
func (c client) exec(t *testing.T, id string, timeoutS int, stdin string, argv ...string) execResult {
	t.Helper()
	req := map[string]any{"cmd": argv, "timeout_s": timeoutS}
	if stdin != "" {
		req["stdin"] = stdin
	}
	st, body := c.call(t, "POST", "/v1/sandboxes/"+id+"/exec", req)
	r := execResult{Status: st, Body: string(body)}
	if st == 200 {
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatalf("exec answer: %v: %s", err, body)
		}
	} else {
		r.Code = errCode(body)
	}
	return r
}

// sh runs a shell script in sandbox id.
func (c client) sh(t *testing.T, id string, timeoutS int, script string) execResult {
	t.Helper()
	return c.exec(t, id, timeoutS, "", "sh", "-c", script)
}

// py runs a Python program (from stdin) in sandbox id; params reach it as the dict P.
func (c client) py(t *testing.T, id string, timeoutS int, params any, program string) execResult {
	t.Helper()
	j, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	prelude := fmt.Sprintf("import json\nP = json.loads(%s)\n", pyString(string(j)))
	return c.exec(t, id, timeoutS, prelude+program, "python3", "-u", "-")
}

// pyString quotes s as a Python string literal (s is JSON: printable, escapes already).
func pyString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// mustExec runs script and fails the test (fatally) unless the call itself worked: an
// attempt that could not run proves nothing.
func (c client) mustSh(t *testing.T, id string, timeoutS int, script string) execResult {
	t.Helper()
	r := c.sh(t, id, timeoutS, script)
	if !r.ok() {
		t.Fatalf("could not run the attempt (so it proves nothing): %q: %s", script, r)
	}
	return r
}

func (c client) mustPy(t *testing.T, id string, timeoutS int, params any, program string) execResult {
	t.Helper()
	r := c.py(t, id, timeoutS, params, program)
	if !r.ok() || !strings.Contains(r.Stdout, "PROBE-DONE") {
		t.Fatalf("could not run the attempt to its end (so it proves nothing): %s", r)
	}
	return r
}

// put writes a file through the files API. A transport error is status 0 with the error as
// the body. Safe from any goroutine.
func (c client) put(t *testing.T, id, path string, content []byte) (int, string) {
	st, body, err := c.raw("PUT", "/v1/sandboxes/"+id+"/files?path="+urlQuery(path), content)
	if err != nil {
		return 0, "transport error: " + err.Error()
	}
	return st, string(body)
}

// get reads a file through the files API; see put.
func (c client) get(t *testing.T, id, path string) (int, string) {
	st, body, err := c.raw("GET", "/v1/sandboxes/"+id+"/files?path="+urlQuery(path), nil)
	if err != nil {
		return 0, "transport error: " + err.Error()
	}
	return st, string(body)
}

func urlQuery(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.~/", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// state returns a sandbox's state as the server sees it (admin key).
func (d *dev) state(t *testing.T, id string) string {
	t.Helper()
	st, body := client{url: d.URL, key: d.AdminKey}.call(t, "GET", "/v1/sandboxes/"+id, nil)
	var sb struct{ State string }
	if st != 200 || json.Unmarshal(body, &sb) != nil {
		return fmt.Sprintf("unknown (%d %s)", st, body)
	}
	return sb.State
}
