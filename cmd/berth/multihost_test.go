package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/process"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/server"
	"github.com/berth-dev/berth/store/sqlite"
)

// The README's multi-host section, walked as written (issue 13): its fenced sh block is
// read from README.md, its placeholders replaced only as its prose says, and its lines run
// through sh with bin/berth played by this test binary (TestMain runs Main under envRunMain).

// readmeStep is one command line of the section's sh block: the role whose comment header
// it sits under ("once", "replica", "host", "cli"), the command with its continuation lines
// joined, and its trailing comment.
type readmeStep struct {
	role, cmd, comment string
}

// readmeSection returns the text of the README section titled title, up to the next "## ".
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\n## "+title+"\n")
	if start < 0 {
		t.Fatalf("README.md has no section %q", title)
	}
	s = s[start+1:]
	if end := strings.Index(s[3:], "\n## "); end >= 0 {
		s = s[:end+4]
	}
	return s
}

// readmeSteps parses the section's first ```sh block into steps. A comment line opens a role
// by how it begins: "# Once", "# On each replica", "# On each host", "# Where you run the CLI".
func readmeSteps(t *testing.T, section string) []readmeStep {
	t.Helper()
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal("the section has no ```sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	var steps []readmeStep
	role, pending := "", ""
	for _, line := range strings.Split(block, "\n") {
		if c, ok := strings.CutSuffix(line, `\`); ok {
			pending += c
			continue
		}
		line, pending = strings.TrimSpace(pending+line), ""
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"):
			switch h := strings.ToLower(line); {
			case strings.HasPrefix(h, "# once"):
				role = "once"
			case strings.HasPrefix(h, "# on each replica"):
				role = "replica"
			case strings.HasPrefix(h, "# on each host"):
				role = "host"
			case strings.HasPrefix(h, "# where you run the cli"):
				role = "cli"
			default:
				t.Fatalf("a comment line the test cannot place: %q", line)
			}
		default:
			cmd, comment, _ := strings.Cut(line, " # ")
			if role == "" {
				t.Fatalf("a command before any role comment: %q", line)
			}
			steps = append(steps, readmeStep{role: role, cmd: strings.TrimSpace(cmd), comment: strings.TrimSpace(comment)})
		}
	}
	return steps
}

// freePort returns a port that was free on 127.0.0.1 a moment ago (the README's commands
// take fixed ports).
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

// shell runs line with sh in env and returns its stdout; a failure ends the test.
func shell(t *testing.T, env []string, line string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", line, err, out.String(), errb.String())
	}
	return out.String()
}

// shellEnv runs an export line with sh in env and returns the environment it leaves.
func shellEnv(t *testing.T, env []string, line string) []string {
	t.Helper()
	out := shell(t, env, line+"\nenv -0")
	var next []string
	for kv := range strings.SplitSeq(out, "\x00") {
		if strings.Contains(kv, "=") {
			next = append(next, kv)
		}
	}
	return next
}

// startLong starts line with `sh -c "exec …"` (so the PID is berth's own) and stops it by
// that PID when the test ends: SIGTERM, as an operator would, then SIGKILL after 60 s.
// Its stderr goes to logFile (shown when the test fails); it returns a reader of its stdout.
func startLong(t *testing.T, env []string, line, logFile string) *bufio.Reader {
	t.Helper()
	cmd := exec.Command("sh", "-c", "exec "+line)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // by the PID this test started
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("last log of %q:\n%s", line, b)
		}
	})
	return bufio.NewReader(out)
}

// TestREADME_ManyReplicasOnPostgreSQL walks README's "Many replicas on PostgreSQL" on one
// machine: two replicas on one PostgreSQL and two agents, each started with the README's own
// line as a separate "machine" (its own XDG_STATE_HOME and ports, as the section says for
// trying it on one machine), then the README's CLI lines through each replica until a
// create has landed on each agent (issue 13).
func TestREADME_ManyReplicasOnPostgreSQL(t *testing.T) {
	section := readmeSection(t, "Many replicas on PostgreSQL")
	// The only replacements the test makes; each must be one the section tells a user.
	for _, told := range []string{"Replace `postgres://berth@db.internal/berth`", "`replica-1`", "`host-1`", "`7070`/`7071`",
		"`/shared/snapshots` is a directory", "instead of `0.0.0.0`", "XDG_STATE_HOME", "`127.0.0.1` for every name",
		"`--runtime process` asks for the process", "`--insecure` lets it run without root"} {
		if !strings.Contains(strings.Join(strings.Fields(section), " "), told) {
			t.Fatalf("the section does not tell the user %q, which this test relies on", told)
		}
	}
	steps := readmeSteps(t, section)
	if _, err := exec.LookPath("openssl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the README's lines need openssl: %v", err)
		}
		t.Skipf("the README's lines need openssl: %v", err)
	}
	db := pgtest.Start(t).NewDatabase(t)
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	snapshots := filepath.Join(root, "shared-snapshots")
	var base []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BERTH_") && !strings.HasPrefix(kv, "XDG_STATE_HOME=") {
			base = append(base, kv)
		}
	}
	base = append(base, envRunMain+"=1")
	machineEnv := func(name string) []string {
		return append(append([]string(nil), base...), "XDG_STATE_HOME="+filepath.Join(root, name))
	}
	secrets := map[string]string{} // "<the node token>" → its value
	replicaPorts := []string{freePort(t), freePort(t)}
	agentPorts := []string{freePort(t), freePort(t)}
	subst := func(line string, replica, host int) string {
		r := strings.NewReplacer(
			"bin/berth", bin,
			"postgres://berth@db.internal/berth", "'"+db+"'",
			"/shared/snapshots", snapshots,
			"0.0.0.0:7070", "127.0.0.1:"+replicaPorts[replica],
			"replica-1:7070", "127.0.0.1:"+replicaPorts[replica],
			"0.0.0.0:7071", "127.0.0.1:"+agentPorts[host],
			"host-1:7071", "127.0.0.1:"+agentPorts[host])
		line = r.Replace(line)
		for k, v := range secrets {
			line = strings.ReplaceAll(line, k, v)
		}
		for _, left := range []string{"replica-", "host-", "db.internal", "/shared/", "0.0.0.0", "<", ">"} {
			if strings.Contains(line, left) {
				t.Fatalf("a placeholder the test does not know (%q) in %q", left, line)
			}
		}
		return line
	}
	byRole := map[string][]readmeStep{}
	for _, s := range steps {
		byRole[s.role] = append(byRole[s.role], s)
	}
	for _, role := range []string{"once", "replica", "host", "cli"} {
		if len(byRole[role]) == 0 {
			t.Fatalf("the block has no %s lines: %+v", role, steps)
		}
	}

	// Once: the secrets, named by their comments.
	for _, s := range byRole["once"] {
		v := strings.TrimSpace(shell(t, base, subst(s.cmd, 0, 0)))
		if v == "" || s.comment == "" {
			t.Fatalf("once: %q printed %q (comment %q)", s.cmd, v, s.comment)
		}
		secrets["<"+s.comment+">"] = v
	}

	// Each replica: its exports, then its long-running command.
	var replicaURLs []string
	for i := range 2 {
		env := machineEnv(fmt.Sprintf("replica-%d", i+1))
		started := false
		for _, s := range byRole["replica"] {
			line := subst(s.cmd, i, 0)
			if strings.HasPrefix(s.cmd, "export ") {
				env = shellEnv(t, env, line)
				continue
			}
			if !strings.HasPrefix(s.cmd, "bin/berth server ") {
				t.Fatalf("a replica line the test cannot run: %q", s.cmd)
			}
			out := startLong(t, env, line, filepath.Join(root, fmt.Sprintf("replica-%d.log", i+1)))
			first, err := out.ReadString('\n')
			if err != nil {
				t.Fatalf("replica %d said nothing: %v", i+1, err)
			}
			want := "Berth server at http://127.0.0.1:" + replicaPorts[i] + " (admin key from BERTH_ADMIN_KEY)"
			if strings.TrimSpace(first) != want {
				t.Fatalf("replica %d's first line: %q, want %q", i+1, first, want)
			}
			go func() { _, _ = io.Copy(io.Discard, out) }()
			replicaURLs = append(replicaURLs, "http://127.0.0.1:"+replicaPorts[i])
			started = true
		}
		if !started {
			t.Fatal("no `bin/berth server` line for the replicas")
		}
	}
	adminKey := secrets["<the admin key>"]
	if adminKey == "" {
		t.Fatalf("no admin key among the secrets %v", secrets)
	}
	admin := client.New(replicaURLs[0], adminKey)

	// Each host: its exports, then its agent line, host i joining through replica i, with the
	// runtime flags the section names.
	extra := " --runtime process"
	if os.Geteuid() != 0 {
		extra += " --insecure"
	}
	var agentDirs []string
	for i := range 2 {
		name := fmt.Sprintf("host-%d", i+1)
		env := machineEnv(name)
		for _, s := range byRole["host"] {
			line := subst(s.cmd, i, i)
			if strings.HasPrefix(s.cmd, "export ") {
				env = shellEnv(t, env, line)
				continue
			}
			if !strings.HasPrefix(s.cmd, "bin/berth agent ") {
				t.Fatalf("a host line the test cannot run: %q", s.cmd)
			}
			dir := filepath.Join(root, name, "berth", "agent")
			agentDirs = append(agentDirs, dir)
			t.Cleanup(func() {
				// After the agent stopped (cleanups run last-in first-out): a runtime on its
				// directory removes anything a killed agent left, as a restarted one would.
				if rt, err := process.New(process.Config{Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Insecure: os.Geteuid() != 0}); err == nil {
					_ = rt.Close()
				}
			})
			out := startLong(t, env, line+extra, filepath.Join(root, name+".log"))
			go func() { _, _ = io.Copy(io.Discard, out) }()
		}
	}
	if len(agentDirs) != 2 {
		t.Fatalf("%d agent lines run, want one per host", len(agentDirs))
	}

	ctx := context.Background()
	var agents []berth.Agent
	waitFor(t, 60*time.Second, "both agents registered", func() (bool, string) {
		as, err := admin.Agents(ctx)
		agents = as
		return err == nil && len(as) == 2, fmt.Sprintf("%d agents, %v", len(as), err)
	})
	host, _ := os.Hostname()
	addrs := map[string]bool{}
	for _, a := range agents {
		addrs[a.Address] = true
		if !strings.HasPrefix(a.AgentID, host+"-") {
			t.Errorf("agent id %q, want %s-<hash of its --dir>", a.AgentID, host)
		}
	}
	for _, p := range agentPorts {
		if !addrs["http://127.0.0.1:"+p] {
			t.Errorf("no agent advertises http://127.0.0.1:%s (the README's --advertise); addresses %v", p, addrs)
		}
	}
	if agents[0].AgentID == agents[1].AgentID {
		t.Fatalf("both agents are %q", agents[0].AgentID)
	}

	// Where the CLI runs: the README's lines through replica 1, then 2, … until a create has
	// landed on each agent (at most 10 creates).
	landed := map[string]string{} // agent id → a sandbox there
	var created []string
	t.Cleanup(func() {
		for _, id := range created {
			_ = admin.DeleteSandbox(context.Background(), id)
		}
	})
	for attempt := 0; attempt < 10 && len(landed) < 2; attempt++ {
		replica := attempt % 2
		env := machineEnv("cli")
		for _, s := range byRole["cli"] {
			line := subst(s.cmd, replica, 0)
			switch {
			case strings.HasPrefix(s.cmd, "export "):
				env = shellEnv(t, env, line)
			case strings.HasPrefix(s.cmd, "bin/berth agents list"):
				out := shell(t, env, line)
				for _, a := range agents {
					if !strings.Contains(out, a.AgentID) {
						t.Fatalf("%q through replica %d does not list %s:\n%s", s.cmd, replica+1, a.AgentID, out)
					}
				}
			case strings.HasPrefix(s.cmd, "bin/berth sandbox create"):
				id := strings.TrimSpace(shell(t, env, line))
				created = append(created, id)
				sb, err := admin.Sandbox(ctx, id)
				if err != nil {
					t.Fatalf("sandbox %q printed by %q: %v", id, s.cmd, err)
				}
				landed[sb.AgentID] = id
			default:
				t.Fatalf("a CLI line the test cannot check: %q", s.cmd)
			}
		}
	}
	if len(landed) != 2 {
		t.Fatalf("after %d creates through both replicas the sandboxes landed on %d agent(s): %v; want each of the 2 agents",
			len(created), len(landed), landed)
	}
	t.Logf("%d creates through the README's CLI lines; one landed on each agent: %v", len(created), landed)
}

