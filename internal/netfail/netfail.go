// Package netfail tells, from the error of an HTTP round trip, whether any of the request can
// have reached the server — the difference between "nothing happened, try again" and "it may
// have been done". The Go SDK (client) and a replica's calls to its agents (server) read
// their transport errors with it. It imports only the standard library.
package netfail

import (
	"crypto/tls"
	"errors"
	"net"
)

// NothingSent reports whether err, from an HTTP client's round trip, means nothing of the
// request reached the server: the dial failed (refused, unreachable, the name did not resolve,
// the connect timed out; to the server, or to the HTTP proxy the client goes through, whose
// net.OpError says "proxyconnect"), the TLS handshake failed (an untrusted certificate, an
// answer that is not TLS), or the server had closed the idle connection the request was to go
// on (ClosedIdle). A TLS alert is not counted: in TLS 1.3 a refused client certificate can be
// told after the request was written. Anything else may come after the request was sent.
func NothingSent(err error) bool {
	var cert *tls.CertificateVerificationError
	var notTLS tls.RecordHeaderError
	// A RecordHeaderError carries its Conn only from the handshake (crypto/tls: nil once there
	// has been one): after it, a bad record may follow a request written in full (an attack:
	// an agent that ran an exec and then sent a malformed record read as "nothing sent").
	return NotConnected(err) || errors.As(err, &cert) || errors.As(err, &notTLS) && notTLS.Conn != nil || ClosedIdle(err)
}

// NotConnected reports whether err says no connection to the server could be made at all:
// the dial failed, to the server or to the proxy the client goes through. It is the part of
// NothingSent that says the server is down or unreachable, rather than up and refusing to be
// spoken to (a certificate, a protocol) — a replica counts the second toward a host's
// quarantine (PLC-9), the first not.
func NotConnected(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && (op.Op == "dial" || op.Op == "proxyconnect")
}

// closedIdleText is net/http's error (unexported) for a request whose idle connection the
// server had closed before it was written.
const closedIdleText = "http: server closed idle connection"

// ClosedIdle reports net/http's error for a request whose idle connection the server had
// closed anywhere in err's chain, by its whole text: a match on part of the text let a
// server's own bytes — a header line it sent — pass for it (found by an attack: an exec the
// server had read was then "not sent").
func ClosedIdle(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == closedIdleText {
			return true
		}
	}
	return false
}
