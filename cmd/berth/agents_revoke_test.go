package main

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-dev/berth/client"
)

// TestCLI_AgentsRevoke: `berth agents credentials` lists each dev agent's credential (never
// the secret) and `berth agents revoke ID` revokes it, after which the listing shows it
// revoked by an admin; an id that never joined is an invalid request (TRUST-1).
func TestCLI_AgentsRevoke(t *testing.T) {
	st := bootDev(t, nil)
	cli := func(args ...string) cliRun {
		t.Helper()
		return runCLI(t, "", append([]string{"--url", st.URL, "--key", st.AdminKey}, args...)...)
	}
	agents, err := client.New(st.URL, st.AdminKey).Agents(context.Background())
	if err != nil || len(agents) == 0 {
		t.Fatalf("agents: %v, %v", agents, err)
	}
	id := agents[0].AgentID
	if r := cli("agents", "credentials"); r.code != 0 || !strings.Contains(r.stdout, id) || strings.Contains(r.stdout, "admin") {
		t.Fatalf("agents credentials: exit %d, %q %s; want %s listed live", r.code, r.stdout, r.stderr, id)
	}
	if r := cli("agents", "revoke", id); r.code != 0 || !strings.Contains(r.stdout, "revoked "+id+" (1 ") {
		t.Fatalf("agents revoke %s: exit %d, %q %s", id, r.code, r.stdout, r.stderr)
	}
	if r := cli("agents", "credentials"); r.code != 0 || !strings.Contains(r.stdout, "admin") {
		t.Errorf("agents credentials after revoke: exit %d, %q; want %s revoked by admin", r.code, r.stdout, id)
	}
	if r := cli("agents", "revoke", "nosuch"); r.code != exitInvalid {
		t.Errorf("agents revoke nosuch: exit %d, want %d; stderr %q", r.code, exitInvalid, r.stderr)
	}
}