// agentMain runs `berth agent` with args in this process, bounded: a refusal returns at
// once; an agent that starts instead runs until the bound and returns nil.
func agentMain(t *testing.T, args ...string) error {
	t.Helper()
	t.Setenv("BERTH_NODE_TOKEN", server.NewKeySecret())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args = append([]string{"agent", "--dir", t.TempDir(), "--volume-dir", t.TempDir(), "--runtime", "process"}, args...)
	if os.Geteuid() != 0 {
		args = append(args, "--insecure")
	}
	return Main(ctx, args, strings.NewReader(""), io.Discard, io.Discard)
}

// TestAgentRefusesLoopbackAdvertiseToRemoteServer: an agent whose --server is another
// machine and whose advertised address is loopback or a wildcard exits 2 (invalid_request)
// before starting, naming --advertise; so does a routable --advertise over a loopback
// --listen; every address a server can reach starts (issue 13).
func TestAgentRefusesLoopbackAdvertiseToRemoteServer(t *testing.T) {
	err := agentMain(t, "--server", "http://10.1.2.3:7070")
	if exitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), "--advertise") {
		t.Fatalf("agent with the default --listen 127.0.0.1:0 toward http://10.1.2.3:7070: %v (exit %d), want exit 2 naming --advertise", err, exitCode(err))
	}
	for _, c := range []struct {
		server, listen, advertise string
		ok                        bool
	}{
		{"http://replica-1:7070", "127.0.0.1:0", "", false},
		{"http://replica-1:7070", "0.0.0.0:7071", "", false},
		{"http://replica-1:7070", ":7071", "", false},
		{"http://replica-1:7070", "0.0.0.0:7071", "localhost:7071", false},
		{"http://replica-1:7070", "0.0.0.0:7071", "127.0.0.2:7071", false},
		{"http://replica-1:7070", "0.0.0.0:7071", "[::1]:7071", false},
		{"http://replica-1:7070", "0.0.0.0:7071", "0.0.0.0:7071", false},
		{"http://10.0.0.1:7070", "127.0.0.1:7071", "host-1:7071", false}, // listens on loopback only
		{"http://replica-1:7070", "0.0.0.0:7071", "http://host-1:7071", false},
		{"http://replica-1:7070", "0.0.0.0:7071", "host-1:99999", false},
		{"replica-1:7070", "0.0.0.0:7071", "host-1:7071", false}, // no scheme
		{"http://replica-1:7070", "0.0.0.0:7071", "host-1:7071", true},
		{"http://replica-1:7070", "0.0.0.0:0", "host-1", true},
		{"http://replica-1:7070", "10.0.0.5:7071", "", true},
		{"https://replica-1", "[::]:7071", "[2001:db8::5]:7071", true},
		{"http://127.0.0.1:7070", "127.0.0.1:0", "", true}, // one machine: loopback is fine
		{"http://localhost:7070", "0.0.0.0:7071", "", true},
	} {
		err := checkAgentReach(c.server, c.listen, c.advertise)
		if (err == nil) != c.ok || err != nil && berth.ErrorCode(err) != berth.EInvalidRequest {
			t.Errorf("server %s, --listen %s, --advertise %q: %v, want ok=%v (or invalid_request)", c.server, c.listen, c.advertise, err, c.ok)
		}
	}
}

