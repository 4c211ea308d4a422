// Package tlsconf is the TLS every Berth endpoint speaks (issue 15, point 2; docs/DECISIONS.md
// "Trust model"), on the standard library only: a listener side whose certificate is re-read
// when its files change, so a renewed certificate is served without a restart, and a client
// side that trusts the CA of one PEM file instead of the system's roots.
//
// Both sides require TLS 1.2 or later. Listeners speak HTTP/1.1 over TLS, as they do in clear:
// the same bounds (internal/httpbound) and the same WebSocket upgrade path hold on both.
package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// MinVersion is the oldest TLS version any Berth endpoint accepts.
const MinVersion = tls.VersionTLS12

// Certificate is a certificate and key pair read from two PEM files and re-read when their
// content changes. Create it with [LoadCertificate]; it is safe for concurrent use.
type Certificate struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	certPEM []byte // the files' content cur was built from
	keyPEM  []byte
	badCert []byte // the content whose load last failed, so a bad pair is logged once
	badKey  []byte
	// badFrom is when the failed pair becomes valid, when that was its only fault (a renewal
	// issued a little ahead): it is loaded then, without the files changing again.
	badFrom time.Time
	now     func() time.Time // time.Now; tests move it
	// unreadable is set while the files cannot be read, so that is logged once.
	unreadable bool
}

// LoadCertificate reads the pair at certFile and keyFile (PEM: the leaf first, then any
// intermediates; an RSA, ECDSA or Ed25519 key). It returns an error naming the file when the
// pair cannot be read, does not parse or does not match: a listener must not start without a
// certificate. log (nil: slog.Default) receives one line per reload and per failed reload.
func LoadCertificate(certFile, keyFile string, log *slog.Logger) (*Certificate, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("a certificate needs both its file and its key file")
	}
	if log == nil {
		log = slog.Default()
	}
	c := &Certificate{certFile: certFile, keyFile: keyFile, log: log, now: time.Now}
	certPEM, keyPEM, err := c.read()
	if err != nil {
		return nil, err
	}
	pair, err := loadPair(certPEM, keyPEM, time.Now())
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w", certFile, keyFile, err)
	}
	c.cur, c.certPEM, c.keyPEM = &pair, certPEM, keyPEM
	return c, nil
}

