package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/tlsconf"
	"github.com/berth-dev/berth/internal/tlstest"
)

// tlsTemplates serves GET /v1/templates over TLS with a certificate ca signed for
// 127.0.0.1, counting the requests that reach it.
func tlsTemplates(t *testing.T, ca *tlstest.CA) (string, *atomic.Int64) {
	t.Helper()
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
	var reached atomic.Int64
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"templates":[{"name":"shell"}]}`)
	})}
	go func() { _ = tlsconf.Serve(hs, ln, tlsconf.ServerConfig(cert), nil) }()
	t.Cleanup(func() { _ = hs.Close() })
	return "https://" + ln.Addr().String(), &reached
}

// TestWithCAFile (issue 15, point 2): with the server's CA the call succeeds over TLS;
// without it the handshake fails on the unknown authority and the request never reaches the
// server; a CA file that cannot be used fails every call with invalid_request before
// anything is sent.
func TestWithCAFile(t *testing.T) {
	ca := tlstest.NewCA(t)
	url, reached := tlsTemplates(t, ca)
	ctx := context.Background()

	tpl, err := New(url, "k", WithCAFile(ca.File)).Templates(ctx)
	if err != nil || len(tpl) != 1 || tpl[0].Name != "shell" {
		t.Fatalf("with the server's CA: %v, %v", tpl, err)
	}

	_, err = New(url, "k", WithDeadline(time.Nanosecond)).Templates(ctx)
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("without the CA: err = %v, want x509.UnknownAuthorityError", err)
	}
	if n := reached.Load(); n != 1 {
		t.Fatalf("the server was reached %d times, want once (only the call that trusted its CA)", n)
	}

	// A caller's transport that skips verification does not skip it under WithCAFile.
	stranger := tlstest.NewCA(t)
	skip := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	_, err = New(url, "k", WithCAFile(stranger.File), WithDeadline(time.Nanosecond), WithHTTPClient(&http.Client{Transport: skip})).Templates(ctx)
	if !errors.As(err, &unknown) {
		t.Fatalf("WithCAFile(another CA) over an InsecureSkipVerify transport: err = %v, want x509.UnknownAuthorityError", err)
	}

	missing := filepath.Join(t.TempDir(), "missing.pem")
	dialsItself := &http.Transport{DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
		t.Error("a connection was dialled")
		return nil, errors.New("unreachable")
	}}
	for name, c := range map[string]*Client{
		"missing file":               New(url, "k", WithCAFile(missing)),
		"http:// server URL":         New(strings.Replace(url, "https://", "http://", 1), "k", WithCAFile(ca.File)),
		"HTTP:// server URL":         New(strings.Replace(url, "https://", "HTTP://", 1), "k", WithCAFile(ca.File)),
		"transport dials TLS itself": New(url, "k", WithCAFile(ca.File), WithHTTPClient(&http.Client{Transport: dialsItself})),
		"other transport": New(url, "k", WithCAFile(ca.File),
			WithHTTPClient(&http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
				t.Error("a request was sent")
				return nil, errors.New("unreachable")
			})})),
	} {
		_, err := c.Templates(ctx)
		if berth.ErrorCode(err) != berth.EInvalidRequest {
			t.Errorf("%s: err = %v, want invalid_request", name, err)
		}
	}
	if n := reached.Load(); n != 1 {
		t.Fatalf("the server was reached %d times, want once", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
