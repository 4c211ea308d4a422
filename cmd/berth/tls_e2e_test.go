package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/logtest"
	"github.com/berth-dev/berth/internal/tlsconf"
	"github.com/berth-dev/berth/internal/tlstest"
	"github.com/berth-dev/berth/server"
)

// mainInBackground runs `berth args…` in this process until the test ends, its log (stderr)
// into logs; the returned channel receives Main's error if it returns early. The cleanup
// cancels it and waits for it (a server shuts down, an agent stops its sandboxes).
func mainInBackground(t *testing.T, logs *logtest.Buffer, args ...string) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(exited)
		done <- Main(ctx, args, strings.NewReader(""), io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(90 * time.Second):
			t.Errorf("berth %s did not stop within 90 s of its context ending", args[0])
		}
		if t.Failed() {
			s := logs.String()
			if len(s) > 6000 {
				s = s[len(s)-6000:]
			}
			t.Logf("log of berth %s:\n%s", args[0], s)
		}
	})
	return done
}

// TestTLS_ServerAndAgentOverTLS (issue 15, point 2): `berth server` and `berth agent` serve
// TLS with certificates a CA made in this test signed; the CLI reaches the server with
// --ca, creates a sandbox and execs in it (so the server's calls reach the agent over TLS
// too); plaintext is refused on both listeners, by the CLI's own checks without --ca, and
// by the server for an agent announcing an http:// address; a certificate renewed on disk is
// served without a restart.
func TestTLS_ServerAndAgentOverTLS(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	sCert, sKey := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	aCert, aKey := filepath.Join(dir, "agent.pem"), filepath.Join(dir, "agent.key")
	ca.Issue(t, sCert, sKey, "berth-server", "127.0.0.1", "localhost")
	ca.Issue(t, aCert, aKey, "tls-agent", "127.0.0.1")
	t.Setenv("BERTH_NODE_TOKEN", server.NewKeySecret())
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	for _, v := range []string{"BERTH_URL", "BERTH_KEY", "BERTH_CA", "BERTH_STORE"} {
		t.Setenv(v, "")
	}
	hostPort := "127.0.0.1:" + freePort(t)
	base, data := "https://"+hostPort, filepath.Join(dir, "data")

	var serverLog, agentLog logtest.Buffer
	serverDone := mainInBackground(t, &serverLog, "server", "--listen", hostPort, "--data", data,
		"--tls-cert", sCert, "--tls-key", sKey, "--agent-ca", ca.File)
	agentArgs := []string{"agent", "--ca", ca.File, "--server", base, "--id", "tls-agent", "--listen", "127.0.0.1:0",
		"--tls-cert", aCert, "--tls-key", aKey, "--dir", filepath.Join(dir, "agent"), "--volume-dir", filepath.Join(dir, "volumes"),
		"--runtime", "process", "--heartbeat-interval", "500ms"}
	if os.Geteuid() != 0 {
		agentArgs = append(agentArgs, "--insecure")
	}
	agentDone := mainInBackground(t, &agentLog, agentArgs...)

	// The admin key is written by the server once it runs; then the agent must show up.
	keyFile := filepath.Join(data, "admin.key")
	var agent berth.Agent
	for i := 0; ; i++ {
		select {
		case err := <-serverDone:
			t.Fatalf("berth server exited: %v", err)
		case err := <-agentDone:
			t.Fatalf("berth agent exited: %v", err)
		default:
		}
		if key, err := os.ReadFile(keyFile); err == nil {
			as, err := client.New(base, strings.TrimSpace(string(key)), client.WithCAFile(ca.File), client.WithDeadline(time.Nanosecond)).Agents(context.Background())
			if err == nil && len(as) == 1 && as[0].Status == berth.AgentActive && as[0].LastSeenS < 5 {
				agent = as[0]
				break
			}
		}
		if i == 240 {
			t.Fatal("the agent never heartbeated over TLS within 60 s")
		}
		time.Sleep(250 * time.Millisecond) // real: a server and an agent start in the background
	}
	if !strings.HasPrefix(agent.Address, "https://127.0.0.1:") {
		t.Fatalf("the agent announced %q, want its https:// address", agent.Address)
	}

	cli := func(args ...string) cliRun {
		t.Helper()
		return runCLI(t, "", append([]string{"--key-file", keyFile, "--wait", "0"}, args...)...)
	}
	r := cli("--url", base, "--ca", ca.File, "sandbox", "create", "shell", "-q")
	if r.code != 0 {
		t.Fatalf("sandbox create over TLS: exit %d, stderr %q", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	r = cli("--url", base, "--ca", ca.File, "sandbox", "exec", id, "--", "echo", "over-tls")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "over-tls" {
		t.Fatalf("sandbox exec over TLS: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// Plaintext is refused: in clear to either listener, net/http's 400 and nothing else.
	agentURL, err := url.Parse(agent.Address)
	if err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{"http://" + hostPort + "/v1/agents", "http://" + agentURL.Host + "/internal/sandboxes"} {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(plain)
		if err != nil {
			t.Fatalf("GET %s: %v", plain, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
			t.Errorf("GET %s in clear: %d %q, want 400 naming HTTPS", plain, resp.StatusCode, body)
		}
	}
	if r := cli("--url", "http://"+hostPort, "agents", "list"); r.code != exitInvalid || !strings.Contains(r.stderr, "use an https:// URL") {
		t.Errorf("the CLI in clear to the TLS port: exit %d, stderr %q; want %d saying to use https://", r.code, r.stderr, exitInvalid)
	}
	// Without --ca the CLI does not trust the server and sends nothing.
	if r := cli("--url", base, "agents", "list"); r.code != exitInvalid || !strings.Contains(r.stderr, "give --ca") {
		t.Errorf("the CLI without --ca: exit %d, stderr %q; want %d naming --ca", r.code, r.stderr, exitInvalid)
	} else {
		checkStderr(t, r.stderr, "does not trust")
	}

	// A server that serves TLS calls agents over TLS only: an agent announcing an http://
	// address is refused at its heartbeat.
	ctx := context.Background()
	secret, err := client.New(base, os.Getenv("BERTH_NODE_TOKEN"), client.WithCAFile(ca.File)).JoinAgent(ctx, "plain-agent")
	if err != nil {
		t.Fatal(err)
	}
	err = client.New(base, secret, client.WithCAFile(ca.File)).Heartbeat(ctx, berth.Heartbeat{AgentID: "plain-agent",
		Address: "http://127.0.0.1:1", Status: berth.AgentActive, MemoryAdmission: berth.AdmissionWorkingSet,
		MemoryMiBTotal: 1024, MemoryMiBAdmittable: 512})
	if berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("heartbeat announcing http:// to a TLS server: %v, want invalid_request naming TLS", err)
	}

	// A certificate renewed on disk is served at the next handshake, without a restart.
	renewed := ca.Issue(t, sCert, sKey, "berth-server", "127.0.0.1", "localhost")
	cfg, err := tlsconf.ClientConfig(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", hostPort, cfg)
	if err != nil {
		t.Fatal(err)
	}
	served := conn.ConnectionState().PeerCertificates[0].SerialNumber
	conn.Close()
	if served.Cmp(renewed) != 0 {
		t.Errorf("after renewal the server presents serial %v, want the renewed %v", served, renewed)
	}
	if r := cli("--url", base, "--ca", ca.File, "sandbox", "delete", id); r.code != 0 {
		t.Errorf("sandbox delete after the renewal: exit %d, stderr %q", r.code, r.stderr)
	}
	if strings.Contains(serverLog.String(), "plaintext") {
		t.Errorf("a TLS server on loopback warned about plaintext:\n%s", serverLog.String())
	}
}

// TestTLSFlagsRefused: TLS flags that cannot work are refused before anything starts (exit
// 2, invalid_request): a certificate without its key, a CA file that is not there.
func TestTLSFlagsRefused(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "a.pem"), filepath.Join(dir, "a.key")
	ca.Issue(t, cert, key, "agent", "127.0.0.1")
	missing := filepath.Join(dir, "missing.pem")
	for _, args := range [][]string{
		{"--server", "https://127.0.0.1:1", "--tls-cert", cert},
		{"--server", "https://127.0.0.1:1", "--tls-cert", cert, "--tls-key", cert},
		{"--server", "https://127.0.0.1:1", "--ca", missing},
		{"--server", "http://127.0.0.1:1", "--ca", ca.File},
		{"--server", "http://127.0.0.1:1", "--tls-cert", cert, "--tls-key", key},
	} {
		if err := agentMain(t, args...); berth.ErrorCode(err) != berth.EInvalidRequest {
			t.Errorf("berth agent %v: %v, want invalid_request", args, err)
		}
	}
	if r := runCLI(t, "", "--url", "https://127.0.0.1:1", "--key", "k", "--ca", missing, "agents", "list"); r.code != exitInvalid || !strings.Contains(r.stderr, missing) {
		t.Errorf("--ca %s: exit %d, stderr %q; want %d naming the file", missing, r.code, r.stderr, exitInvalid)
	}
	// A key is never sent in clear to a server the user gave a CA for.
	var reached atomic.Int64
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) }))
	t.Cleanup(plain.Close)
	for _, u := range []string{plain.URL, strings.Replace(plain.URL, "http://", "HTTP://", 1)} {
		if r := runCLI(t, "", "--url", u, "--key", "k", "--ca", ca.File, "agents", "list"); r.code != exitInvalid || !strings.Contains(r.stderr, "in clear") || reached.Load() != 0 {
			t.Errorf("--ca with %s: exit %d, stderr %q, server reached %d times; want %d, nothing sent", u, r.code, r.stderr, reached.Load(), exitInvalid)
		}
	}
	// https:// to a plaintext server is named as such.
	if r := runCLI(t, "", "--url", strings.Replace(plain.URL, "http://", "https://", 1), "--key", "k", "--wait", "0", "agents", "list"); r.code != exitInvalid || !strings.Contains(r.stderr, "speaks plain HTTP") {
		t.Errorf("https:// to a plaintext server: exit %d, stderr %q; want %d saying it speaks plain HTTP", r.code, r.stderr, exitInvalid)
	}
}

