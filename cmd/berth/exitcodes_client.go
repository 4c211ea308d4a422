package main

// How the CLI reaches a server (--url, the API key, --wait) and what it says when that
// fails: the inputs are checked before any request (exit 2 when they are wrong), and giving
// up or getting no answer is reworded with the server's URL, the last code and its
// Retry-After (exit 3; exitCode has the rule).

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/tlsconf"
)

// clientFlags are the flags every command that talks to a server shares (README: --url or
// BERTH_URL, --key or BERTH_KEY or --key-file, --wait).
type clientFlags struct {
	url, key, keyFile string
	// ca is --ca (or BERTH_CA): the CA an https:// server's certificate is checked against.
	ca     string
	wait   time.Duration
	stderr io.Writer
	// changed reports whether a flag was given on the command line (set before RunE).
	changed func(name string) bool
	// keySource says where the key came from, for a 401's message: "--key", "BERTH_KEY" or
	// "--key-file PATH".
	keySource string
	// opts are extra SDK options; tests pass a fake clock here.
	opts []client.Option
}

// client builds the SDK client: --key, else BERTH_KEY, else the key file. Every wait between
// retries is announced on stderr with its reason and length (the server's Retry-After or
// jitter), so a refusal or an unreachable server is never a silent minute. --wait 0 tries
// once.
func (f *clientFlags) client() (*client.Client, error) {
	base, err := f.serverURL()
	if err != nil {
		return nil, err
	}
	if f.wait < 0 {
		return nil, badInput("--wait %s: want 0 (try once) or more", f.wait)
	}
	key, err := f.resolveKey()
	if err != nil {
		return nil, err
	}
	notify := func(r client.Retry) {
		if f.stderr == nil {
			return
		}
		why := r.Last.Error()
		var te *client.TransportError
		if errors.As(r.Err, &te) {
			why = fmt.Sprintf("cannot reach the Berth server at %s (%s)", te.Server, te.Reason())
		}
		as := ""
		if r.FromRetryAfter {
			as = ", as the server's Retry-After asks"
		}
		fmt.Fprintf(f.stderr, "berth: %s; retrying in %.1fs%s (Ctrl-C to stop)\n", why, r.Wait.Seconds(), as)
	}
	wait := f.wait
	if wait == 0 {
		wait = time.Nanosecond // every wait but an "at once" Retry-After ends past it: one attempt
	}
	opts := append([]client.Option{client.WithRetryNotify(notify), client.WithDeadline(wait),
		client.WithHTTPClient(cliHTTP)}, f.opts...)
	scheme := "" // serverURL checked it parses; url.Parse lower-cases it
	if u, err := url.Parse(base); err == nil {
		scheme = u.Scheme
	}
	switch {
	case f.ca != "" && scheme == "http" && f.changed != nil && f.changed("ca"):
		return nil, badInput("--ca is for an https:// server, and %s is http://: the key would cross in clear", base)
	case f.ca != "" && scheme == "https": // BERTH_CA does not apply to an http:// URL
		if _, err := tlsconf.CAPool(f.ca); err != nil {
			return nil, badInput("--ca: %v", err)
		}
		opts = append(opts, client.WithCAFile(f.ca))
	}
	return client.New(base, key, opts...), nil
}

// cliHTTP bounds how long the CLI waits for a connection (10 s), so a server address that
// drops packets is "unreachable" in seconds, not after the kernel's two minutes. Each
// attempt's answer is bounded by the SDK (client.DefaultAttemptTimeout; an exec its timeout
// plus 30 s), not here: an exec may run for minutes.
var cliHTTP = func() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return &http.Client{Transport: t}
}()

// serverURL checks --url (or BERTH_URL): http:// or https:// and a host. A URL without a
// scheme ("127.0.0.1:7070") is refused with the fix spelled out rather than guessed, so a
// key is never sent in clear text to a server the user meant to reach over https.
func (f *clientFlags) serverURL() (string, error) {
	src := "--url"
	if (f.changed == nil || !f.changed("url")) && os.Getenv("BERTH_URL") != "" {
		src = "BERTH_URL"
	}
	if err := checkServerURL(src, f.url); err != nil {
		return "", err
	}
	return f.url, nil
}

// checkServerURL checks one server URL given by src (a flag or variable name, for the
// message): http:// or https://, a host, no user info. Anything else is a *usageError (exit
// 2) that says what is wanted, with the fix spelled out for a URL without a scheme.
func checkServerURL(src, raw string) error {
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil {
		return nil
	}
	hint := ""
	if !strings.Contains(raw, "://") && raw != "" {
		hint = fmt.Sprintf(" (did you mean http://%s ?)", raw)
	}
	return badInput("%s %q is not a server URL: want http://HOST:PORT or https://HOST:PORT%s", src, raw, hint)
}

