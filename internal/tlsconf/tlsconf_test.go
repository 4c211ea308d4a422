package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/logtest"
	"github.com/berth-dev/berth/internal/tlstest"
)

// serveTLS serves h over TLS with cert on 127.0.0.1:0 and returns the address.
func serveTLS(t *testing.T, cert *Certificate, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = Serve(hs, ln, ServerConfig(cert), slog.New(slog.NewTextHandler(t.Output(), nil))) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// servedSerial handshakes with addr trusting ca and returns the serial of the certificate
// the server presented.
func servedSerial(t *testing.T, addr string, ca *x509.CertPool) *big.Int {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{RootCAs: ca, MinVersion: MinVersion})
	if err != nil {
		t.Fatalf("handshake with %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}

// TestCertificateReloadsOnChange: a renewed pair written over the files is served at the
// next handshake without a restart; a pair that does not match is logged once and the
// previous certificate stays served; fixing the files is picked up again.
func TestCertificateReloadsOnChange(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	first := ca.Issue(t, certFile, keyFile, "server", "127.0.0.1")
	var logs logtest.Buffer
	cert, err := LoadCertificate(certFile, keyFile, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cert, http.NotFoundHandler())
	pool, err := CAPool(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, addr, pool); got.Cmp(first) != 0 {
		t.Fatalf("served serial %v, want the first certificate's %v", got, first)
	}

	renewed := ca.Issue(t, certFile, keyFile, "server", "127.0.0.1")
	if got := servedSerial(t, addr, pool); got.Cmp(renewed) != 0 {
		t.Fatalf("after renewal served serial %v, want the renewed certificate's %v", got, renewed)
	}

	// A key that does not belong to the certificate: the renewed one stays served.
	other := t.TempDir()
	ca.Issue(t, filepath.Join(other, "c.pem"), filepath.Join(other, "k.pem"), "other", "127.0.0.1")
	b, err := os.ReadFile(filepath.Join(other, "k.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := servedSerial(t, addr, pool); got.Cmp(renewed) != 0 {
			t.Fatalf("with a mismatched key served serial %v, want the previous certificate's %v", got, renewed)
		}
	}
	if n := strings.Count(logs.String(), "do not form a pair valid now"); n != 1 {
		t.Fatalf("the bad pair was logged %d times over 3 handshakes, want once:\n%s", n, logs.String())
	}

	// An expired certificate (a renewal job that wrote an old file back) is not served either.
	ca.IssueValid(t, certFile, keyFile, "server", time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour), "127.0.0.1")
	if got := servedSerial(t, addr, pool); got.Cmp(renewed) != 0 {
		t.Fatalf("with an expired certificate served serial %v, want the previous certificate's %v", got, renewed)
	}
	if n := strings.Count(logs.String(), "do not form a pair valid now"); n != 2 {
		t.Fatalf("%d lines for bad pairs, want 2 (mismatched key, expired):\n%s", n, logs.String())
	}
	if _, err := LoadCertificate(certFile, keyFile, nil); err == nil || !strings.Contains(err.Error(), "not now") {
		t.Errorf("LoadCertificate(expired) = %v, want an error saying it is not valid now", err)
	}

	fixed := ca.Issue(t, certFile, keyFile, "server", "127.0.0.1")
	if got := servedSerial(t, addr, pool); got.Cmp(fixed) != 0 {
		t.Fatalf("after fixing the files served serial %v, want %v", got, fixed)
	}
	if n := strings.Count(logs.String(), "TLS certificate reloaded"); n != 2 {
		t.Fatalf("%d reload lines, want 2 (renewal, fix):\n%s", n, logs.String())
	}
}

// TestPlaintextIsRefused: a request in clear to a TLS listener never reaches the handler.
func TestPlaintextIsRefused(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "s.pem"), filepath.Join(dir, "s.key")
	ca.Issue(t, certFile, keyFile, "server", "127.0.0.1")
	cert, err := LoadCertificate(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int64
	addr := serveTLS(t, cert, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") || reached.Load() != 0 {
		t.Fatalf("plaintext request: %d %q, handler reached %d times; want 400 naming HTTPS and the handler never reached",
			resp.StatusCode, body, reached.Load())
	}
}

// TestClientTrustsOnlyItsCA: a client given another CA, or the system roots, does not
// complete a handshake with a server whose certificate our CA signed; given ours it does.
func TestClientTrustsOnlyItsCA(t *testing.T) {
	ca, stranger := tlstest.NewCA(t), tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "s.pem"), filepath.Join(dir, "s.key")
	ca.Issue(t, certFile, keyFile, "server", "127.0.0.1")
	cert, err := LoadCertificate(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cert, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	get := func(caFile string) error {
		cfg, err := ClientConfig(caFile)
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		defer c.CloseIdleConnections()
		resp, err := c.Get("https://" + addr + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	for _, caFile := range []string{"", stranger.File} {
		err := get(caFile)
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) {
			t.Errorf("client trusting %q: err = %v, want x509.UnknownAuthorityError", caFile, err)
		}
	}
	if err := get(ca.File); err != nil {
		t.Fatalf("client trusting the server's CA: %v", err)
	}
}

// TestBadFilesAreRefused: CA and certificate files that are missing, not PEM or not a pair
// are errors naming them, so a listener or client never starts on them.
func TestBadFilesAreRefused(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	if _, err := CAPool(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("CAPool(missing) = %v, want an error naming it", err)
	}
	if _, err := CAPool(junk); err == nil || !strings.Contains(err.Error(), junk) {
		t.Errorf("CAPool(junk) = %v, want an error naming it", err)
	}
	if _, err := LoadCertificate(junk, junk, nil); err == nil || !strings.Contains(err.Error(), junk) {
		t.Errorf("LoadCertificate(junk) = %v, want an error naming it", err)
	}
	if _, err := LoadCertificate(missing, junk, nil); err == nil {
		t.Error("LoadCertificate(missing) = nil error")
	}
	if _, err := LoadCertificate("", "", nil); err == nil {
		t.Error(`LoadCertificate("", "") = nil error`)
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7070": true, "127.3.4.5:1": true, "[::1]:7070": true,
		"0.0.0.0:7070": false, "[::]:7070": false, "10.1.2.3:7070": false, "192.168.1.1:80": false,
	} {
		tcp, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := Loopback(tcp); got != want {
			t.Errorf("Loopback(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestWarnPlaintext: a listener without TLS on a wildcard or routable address logs one
// warning; with TLS, or on loopback, nothing.
func TestWarnPlaintext(t *testing.T) {
	for _, tc := range []struct {
		addr string
		tls  bool
		warn bool
	}{
		{"0.0.0.0:7070", false, true}, {"[::]:7070", false, true}, {"10.1.2.3:7070", false, true},
		{"0.0.0.0:7070", true, false}, {"127.0.0.1:7070", false, false}, {"[::1]:7070", false, false},
	} {
		var logs logtest.Buffer
		var cfg *tls.Config
		if tc.tls {
			cfg = &tls.Config{}
		}
		addr, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		WarnPlaintext(slog.New(slog.NewTextHandler(&logs, nil)), cfg, addr, "the API")
		if got := strings.Contains(logs.String(), "plaintext"); got != tc.warn {
			t.Errorf("%s tls=%v: warned %v, want %v (%q)", tc.addr, tc.tls, got, tc.warn, logs.String())
		}
	}
}

// TestHandshakeErrorsAreDebug: net/http's line per failed handshake goes to Debug (a
// scanner or a flood cannot fill the log), its other lines to Info.
func TestHandshakeErrorsAreDebug(t *testing.T) {
	var logs logtest.Buffer
	w := serverLog{slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	_, _ = w.Write([]byte("http: TLS handshake error from 127.0.0.1:5: remote error: tls: bad certificate\n"))
	_, _ = w.Write([]byte("http: Accept error: too many open files; retrying in 5ms\n"))
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "level=DEBUG") || !strings.Contains(lines[1], "level=INFO") {
		t.Fatalf("logged %q; want the handshake error at DEBUG and the accept error at INFO", lines)
	}
}

// TestCertificateNotYetValidIsServedWhenItIs: a renewal issued a little ahead (NotBefore in
// the future) is not served before its time, and is served from then on without the files
// changing again.
func TestCertificateNotYetValidIsServedWhenItIs(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	first := ca.Issue(t, certFile, keyFile, "server", "127.0.0.1")
	cert, err := LoadCertificate(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var clock atomic.Int64 // the server's clock, unix ns
	clock.Store(start.UnixNano())
	cert.now = func() time.Time { return time.Unix(0, clock.Load()) }
	addr := serveTLS(t, cert, http.NotFoundHandler())
	pool, err := CAPool(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	next := ca.IssueValid(t, certFile, keyFile, "server", start.Add(time.Hour), start.Add(48*time.Hour), "127.0.0.1")
	if got := servedSerial(t, addr, pool); got.Cmp(first) != 0 {
		t.Fatalf("before the renewal is valid: served %v, want the first %v", got, first)
	}
	later := start.Add(2 * time.Hour)
	clock.Store(later.UnixNano())
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: MinVersion,
		Time: func() time.Time { return later }})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := conn.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(next) != 0 {
		t.Fatalf("once the renewal is valid: served %v, want it (%v)", got, next)
	}
}