// loadPair parses a certificate and key and refuses a leaf outside its validity period at
// now: serving it would fail every client's verification.
func loadPair(certPEM, keyPEM []byte, now time.Time) (tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return pair, err
	}
	if l := pair.Leaf; now.Before(l.NotBefore) || now.After(l.NotAfter) {
		return pair, fmt.Errorf("the certificate is valid from %s to %s, not now (%s)",
			l.NotBefore.UTC().Format(time.RFC3339), l.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return pair, nil
}

func (c *Certificate) read() (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(c.certFile); err != nil {
		return nil, nil, fmt.Errorf("TLS certificate: %w", err)
	}
	if keyPEM, err = os.ReadFile(c.keyFile); err != nil {
		return nil, nil, fmt.Errorf("TLS key: %w", err)
	}
	return certPEM, keyPEM, nil
}

// GetCertificate is the tls.Config hook: it re-reads both files at every handshake (two small
// reads, far cheaper than the handshake itself) and serves the new pair when their content
// changed and they form a valid pair whose certificate is valid now. A pair that fails (a
// rotation half-written, a key that does not match, an expired or not yet valid certificate)
// is logged once and the previous certificate is served until the files are right — or, for
// a certificate not valid yet, until it is. It never returns an error.
func (c *Certificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reloadLocked()
	return c.cur, nil
}

func (c *Certificate) reloadLocked() {
	certPEM, keyPEM, err := c.read()
	if err == nil {
		c.unreadable = false
	}
	switch {
	case err != nil:
		if !c.unreadable {
			c.unreadable = true
			c.log.Warn("TLS certificate files are unreadable; serving the previous certificate", "err", err)
		}
		return
	case bytes.Equal(certPEM, c.certPEM) && bytes.Equal(keyPEM, c.keyPEM):
		return
	case bytes.Equal(certPEM, c.badCert) && bytes.Equal(keyPEM, c.badKey) && (c.badFrom.IsZero() || c.now().Before(c.badFrom)):
		return
	}
	now := c.now()
	pair, err := loadPair(certPEM, keyPEM, now)
	if err != nil {
		if bytes.Equal(certPEM, c.badCert) && bytes.Equal(keyPEM, c.badKey) {
			return // said once already
		}
		c.badCert, c.badKey, c.badFrom = certPEM, keyPEM, time.Time{}
		if pair.Leaf != nil && now.Before(pair.Leaf.NotBefore) && now.Before(pair.Leaf.NotAfter) {
			c.badFrom = pair.Leaf.NotBefore
		}
		c.log.Warn("TLS certificate files changed but do not form a pair valid now; serving the previous certificate",
			"cert", c.certFile, "key", c.keyFile, "err", err)
		return
	}
	c.cur, c.certPEM, c.keyPEM, c.badCert, c.badKey, c.badFrom = &pair, certPEM, keyPEM, nil, nil, time.Time{}
	c.log.Info("TLS certificate reloaded", "cert", c.certFile, "subject", pair.Leaf.Subject.String(),
		"serial", pair.Leaf.SerialNumber.String(), "not_after", pair.Leaf.NotAfter)
}

// serverLog writes net/http's own lines to a slog.Logger: at Info, except failed TLS
// handshakes (scanners, clients without the CA, connections the connection cap closed), which
// go to Debug, so one client cannot fill the log with a line per connection.
type serverLog struct{ log *slog.Logger }

func (l serverLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	if strings.Contains(msg, "TLS handshake error") {
		level = slog.LevelDebug
	}
	l.log.Log(context.Background(), level, msg)
	return len(p), nil
}

// ServerConfig returns the listener's tls.Config: cert's pair (reloaded as
// [Certificate.GetCertificate] says), TLS 1.2 or later, HTTP/1.1.
func ServerConfig(cert *Certificate) *tls.Config {
	return &tls.Config{MinVersion: MinVersion, GetCertificate: cert.GetCertificate, NextProtos: []string{"http/1.1"}}
}

// Serve serves hs on ln until hs is shut down: over TLS with cfg when cfg is not nil (a
// plaintext request then gets net/http's 400 "Client sent an HTTP request to an HTTPS
// server" and nothing else), else in clear. net/http's own lines (failed handshakes, say) go
// to log when it is not nil (serverLog), so a JSON log stays JSON. It returns what
// http.Server's Serve returns.
func Serve(hs *http.Server, ln net.Listener, cfg *tls.Config, log *slog.Logger) error {
	if log != nil {
		hs.ErrorLog = stdlog.New(serverLog{log}, "", 0)
	}
	if cfg == nil {
		return hs.Serve(ln)
	}
	hs.TLSConfig = cfg
	// HTTP/1.1 only: a non-nil empty map turns net/http's automatic HTTP/2 off.
	hs.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	return hs.ServeTLS(ln, "", "")
}

// CAPool returns a pool holding the certificates of the PEM file at file: the CA a client
// trusts instead of the system's roots. An unreadable file, or one without a single
// certificate, is an error naming it.
func CAPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// ClientConfig returns a client's tls.Config trusting only the CA in caFile ("" trusts the
// system's roots), TLS 1.2 or later. Errors are [CAPool]'s.
func ClientConfig(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: MinVersion}
	if caFile == "" {
		return cfg, nil
	}
	pool, err := CAPool(caFile)
	if err != nil {
		return nil, err
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// Loopback reports whether addr (a listener's address) accepts connections from this machine
// only: a loopback IP. A wildcard address (0.0.0.0, ::) or any other is reachable from the
// network, where a plaintext listener would carry keys in clear.
func Loopback(addr net.Addr) bool {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// WarnPlaintext logs a warning when a listener at addr serves without TLS (cfg nil) and is
// reachable from the network (not [Loopback]): whatever crosses it (API keys, agent
// credentials, the node token, tenants' files) goes in clear. what names the listener in
// the line. A loopback listener (`berth dev`, tests) stays quiet.
func WarnPlaintext(log *slog.Logger, cfg *tls.Config, addr net.Addr, what string) {
	if cfg == nil && !Loopback(addr) {
		log.Warn(what+" serves plaintext HTTP on an address the network reaches: keys and credentials cross it in clear; give --tls-cert and --tls-key",
			"listen", addr.String())
	}
}
