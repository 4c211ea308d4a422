// Package blackhole is for tests only: a TCP server on loopback that accepts connections,
// reads what is sent and never answers — no status line, no headers, ever — the way a hung
// process or a half-open network path looks to a caller (C28: every outbound call Berth makes
// has a deadline; these tests show it).
package blackhole

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Start listens on 127.0.0.1 port 0 and returns "http://host:port". The listener and every
// connection it accepted are closed in t.Cleanup. A listen failure fails t.
func Start(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // the listener closed
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() { _, _ = io.Copy(io.Discard, c) }() // read the request, never answer
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}
