package httpbound

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/tlsconf"
	"github.com/berth-dev/berth/internal/tlstest"
)

// serve starts h on 127.0.0.1:0 under l and returns its address and the listener it serves.
func serve(t *testing.T, l Limits, h http.Handler, longLived func(*http.Request) bool) (string, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, bln := l.Serve(ln, h, longLived)
	go func() { _ = srv.Serve(bln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), bln
}

func healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
}

// TestIdleConnsDoNotStopHealthz (issue 15, point 3): 5,000 idle connections (no request
// sent) against a listener capped at 1,000 do not exhaust the process's file descriptors,
// and /healthz still answers. The descriptor limit is lowered to 5,000 + 1,000 + 1,000, so
// a server that keeps every idle connection (2 × 5,000 descriptors here: both ends live in
// this process) runs out.
func TestIdleConnsDoNotStopHealthz(t *testing.T) {
	const idle, capConns = 5000, 1000
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	want := uint64(idle + capConns + 1000)
	if old.Max < want {
		t.Skipf("hard RLIMIT_NOFILE %d < %d", old.Max, want)
	}
	lim := syscall.Rlimit{Cur: want, Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })

	l := DefaultLimits()
	l.MaxConns = capConns
	addr, bln := serve(t, l, healthz(), nil)
	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	d := net.Dialer{Timeout: 10 * time.Second}
	for i := range idle {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz with %d idle connections open: %v", idle, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
	if cl, ok := bln.(*connLimiter); !ok || cl.Open() > capConns {
		t.Fatalf("the listener holds more than %d connections (%T)", capConns, bln)
	}
}

// TestSlowBodyIsCut (issue 15, point 3): a body that sends one byte and then nothing is cut
// at the read deadline (BodyTimeout 300 ms here): the server answers or closes the
// connection, where without a deadline it would hold it forever (the client's wait of 10 s is
// the bound, not a speed assertion).
func TestSlowBodyIsCut(t *testing.T) {
	l := DefaultLimits()
	l.BodyTimeout, l.BodyMinRate = 300*time.Millisecond, 1<<20
	addr, _ := serve(t, l, healthz(), nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := fmt.Fprintf(c, "PUT /v1/sandboxes/x/files HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nA"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server still holds a body that stopped after 1 byte (read %q)", b)
	}
}

// TestSlowLargeUploadIsNotCut: a body that keeps flowing above BodyMinRate is read to its end
// even though it takes longer than BodyTimeout (the files API's large uploads).
func TestSlowLargeUploadIsNotCut(t *testing.T) {
	l := DefaultLimits()
	l.BodyTimeout, l.BodyMinRate = 200*time.Millisecond, 64<<10
	addr, _ := serve(t, l, healthz(), nil)
	pr, pw := io.Pipe()
	go func() {
		chunk := bytes.Repeat([]byte("x"), 64<<10) // 1 s of deadline per chunk
		for range 8 {
			time.Sleep(100 * time.Millisecond) // real: paces an upload over a real socket past BodyTimeout
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/v1/sandboxes/x/files", pr)
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("slow large upload: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("slow large upload: %d %s", resp.StatusCode, body)
	}
}

// TestLongAnswerIsNotCut: a long-lived request (an exec stream) streams its answer for
// longer than both BodyTimeout and WriteTimeout: its body's read deadline is cleared once
// read, and it gets no write deadline (the deadlines are per route, not global).
func TestLongAnswerIsNotCut(t *testing.T) {
	l := DefaultLimits()
	l.BodyTimeout, l.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond
	addr, _ := serve(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		for i := range 6 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond): // real: outlives the real body deadline
			}
			fmt.Fprintf(w, "line %d\n", i)
			_ = http.NewResponseController(w).Flush()
		}
	}), func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/exec") })
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Post("http://"+addr+"/v1/sandboxes/x/exec", "application/json", strings.NewReader(`{"cmd":["true"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	for s := bufio.NewScanner(resp.Body); s.Scan(); {
		n++
	}
	if n != 6 {
		t.Fatalf("streamed answer cut after %d of 6 lines", n)
	}
}

// TestCapEvictsIdleTLSConns: over TLS the server reports each connection as the *tls.Conn
// around the one the cap accepted; idle TLS connections must still count as idle, so a
// listener full of them makes room for a new request instead of waiting for ever.
func TestCapEvictsIdleTLSConns(t *testing.T) {
	const capConns = 4
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "s.pem"), filepath.Join(dir, "s.key")
	ca.Issue(t, certFile, keyFile, "server", "127.0.0.1")
	cert, err := tlsconf.LoadCertificate(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := DefaultLimits()
	l.MaxConns = capConns
	srv, bln := l.Serve(ln, healthz(), nil)
	go func() { _ = tlsconf.Serve(srv, bln, tlsconf.ServerConfig(cert), nil) }()
	t.Cleanup(func() { _ = srv.Close() })
	cfg, err := tlsconf.ClientConfig(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	get := func(c *http.Client) error {
		resp, err := c.Get("https://" + ln.Addr().String() + "/healthz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return err
	}
	// capConns clients, each leaving its connection idle (keep-alive) after one request.
	for i := range capConns {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		t.Cleanup(c.CloseIdleConnections)
		if err := get(c); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	t.Cleanup(c.CloseIdleConnections)
	if err := get(c); err != nil {
		t.Fatalf("a new client with %d idle TLS connections at the cap: %v (idle TLS connections are not evicted)", capConns, err)
	}
}
