package main

// TLS flags of `berth server` and `berth agent` (issue 15, point 2; docs/DECISIONS.md "Trust
// model"): one rule for both listeners, and the warning a plaintext listener on the network
// earns.

import (
	"crypto/tls"
	"log/slog"
	"net"
	"net/url"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/tlsconf"
	"github.com/spf13/pflag"
)

// tlsFlags are a listener's --tls-cert and --tls-key.
type tlsFlags struct{ cert, key string }

func (t *tlsFlags) register(f *pflag.FlagSet, what string) {
	f.StringVar(&t.cert, "tls-cert", "", "PEM certificate (chain) "+what+" serves over TLS; re-read when the file changes, so a renewal needs no restart (with --tls-key)")
	f.StringVar(&t.key, "tls-key", "", "PEM private key of --tls-cert")
}

// config returns the listener's TLS configuration, nil when neither flag is given. One flag
// without the other, or files that do not form a certificate, are invalid_request (exit 2)
// before anything starts.
func (t tlsFlags) config(log *slog.Logger) (*tls.Config, error) {
	if t.cert == "" && t.key == "" {
		return nil, nil
	}
	if t.cert == "" || t.key == "" {
		return nil, berth.Errorf(berth.EInvalidRequest, "--tls-cert and --tls-key go together: give both or neither")
	}
	cert, err := tlsconf.LoadCertificate(t.cert, t.key, log)
	if err != nil {
		return nil, berth.Wrap(berth.EInvalidRequest, err, "--tls-cert/--tls-key")
	}
	return tlsconf.ServerConfig(cert), nil
}

// agentTLS is the TLS configuration `berth server` calls agents with: caFile's CA ("" the
// system's roots). An unusable file is invalid_request.
func agentTLS(caFile string) (*tls.Config, error) {
	cfg, err := tlsconf.ClientConfig(caFile)
	if err != nil {
		return nil, berth.Wrap(berth.EInvalidRequest, err, "--agent-ca")
	}
	return cfg, nil
}

// checkAgentServerURL holds `berth agent`'s --server to the TLS the agent was given (issue
// 15): with --ca or --tls-cert an http:// server is refused (invalid_request) — the join
// token and the credential would cross in clear to a server the operator meant to be
// encrypted — and a usable --ca is required to read; an http:// server beyond loopback
// without either is a warning.
func checkAgentServerURL(serverURL, caFile string, servesTLS bool, log *slog.Logger) error {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return berth.Errorf(berth.EInvalidRequest, "--server %q: want http://HOST:PORT or https://HOST:PORT", serverURL)
	}
	if u.Scheme == "http" {
		if caFile != "" || servesTLS {
			return berth.Errorf(berth.EInvalidRequest, "--server %s is http://, but this agent was given --ca or --tls-cert: use the server's https:// URL (the join token and credential would cross in clear)", serverURL)
		}
		if ip := net.ParseIP(u.Hostname()); (ip == nil || !ip.IsLoopback()) && u.Hostname() != "localhost" {
			log.Warn("--server is http:// on the network: the join token and this agent's credential cross it in clear; use https:// with --ca", "server", serverURL)
		}
		return nil
	}
	if caFile != "" {
		if _, err := tlsconf.CAPool(caFile); err != nil {
			return berth.Wrap(berth.EInvalidRequest, err, "--ca")
		}
	}
	return nil
}