// resolveKey returns --key, else BERTH_KEY, else the content of --key-file, and notes which.
// A missing default key file, an unreadable or empty key file are usage errors naming the
// file.
func (f *clientFlags) resolveKey() (string, error) {
	if f.key != "" {
		f.keySource = "--key"
		return f.key, nil
	}
	if k := os.Getenv("BERTH_KEY"); k != "" {
		f.keySource = "BERTH_KEY"
		return k, nil
	}
	explicit := f.changed != nil && f.changed("key-file")
	b, err := os.ReadFile(f.keyFile)
	switch {
	case err != nil && !explicit && errors.Is(err, fs.ErrNotExist):
		return "", badInput("no API key: set --key or BERTH_KEY, or start `berth dev` (it writes %s), or point --key-file at a key file", f.keyFile)
	case err != nil:
		return "", badInput("--key-file %s: cannot read the API key: %s", f.keyFile, pathProblem(err))
	}
	key := strings.TrimSpace(string(b))
	switch {
	case key == "":
		return "", badInput("--key-file %s is empty: it should hold the API key", f.keyFile)
	case strings.ContainsFunc(key, unicode.IsSpace):
		return "", badInput("--key-file %s holds more than one word: it should hold only the API key", f.keyFile)
	}
	f.keySource = "--key-file " + f.keyFile
	return key, nil
}

// explain rewords the errors a person needs context for: giving up after --wait (with the
// last code and the server's Retry-After), no answer from the server (which URL, why), and
// a 401 (where the key came from). exitCode still sees the error underneath.
func (f *clientFlags) explain(err error) error {
	var cu *client.CapacityUnavailable
	var te *client.TransportError
	var untrusted *tls.CertificateVerificationError
	var invalid x509.CertificateInvalidError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &cu):
		return &explained{msg: capacityMessage(cu, f.wait), err: err}
	case errors.As(err, &te) && strings.Contains(te.Err.Error(), "server gave HTTP response to HTTPS client"):
		return &usageError{err: &explained{msg: fmt.Sprintf("the Berth server at %s speaks plain HTTP, not TLS: use an http:// URL, or start the server with --tls-cert and --tls-key", te.Server), err: err}}
	case errors.As(err, &te) && errors.As(te.Err, &invalid) && (invalid.Reason == x509.Expired):
		return &explained{msg: fmt.Sprintf("the Berth server at %s presents a certificate that is expired or not yet valid (%s): renew it on the server, or check this machine's clock", te.Server, te.Reason()), err: err}
	case errors.As(err, &te) && errors.As(te.Err, &untrusted):
		// Exit 2: the same command fails the same way until --ca or --url changes.
		return &usageError{err: &explained{msg: fmt.Sprintf("the Berth server at %s presents a certificate this CLI does not trust (%s): "+
			"give --ca FILE (or BERTH_CA) naming the CA that signed it, and a --url whose host the certificate names", te.Server, te.Reason()), err: err}}
	case errors.As(err, &te) && berth.ErrorCode(err) == berth.EOutcomeUnknown:
		// Only an exec is so (client: runsTwice): it reached the server, or may have.
		return &explained{msg: fmt.Sprintf("the Berth server at %s took the exec, but no answer came back (%s): the command may have run; check before running it again",
			te.Server, te.Reason()), err: err}
	case errors.As(err, &te):
		if client.IsUnreachable(te) {
			return &explained{msg: fmt.Sprintf("cannot reach the Berth server at %s (%s)", te.Server, te.Reason()), err: err}
		}
		return &explained{msg: fmt.Sprintf("no answer from the Berth server at %s: %s", te.Server, te.Reason()), err: err}
	case berth.ErrorCode(err) == berth.EUnauthorized && f.keySource != "":
		return &explained{msg: fmt.Sprintf("%s (the key came from %s)", errorMessage(err), f.keySource), err: err}
	}
	return err
}

// capacityMessage says that the SDK gave up (SDK-2): on what, after how many attempts and
// how long, and the server's last Retry-After when it gave one (C30).
func capacityMessage(cu *client.CapacityUnavailable, wait time.Duration) string {
	attempts := fmt.Sprintf("%d attempts", cu.Attempts)
	if cu.Attempts == 1 {
		attempts = "1 attempt"
	}
	after := fmt.Sprintf("gave up after %s in %s (--wait %s)", attempts, cu.Elapsed.Round(time.Millisecond), wait)
	var te *client.TransportError
	if errors.As(cu.Err, &te) {
		return fmt.Sprintf("cannot reach the Berth server at %s (%s); %s", te.Server, te.Reason(), after)
	}
	what := "capacity unavailable"
	if cu.LastCode == berth.EUnavailable {
		what = "server unavailable"
	}
	last := cu.LastCode
	if cu.Last != nil {
		last = cu.Last.Error()
	}
	if cu.RetryAfter > 0 {
		after += fmt.Sprintf("; the server's last Retry-After was %s", cu.RetryAfter.Round(time.Second))
	}
	return fmt.Sprintf("%s: %s; %s; try again later", what, last, after)
}
