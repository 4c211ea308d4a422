package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/preempt"
)

// startCounter starts a counter in sandbox id that writes its value to /tmp/counter about
// ten times a second and keeps it in memory (a shell variable): a restore that did not keep
// the process's memory would start again from zero.
func startCounter(t *testing.T, c *client.Client, id string) {
	t.Helper()
	res, err := c.Exec(context.Background(), id, berth.ExecRequest{Cmd: []string{"sh", "-c",
		// Each value is written beside and renamed over: a read never sees a truncated file.
		`nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done' >/dev/null 2>&1 &`}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start the counter: %+v, %v", res, err)
	}
}

// readCounter reads the counter of sandbox id.
func readCounter(c *client.Client, id string) (int, error) {
	b, err := c.ReadFile(context.Background(), id, "/tmp/counter")
	if err != nil {
		return 0, fmt.Errorf("read the counter of %s: %w", id, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("counter of %s is %q", id, b)
	}
	return n, nil
}

// counter reads the counter of sandbox id, which must be there.
func counter(t *testing.T, c *client.Client, id string) int {
	t.Helper()
	n, err := readCounter(c, id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitCounterPast waits until sandbox id's counter is past n. Its first value may not be
// written yet (a loaded machine starts the background loop late): not_found is waited out.
func waitCounterPast(t *testing.T, c *client.Client, id string, n int) int {
	t.Helper()
	var got int
	waitFor(t, 30*time.Second, fmt.Sprintf("the counter of %s past %d", id, n), func() (bool, string) {
		v, err := readCounter(c, id)
		if berth.ErrorCode(err) == berth.ENotFound {
			return false, err.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
		got = v
		return got > n, strconv.Itoa(got)
	})
	return got
}

// TestE2E_GVisorREADME is the README's "First sandbox" and "First app" on `berth dev`'s
// default runtime where runsc is installed, through the CLI as a new user types them.
func TestE2E_GVisorREADME(t *testing.T) {
	st := bootGVisor(t, func(c *devConfig) { c.Agents = 2 })
	id, err := berthCLI(t, st, "", "sandbox", "create", "-q", "python")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id = strings.TrimSpace(id)
	if out, err := berthCLI(t, st, "", "sandbox", "exec", id, "--", "python3", "-c", "print(2+2)"); err != nil || out != "4\n" {
		t.Fatalf("exec = %q, %v; want 4", out, err)
	}
	if _, err := berthCLI(t, st, "hello from berth\n", "sandbox", "write", id, "/tmp/hello.txt"); err != nil {
		t.Fatalf("write: %v", err)
	}
	if out, err := berthCLI(t, st, "", "sandbox", "read", id, "/tmp/hello.txt"); err != nil || out != "hello from berth\n" {
		t.Fatalf("read = %q, %v", out, err)
	}
	if a := agentByID(t, adminClient(st), mustSandbox(t, st, id).AgentID); a.Runtime != "gvisor" || !a.Checkpoint {
		t.Fatalf("agent %s runs %q (checkpoint %t); want gvisor with checkpoints", a.AgentID, a.Runtime, a.Checkpoint)
	}
	if _, err := berthCLI(t, st, "", "sandbox", "kill", id); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if sb := mustSandbox(t, st, id); sb.State != berth.SandboxStopped {
		t.Fatalf("after kill: %s", sb.State)
	}

	page := filepath.Join(t.TempDir(), "index.html")
	os.WriteFile(page, []byte("hello from an app\n"), 0o644)
	if _, err := berthCLI(t, st, "", "apps", "create", "hello", "--template", "python", "--port", "8080", "--idle", "60",
		"--file", "index.html="+page, "--", "python3", "-m", "http.server", "8080", "--bind", "127.0.0.1"); err != nil {
		t.Fatalf("apps create: %v", err)
	}
	waitFor(t, 60*time.Second, "the app serving", func() (bool, string) {
		body, code := get(t, st.URL+"/apps/hello/")
		return code == 200 && body == "hello from an app\n", fmt.Sprint(code, body)
	})
	os.WriteFile(page, []byte("version two\n"), 0o644)
	if _, err := berthCLI(t, st, "", "apps", "deploy", "hello", "--file", "index.html="+page); err != nil {
		t.Fatalf("deploy: %v", err)
	}
	waitFor(t, 60*time.Second, "version two serving", func() (bool, string) {
		body, code := get(t, st.URL+"/apps/hello/")
		return code == 200 && body == "version two\n", fmt.Sprint(code, body)
	})
	if _, err := berthCLI(t, st, "", "apps", "delete", "hello"); err != nil {
		t.Fatalf("apps delete: %v", err)
	}
}

func mustSandbox(t *testing.T, st *devStack, id string) berth.Sandbox {
	t.Helper()
	sb, err := adminClient(st).Sandbox(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return sb
}

func get(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return err.Error(), 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// TestPAUSE1_ResumeOnTheOtherAgent: a sandbox running a counter is paused — its host memory
// is released, the agent's admittable rises — resumed on the other agent of a two-agent
// berth dev, and the counter goes on from its value at the pause, not from zero; once
// through the Go SDK, once through the CLI (PAUSE-1).
func TestPAUSE1_ResumeOnTheOtherAgent(t *testing.T) {
	st := bootGVisor(t, func(c *devConfig) { c.Agents = 2 })
	ctx := context.Background()
	c := adminClient(st)
	for _, via := range []string{"sdk", "cli"} {
		t.Run(via, func(t *testing.T) {
			sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell", Stateful: true})
			if err != nil {
				t.Fatal(err)
			}
			from, other := sb.AgentID, "dev-agent-1"
			if from == other {
				other = "dev-agent-2"
			}
			startCounter(t, c, sb.ID)
			waitFor(t, 10*time.Second, from+" charging the sandbox", func() (bool, string) {
				a := agentByID(t, c, from)
				return len(a.Sandboxes) == 1 && a.MemoryMiBCommitted == sb.MemoryMiB, fmt.Sprint(a.Sandboxes)
			})
			before := agentByID(t, c, from).MemoryMiBAdmittable
			// Far from zero, so that a restart from zero could not pass for the same counter.
			atPause := waitCounterPast(t, c, sb.ID, 30)

			var paused berth.Sandbox
			if via == "sdk" {
				paused, err = c.PauseSandbox(ctx, sb.ID)
			} else {
				var out string
				if out, err = berthCLI(t, st, "", "sandbox", "pause", sb.ID); err == nil {
					err = json.Unmarshal([]byte(out), &paused)
				}
			}
			if err != nil || paused.State != berth.SandboxPaused || paused.AgentID != "" || paused.PausedAt.IsZero() {
				t.Fatalf("pause: %+v, %v; want paused on no host", paused, err)
			}
			waitFor(t, 10*time.Second, from+"'s admittable rising by the paused sandbox's charge", func() (bool, string) {
				a := agentByID(t, c, from)
				return a.MemoryMiBAdmittable >= before+sb.MemoryMiB && len(a.Sandboxes) == 0,
					fmt.Sprintf("admittable %d (before %d), holding %d", a.MemoryMiBAdmittable, before, len(a.Sandboxes))
			})
			if _, err := c.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"true"}}); berth.ErrorCode(err) != berth.EConflict {
				t.Fatalf("exec in a paused sandbox: %v, want conflict", err)
			}

			// Only the other agent may take it: the resume lands there.
			if err := c.DrainAgent(ctx, from, "test: resume elsewhere"); err != nil {
				t.Fatal(err)
			}
			defer c.UndrainAgent(ctx, from)
			var resumed berth.Sandbox
			if via == "sdk" {
				resumed, err = c.ResumeSandbox(ctx, sb.ID)
			} else {
				var out string
				if out, err = berthCLI(t, st, "", "sandbox", "resume", sb.ID); err == nil {
					err = json.Unmarshal([]byte(out), &resumed)
				}
			}
			if err != nil || resumed.State != berth.SandboxRunning || resumed.AgentID != other || resumed.ID != sb.ID {
				t.Fatalf("resume: %+v, %v; want %s running on %s", resumed, err, sb.ID, other)
			}
			// The resume's answer says what a get says: the TTL moved on by the pause, to the
			// millisecond the store keeps (it answered nanoseconds a get never showed).
			if got, err := c.Sandbox(ctx, sb.ID); err != nil || !got.ExpiresAt.Equal(resumed.ExpiresAt) {
				t.Fatalf("expires_at: the resume answered %v, a get reads %v (%v)", resumed.ExpiresAt, got.ExpiresAt, err)
			}
			after := counter(t, c, sb.ID)
			if after < atPause {
				t.Fatalf("counter %d after the resume, %d before the pause: it started over", after, atPause)
			}
			later := waitCounterPast(t, c, sb.ID, after)
			t.Logf("%s: counter %d before the pause, %d after the resume on %s, then %d", via, atPause, after, other, later)
			evs, err := c.Events(ctx, "sandbox/"+sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			var path []string
			for _, e := range evs {
				path = append(path, e.To)
			}
			if got := strings.Join(path, " → "); !strings.HasSuffix(got, "running → pausing → paused → resuming → running") {
				t.Fatalf("events %s", got)
			}
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// awsNotice serves AWS's instance metadata on loopback: a token, and 404 for the spot
// instance action until arm is called, then a terminate notice for the deadline arm gets.
type awsNotice struct {
	srv      *httptest.Server
	deadline atomic.Pointer[time.Time]
}

func newAWSNotice(t *testing.T) *awsNotice {
	n := &awsNotice{}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/latest/api/token":
			io.WriteString(w, "token")
		case "/latest/meta-data/spot/instance-action":
			if d := n.deadline.Load(); d != nil {
				fmt.Fprintf(w, `{"action": "terminate", "time": %q}`, d.UTC().Format(time.RFC3339))
				return
			}
			w.WriteHeader(http.StatusNotFound)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *awsNotice) arm(deadline time.Time) { n.deadline.Store(&deadline) }

// TestSPOT3_SnapshotMoves: a hard preemption notice from a loopback AWS metadata server on one
// of two agents. Its stateful sandbox with in-memory state is checkpointed, moved and running
// on the other agent before the notice's deadline — the same sandbox, its counter going on —
// with an event for each step; a stateless one moves the same way with the budget left. Two
// guests whose snapshot fails for real (their image cannot be stored: the store refuses the
// path) fall back: the stateless one is reconstructed from its template, the stateful one is
// lost with the real reason (SPOT-3, PAUSE-2).
func TestSPOT3_SnapshotMoves(t *testing.T) {
	notice := newAWSNotice(t)
	st := bootGVisor(t, func(c *devConfig) {
		c.Agents = 2
		c.agentHook = func(i int, ac *agent.Config) {
			if i == 0 {
				ac.Notices = preempt.AWS{BaseURL: notice.srv.URL, Poll: 50 * time.Millisecond}
			}
		}
	})
	ctx := context.Background()
	c := adminClient(st)
	if err := c.DrainAgent(ctx, "dev-agent-2", "test: everything starts on dev-agent-1"); err != nil {
		t.Fatal(err)
	}
	create := func(stateful bool) berth.Sandbox {
		sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell", Stateful: stateful})
		if err != nil || sb.AgentID != "dev-agent-1" {
			t.Fatalf("create: %+v, %v", sb, err)
		}
		startCounter(t, c, sb.ID)
		return sb
	}
	db, session, brokenDB, brokenSession := create(true), create(false), create(true), create(false)
	for _, sb := range []berth.Sandbox{brokenDB, brokenSession} {
		// A file where the sandbox's images would go: the store refuses every write there.
		if err := os.WriteFile(filepath.Join(st.dataDir, "snapshots", sb.ID), []byte("in the way"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.UndrainAgent(ctx, "dev-agent-2"); err != nil {
		t.Fatal(err)
	}
	atNotice := waitCounterPast(t, c, db.ID, 30)
	deadline := time.Now().Add(60 * time.Second)
	notice.arm(deadline)

	waitFor(t, 60*time.Second, "the stateful sandbox running on dev-agent-2", func() (bool, string) {
		sb, err := c.Sandbox(ctx, db.ID)
		return err == nil && sb.State == berth.SandboxRunning && sb.AgentID == "dev-agent-2", fmt.Sprint(sb.State, sb.AgentID, sb.Reason, err)
	})
	if after := counter(t, c, db.ID); after < atNotice {
		t.Fatalf("the moved sandbox's counter is %d, it was %d at the notice: its memory did not move", after, atNotice)
	}
	steps := func(id string) ([]string, time.Time) {
		evs, err := c.Events(ctx, "sandbox/"+id)
		if err != nil {
			t.Fatal(err)
		}
		var path []string
		for _, e := range evs {
			path = append(path, e.To+" ("+e.Reason+")")
		}
		return path, evs[len(evs)-1].At
	}
	path, last := steps(db.ID)
	joined := strings.Join(path, " → ")
	for _, want := range []string{"evacuating (preemption notice: moving it by snapshot; hard deadline", "snapshotting (", "paused (checkpointed on agent/dev-agent-1",
		"resuming (restoring it on agent/dev-agent-2"} {
		if !strings.Contains(joined, want) {
			t.Fatalf("events of the moved sandbox: %s\nwant a step %q", joined, want)
		}
	}
	// Running after resuming is recorded by whichever comes first: the restore's answer, or the
	// new agent's heartbeat listing the guest (a loaded machine lets the heartbeat win).
	if !strings.Contains(joined, "resuming (restoring it on agent/dev-agent-2) → running (agent restored it") &&
		!strings.Contains(joined, "resuming (restoring it on agent/dev-agent-2) → running (agent reports it running") {
		t.Fatalf("events of the moved sandbox: %s\nwant resuming on agent/dev-agent-2 → running", joined)
	}
	if !last.Before(deadline) {
		t.Fatalf("the move finished at %s, after the notice's deadline %s", last, deadline)
	}
	waitFor(t, 30*time.Second, "the stateless sandbox moved too", func() (bool, string) {
		sb, err := c.Sandbox(ctx, session.ID)
		return err == nil && sb.State == berth.SandboxRunning && sb.AgentID == "dev-agent-2", fmt.Sprint(sb.State, sb.AgentID, sb.Reason, err)
	})
	waitFor(t, 30*time.Second, "the broken stateful sandbox lost with the real reason", func() (bool, string) {
		sb, err := c.Sandbox(ctx, brokenDB.ID)
		return err == nil && sb.State == berth.SandboxLost && strings.Contains(sb.Reason, "its snapshot failed") &&
			strings.Contains(sb.Reason, "could not be stored"), fmt.Sprint(sb.State, " ", sb.Reason, err)
	})
	waitFor(t, 30*time.Second, "the broken stateless sandbox reconstructed", func() (bool, string) {
		sb, err := c.Sandbox(ctx, brokenSession.ID)
		return err == nil && sb.State == berth.SandboxReconstructed, fmt.Sprint(sb.State, " ", sb.Reason, err)
	})
	path, _ = steps(brokenSession.ID)
	if joined := strings.Join(path, " → "); !strings.Contains(joined, "its snapshot failed") || !strings.Contains(joined, "recreating it from its template instead") {
		t.Fatalf("events of the reconstructed sandbox: %s", joined)
	}
	running, err := c.Sandboxes(ctx, berth.SandboxRunning)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sb := range running {
		if sb.Metadata["evacuated_from"] == brokenSession.ID && sb.AgentID == "dev-agent-2" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no replacement of %s running on dev-agent-2: %+v", brokenSession.ID, running)
	}
}

// wsApp is a WebSocket echo server in Python's standard library: the RFC 6455 handshake,
// then every text frame the client sends comes back unmasked.
const wsApp = `
import base64, hashlib, http.server, socketserver, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == '/stream':  # "tick N" once a second for 7 s, no Content-Length (C25)
            self.send_response(200)
            self.end_headers()
            for i in range(7):
                self.wfile.write(b'tick %d\n' % i)
                self.wfile.flush()
                time.sleep(1)
            return
        key = self.headers['Sec-WebSocket-Key']
        if key is None:  # Berth's readiness probe, or a browser's plain GET
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'websocket echo')
            return
        accept = base64.b64encode(hashlib.sha1((key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
        self.send_response(101)
        self.send_header('Upgrade', 'websocket')
        self.send_header('Connection', 'Upgrade')
        self.send_header('Sec-WebSocket-Accept', accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            n = head[1] & 0x7f
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            self.wfile.write(bytes([0x81, len(data)]) + data)
            self.wfile.flush()
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(('127.0.0.1', 8080), H).serve_forever()
`

// TestAPP1_WebSocketOnGVisor: an app's WebSocket works on gVisor end to end — client →
// Berth's /apps/ route → the agent's proxy → a relay into the sandbox → the app — the
// upgrade answered 101 and messages echoed both ways, one a second, several seconds long
// (APP-1).
func TestAPP1_WebSocketOnGVisor(t *testing.T) {
	st := bootGVisor(t, nil)
	ctx := context.Background()
	c := adminClient(st)
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "ws", AppSpec: berth.AppSpec{Template: "python", Port: 8080,
		Command: []string{"python3", "ws.py"}, Files: map[string]string{"ws.py": wsApp}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the app running", func() (bool, string) {
		a, err := c.App(ctx, "ws")
		return err == nil && a.State == berth.AppRunning, fmt.Sprint(a.State, a.Reason, err)
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(st.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(conn, "GET /apps/ws/ HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols ||
		resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("handshake: %v, %+v", err, resp)
	}
	for i := range 4 {
		msg := []byte(fmt.Sprintf("message %d", i))
		mask := []byte{1, 2, 3, 4}
		frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask...)
		for j, b := range msg {
			frame = append(frame, b^mask[j%4])
		}
		if _, err := conn.Write(frame); err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 2)
		if _, err := io.ReadFull(br, head); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		got := make([]byte, head[1])
		if _, err := io.ReadFull(br, got); err != nil || string(got) != string(msg) {
			t.Fatalf("echo %d = %q, %v; want %q", i, got, err, msg)
		}
		time.Sleep(time.Second) // real: a WebSocket held open across real seconds is what is tested
	}
}

// keepAliveApp is an HTTP/1.1 app (its connections stay open between requests, as most
// servers' do) that answers how many requests it has served: a count kept only in memory.
const keepAliveApp = `
import http.server
n = 0
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        global n
        n += 1
        body = b'%d' % n
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('127.0.0.1', 8080), H).serve_forever()
`

// TestPAUSE2_KeepAliveAppHibernatesByPause: an app whose server keeps its connections alive
// (so the agent's proxy holds one open into the sandbox) is hibernated by a pause — its
// memory kept — not stopped, and the request that wakes it finds its in-memory count where it
// was (PAUSE-2). The proxy's idle connection used to leave a relay inside the sandbox
// holding a host socket, which no checkpoint can save: every hibernation became a stop.
func TestPAUSE2_KeepAliveAppHibernatesByPause(t *testing.T) {
	st := bootGVisor(t, nil)
	ctx := context.Background()
	c := adminClient(st)
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "ka", IdleSeconds: 2, AppSpec: berth.AppSpec{Template: "python",
		Port: 8080, Command: []string{"python3", "app.py"}, Files: map[string]string{"app.py": keepAliveApp}}}); err != nil {
		t.Fatal(err)
	}
	waitApp(t, c, "ka", berth.AppRunning, 60*time.Second)
	last := 0
	for range 3 {
		body, code := get(t, st.URL+"/apps/ka/")
		n, err := strconv.Atoi(body)
		if code != http.StatusOK || err != nil || n <= last {
			t.Fatalf("GET /apps/ka/: %d %q; want a count above %d", code, body, last)
		}
		last = n
	}
	a := waitApp(t, c, "ka", berth.AppHibernated, 60*time.Second)
	if a.PausedSandbox == "" {
		t.Fatalf("hibernated app %+v: no paused sandbox (its sandbox was stopped, not paused: %s)", a, appStory(t, c, "ka", true))
	}
	body, code := get(t, st.URL+"/apps/ka/")
	if n, err := strconv.Atoi(body); code != http.StatusOK || err != nil || n <= last {
		t.Fatalf("the waking request: %d %q; want the count to go on from %d (memory kept)", code, body, last)
	}
}