// TestREADME_TLSRecipe runs the openssl lines of README's "Many replicas on PostgreSQL" TLS
// recipe as written, in a scratch directory, and checks what they make: a certificate and
// key `berth server --tls-cert/--tls-key` loads, which the CA file verifies for the name it
// was made for; and the flags the TLS bullet names exist on the commands it names.
func TestREADME_TLSRecipe(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl on PATH")
	}
	section := readmeSection(t, "Many replicas on PostgreSQL")
	i := strings.Index(section, "openssl req -x509")
	if i < 0 {
		t.Fatal("the section has no TLS recipe (openssl req -x509)")
	}
	block := section[strings.LastIndex(section[:i], "```sh\n")+len("```sh\n"):]
	block, _, _ = strings.Cut(block, "```")
	dir := t.TempDir()
	ran := 0
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		shell(t, os.Environ(), "cd "+dir+" && "+line)
		ran++
	}
	if ran != 3 {
		t.Fatalf("ran %d openssl lines, want 3", ran)
	}
	cert, err := tlsconf.LoadCertificate(filepath.Join(dir, "replica-1.pem"), filepath.Join(dir, "replica-1.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := tlsconf.CAPool(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := cert.GetCertificate(nil)
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "replica-1"}); err != nil {
		t.Fatalf("the recipe's replica-1 certificate does not verify against its CA for replica-1: %v", err)
	}

	root := newRootCmd(&clientFlags{})
	for cmd, flags := range map[string][]string{"server": {"tls-cert", "tls-key", "agent-ca"}, "agent": {"ca", "tls-cert", "tls-key"}} {
		c, _, err := root.Find([]string{cmd})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flags {
			if !strings.Contains(section, "`--"+f) {
				t.Errorf("the section does not name --%s", f)
			}
			if c.Flags().Lookup(f) == nil && c.InheritedFlags().Lookup(f) == nil {
				t.Errorf("berth %s has no --%s, which the README gives it", cmd, f)
			}
		}
	}
}
