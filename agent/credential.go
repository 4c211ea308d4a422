package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// serverClient returns the client that speaks to the server as this agent (TRUST-1): its key
// is the agent's own credential, loaded from Config.CredentialFile or got by joining with the
// node (join) token at POST /v1/agents/join and then saved there (mode 0600). Errors are the
// join's: unauthorized (wrong join token), forbidden (an admin revoked this id).
func (a *Agent) serverClient(ctx context.Context) (*client.Client, error) {
	a.credMu.Lock()
	defer a.credMu.Unlock()
	if a.cred != nil {
		return a.cred, nil
	}
	if f := a.cfg.CredentialFile; f != "" {
		if b, err := os.ReadFile(f); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			a.cred = a.clientWithKey(strings.TrimSpace(string(b)))
			return a.cred, nil
		}
	}
	secret, err := a.clientWithKey(a.cfg.NodeToken).JoinAgent(ctx, a.cfg.ID)
	if err != nil {
		return nil, fmt.Errorf("join as %q: %w", a.cfg.ID, err)
	}
	if f := a.cfg.CredentialFile; f != "" {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err == nil {
			err = os.WriteFile(f, []byte(secret+"\n"), 0o600)
		}
		if err != nil {
			a.log.Warn("could not save the agent credential; a restart joins again", "file", f, "err", err)
		}
	}
	a.log.Info("joined the fleet", "credential_file", a.cfg.CredentialFile)
	a.cred = a.clientWithKey(secret)
	return a.cred, nil
}

// clientWithKey returns a client of the server that presents key and trusts
// Config.ServerCAFile.
func (a *Agent) clientWithKey(key string) *client.Client {
	var opts []client.Option
	if a.cfg.ServerCAFile != "" {
		opts = append(opts, client.WithCAFile(a.cfg.ServerCAFile))
	}
	return client.New(a.cfg.ServerURL, key, opts...)
}

// credentialRefused forgets the credential after the server answered 401 with it (revoked,
// or replaced by a later join for this id), so the next call joins again; a join an admin
// revoke refuses (403) leaves the agent silent.
func (a *Agent) credentialRefused(err error) {
	var be *berth.Error
	if !errors.As(err, &be) || be.Code != berth.EUnauthorized {
		return
	}
	a.credMu.Lock()
	defer a.credMu.Unlock()
	a.cred = nil
	if f := a.cfg.CredentialFile; f != "" {
		_ = os.Remove(f)
	}
}
