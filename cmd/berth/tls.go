package main

// TLS flags of `berth server` and `berth agent` (issue 15, point 2; docs/DECISIONS.md "Trust
// model"): one rule for both listeners, and the warning a plaintext listener on the network
// earns.

import (
	"crypto/tls"
	"log/slog"

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