// TestAgentRefusesHeadroomAtLeastBudget: --headroom-mb at or above the memory budget would
// leave 0 MiB admittable for ever; the agent exits 2 saying both numbers (issue 13).
func TestAgentRefusesHeadroomAtLeastBudget(t *testing.T) {
	for _, c := range []struct{ memory, headroom string }{{"512", "512"}, {"512", "4096"}, {"512", "-1"}} {
		err := agentMain(t, "--server", "http://127.0.0.1:9", "--memory-mb", c.memory, "--headroom-mb", c.headroom)
		msg := fmt.Sprint(err)
		if exitCode(err) != 2 || !strings.Contains(msg, "headroom "+c.headroom+" MiB") || !strings.Contains(msg, c.memory+" MiB") {
			t.Fatalf("--memory-mb %s --headroom-mb %s: %v (exit %d), want exit 2 naming both in MiB", c.memory, c.headroom, err, exitCode(err))
		}
	}
}

// TestAgentIDDefault: the default --id differs for two agents on one host (different
// --dir), is the same for one agent across restarts (the same --dir, however spelt), and a
// second agent on a --dir in use refuses to start (issue 13).
func TestAgentIDDefault(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	idA, errA := defaultAgentID("node7", a)
	idB, errB := defaultAgentID("node7", b)
	again, errC := defaultAgentID("node7", a+"/./")
	if errA != nil || errB != nil || errC != nil {
		t.Fatal(errA, errB, errC)
	}
	if idA == idB || !strings.HasPrefix(idA, "node7-") || !strings.HasPrefix(idB, "node7-") {
		t.Fatalf("two agents on node7: %q and %q, want two distinct node7-<hash> ids", idA, idB)
	}
	if again != idA {
		t.Fatalf("the same --dir gave %q, then %q", idA, again)
	}
	release, err := lockAgentDir(a)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := lockAgentDir(a); berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(err.Error(), strconv.Itoa(os.Getpid())) {
		t.Fatalf("a second agent on %s: %v, want invalid_request naming pid %d", a, err, os.Getpid())
	}
	if r, err := lockAgentDir(b); err != nil {
		t.Fatalf("an agent on another --dir: %v", err)
	} else {
		r()
	}
}

// TestServerAdminKeyFromEnv: BERTH_ADMIN_KEY becomes a valid admin key of the store (the
// same on every replica); a short one is refused with invalid_request (issue 13).
func TestServerAdminKeyFromEnv(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := serverAdminKey(ctx, st, "short", filepath.Join(t.TempDir(), "admin.key")); berth.ErrorCode(err) != berth.EInvalidRequest {
		t.Fatalf("a 5-character BERTH_ADMIN_KEY: %v, want invalid_request", err)
	}
	key := strings.Repeat("ab", 32)
	path := filepath.Join(t.TempDir(), "admin.key")
	for range 2 { // a second replica with the same key
		at, err := serverAdminKey(ctx, st, key, path)
		if err != nil || at != "from BERTH_ADMIN_KEY" {
			t.Fatalf("serverAdminKey: %q, %v", at, err)
		}
	}
	k, err := st.APIKeyByHash(ctx, server.HashKey(key))
	if err != nil || k.Role != berth.RoleAdmin {
		t.Fatalf("the key in the store: %+v, %v; want an admin key", k, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a key from the environment was written to %s (%v)", path, err)
	}
}
