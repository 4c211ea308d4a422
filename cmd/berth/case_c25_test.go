package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/server"
)

// slowAppRequest is app "slow" (wsApp: a 7 s stream on /stream, a WebSocket echo) with
// idle_seconds 2: shorter than its stream and than the WebSocket exchange below (6 s).
func slowAppRequest() berth.AppRequest {
	return berth.AppRequest{Name: "slow", IdleSeconds: 2, AppSpec: berth.AppSpec{Template: "python", MemoryMiB: 128,
		Port: 8080, Command: []string{"python3", "app.py"}, Files: map[string]string{"app.py": wsApp}}}
}

// readStream reads the app's 7-tick stream through base and fails unless all of it arrives
// and ends cleanly (curl's exit 18 in the field report: the stream was cut).
func readStream(t *testing.T, base string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/apps/slow/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /stream: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || err != nil || strings.Count(string(b), "tick") != 7 {
		t.Fatalf("stream through Berth: %d, %q, %v; want all 7 ticks and a clean end", resp.StatusCode, b, err)
	}
}

// abandonStream starts reading the app's stream and goes away after the first tick.
func abandonStream(t *testing.T, base string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/apps/slow/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /stream: %v", err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("first tick: %v", err)
	}
	cancel() // the client leaves mid-stream
}

// exchangeWebSocket opens a WebSocket to the app through base and exchanges one message a
// second, 6 times; it fails if the connection is cut.
func exchangeWebSocket(t *testing.T, base string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(conn, "GET /apps/slow/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("WebSocket handshake: %v, %+v", err, resp)
	}
	for i := range 6 {
		msg := fmt.Appendf(nil, "message %d", i)
		mask := []byte{1, 2, 3, 4}
		frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask...)
		for j, c := range msg {
			frame = append(frame, c^mask[j%4])
		}
		if _, err := conn.Write(frame); err != nil {
			t.Fatalf("WebSocket message %d: %v (the connection was cut)", i, err)
		}
		head := make([]byte, 2)
		if _, err := io.ReadFull(br, head); err != nil {
			t.Fatalf("WebSocket echo %d: %v (the connection was cut)", i, err)
		}
		got := make([]byte, head[1])
		if _, err := io.ReadFull(br, got); err != nil || string(got) != string(msg) {
			t.Fatalf("WebSocket echo %d = %q, %v", i, got, err)
		}
		time.Sleep(time.Second) // real: a WebSocket held open across real seconds is what is tested (C25)
	}
}

// wantNeverHibernated fails if app slow left running (its events say when).
func wantNeverHibernated(t *testing.T, c *client.Client, during string) {
	t.Helper()
	a, err := c.App(context.Background(), "slow")
	if err != nil || a.State != berth.AppRunning || a.Desired != berth.DesireRunning {
		t.Fatalf("after %s: app %s desired %s (%s), %v; want running throughout", during, a.State, a.Desired, a.Reason, err)
	}
}

// TestCase_C25_OpenRequestKeepsAppAwake: an app with idle_seconds 2 is never hibernated while
// a request (a 7 s stream) or an upgraded connection (a 6 s WebSocket exchange) is open, and
// hibernates once they have ended and it has been idle for its idle time.
func TestCase_C25_OpenRequestKeepsAppAwake(t *testing.T) {
	st := bootDev(t, nil)
	c := adminClient(st)
	if _, err := c.CreateApp(context.Background(), slowAppRequest()); err != nil {
		t.Fatal(err)
	}
	waitApp(t, c, "slow", berth.AppRunning, 60*time.Second)
	readStream(t, st.URL)
	wantNeverHibernated(t, c, "a 7 s stream")
	exchangeWebSocket(t, st.URL)
	wantNeverHibernated(t, c, "a 6 s WebSocket exchange")
	// A client that leaves mid-stream ends its request too (the proxy aborts the answer):
	// the app must not stay awake for ever.
	abandonStream(t, st.URL)
	// Idle now: it hibernates, and says why.
	a := waitApp(t, c, "slow", berth.AppHibernated, 60*time.Second)
	if !strings.Contains(a.Reason, "no request open or ended") {
		t.Fatalf("hibernated app's reason %q; want it to say no request was open", a.Reason)
	}
}

// TestCase_C25_OpenRequestOnAnotherReplica: the request is open on one replica; the other,
// which sees no request at all, must not hibernate the app either (PostgreSQL, two replicas
// reconciling every 10 ms).
func TestCase_C25_OpenRequestOnAnotherReplica(t *testing.T) {
	f := newPGFleet(t)
	fast := func(c *server.Config) { c.AppReconcileInterval = 10 * time.Millisecond }
	url1, url2 := f.replica(t, fast), f.replica(t, fast)
	f.agent(t, "a1", url1, 4096)
	c := client.New(url2, f.adminKey, client.WithDeadline(5*time.Second))
	if _, err := c.CreateApp(context.Background(), slowAppRequest()); err != nil {
		t.Fatal(err)
	}
	waitApp(t, c, "slow", berth.AppRunning, 60*time.Second)
	readStream(t, url1)
	wantNeverHibernated(t, c, "a 7 s stream through the other replica")
	exchangeWebSocket(t, url1)
	wantNeverHibernated(t, c, "a 6 s WebSocket exchange through the other replica")
}
