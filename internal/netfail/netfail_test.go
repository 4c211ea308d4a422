package netfail

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"testing"
)

// TestNothingSent: the failures before a request is written are told apart from those after,
// and a server's own bytes cannot pass for net/http's "server closed idle connection".
func TestNothingSent(t *testing.T) {
	wrap := func(err error) error { return &url.Error{Op: "Post", URL: "http://x/v1/sandboxes/sb-1/exec", Err: err} }
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"refused":                        {wrap(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), true},
		"proxy refused":                  {wrap(&net.OpError{Op: "proxyconnect", Net: "tcp", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}), true},
		"untrusted cert":                 {wrap(&tls.CertificateVerificationError{Err: errors.New("x509: unknown authority")}), true},
		"not TLS":                        {wrap(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake", Conn: &net.TCPConn{}}), true},
		"bad record after the handshake": {wrap(tls.RecordHeaderError{Msg: "oversized record received"}), false},
		"closed idle":                    {wrap(fmt.Errorf("%w", errors.New(closedIdleText))), true},
		"reset after send":               {wrap(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), false},
		"EOF before answer":              {wrap(errors.New("EOF")), false},
		"forged header": {wrap(errors.New("net/http: HTTP/1.x transport connection broken: malformed MIME header line: " +
			"server closed idle connection")), false},
		"TLS alert": {wrap(&net.OpError{Op: "remote error", Err: tls.AlertError(42)}), false},
	} {
		if got := NothingSent(c.err); got != c.want {
			t.Errorf("%s: NothingSent(%v) = %v, want %v", name, c.err, got, c.want)
		}
	}
}

// TestNotConnected: only a connection that could not be made at all — not a TLS handshake
// that failed on one that was — says the server is down.
func TestNotConnected(t *testing.T) {
	if !NotConnected(&url.Error{Op: "Post", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}) {
		t.Error("a refused dial is not 'not connected'")
	}
	if NotConnected(&url.Error{Op: "Post", Err: &tls.CertificateVerificationError{Err: errors.New("x509")}}) {
		t.Error("a refused certificate reads as 'not connected'")
	}
}
