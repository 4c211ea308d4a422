package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// TestCLI_ExitCodesAndQuotaOnARealServer runs what only a real stack can answer: invalid
// requests the server finds exit 2; `sandbox exec` of a missing command exits 127 with the
// sandbox's own stderr and not a word from the CLI; `tenants quota NAME` shows the quota
// and changes nothing, and each flag sets only its own limit.
func TestCLI_ExitCodesAndQuotaOnARealServer(t *testing.T) {
	st := bootDev(t, nil)
	cli := func(args ...string) cliRun {
		t.Helper()
		return runCLI(t, "", append([]string{"--url", st.URL, "--key", st.AdminKey}, args...)...)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "create", "nosuch"}, "template_not_found"},
		{[]string{"sandbox", "create", "python", "--memory-mb", "99999999"}, "invalid_request"},
		{[]string{"sandbox", "get", "sb-nosuch"}, "sandbox_not_found"},
		{[]string{"apps", "get", "nosuch"}, "app_not_found"},
	} {
		if r := cli(tt.args...); r.code != exitInvalid {
			t.Errorf("%v: exit %d, want %d; stderr %q", tt.args, r.code, exitInvalid, r.stderr)
		} else {
			checkStderr(t, r.stderr, tt.want)
		}
	}

	r := cli("sandbox", "create", "-q", "shell")
	if r.code != 0 {
		t.Fatalf("create: exit %d, %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	res, err := client.New(st.URL, st.AdminKey).Exec(context.Background(), id, berth.ExecRequest{Cmd: []string{"nosuchcmd"}})
	if err != nil {
		t.Fatal(err)
	}
	r = cli("sandbox", "exec", id, "--", "nosuchcmd")
	if r.code != 127 || r.stderr != res.Stderr || r.stderr != "sandbox: nosuchcmd: command not found\n" {
		t.Errorf("exec nosuchcmd: exit %d, stderr %q; want 127 and the sandbox's own stderr %q verbatim", r.code, r.stderr, res.Stderr)
	}
	if r := cli("sandbox", "kill", id); r.code != 0 {
		t.Fatalf("kill: exit %d, %s", r.code, r.stderr)
	}
	if r := cli("sandbox", "exec", id, "--", "true"); r.code != exitFailure {
		t.Errorf("exec in a stopped sandbox: exit %d, want %d (conflict); stderr %q", r.code, exitFailure, r.stderr)
	} else {
		checkStderr(t, r.stderr, "conflict")
	}

	if r := cli("tenants", "create", "acme"); r.code != 0 {
		t.Fatalf("tenants create: exit %d, %s", r.code, r.stderr)
	}
	show := func() client.QuotaUsage {
		t.Helper()
		r := cli("tenants", "quota", "acme")
		var q client.QuotaUsage
		if err := json.Unmarshal([]byte(r.stdout), &q); r.code != 0 || err != nil {
			t.Fatalf("tenants quota acme: exit %d, %v: %q %s", r.code, err, r.stdout, r.stderr)
		}
		return q
	}
	if diff := cmp.Diff(client.QuotaUsage{Quota: berth.Quota{Tenant: "acme"}}, show()); diff != "" {
		t.Errorf("a new tenant's quota (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(client.QuotaUsage{Quota: berth.Quota{Tenant: "acme"}}, show()); diff != "" {
		t.Errorf("showing the quota changed it (-want +got):\n%s", diff)
	}
	for _, step := range []struct {
		flags []string
		want  berth.Quota
	}{
		{[]string{"--sandboxes", "2"}, berth.Quota{Tenant: "acme", MaxSandboxes: 2}},
		{[]string{"--memory-mb", "1024"}, berth.Quota{Tenant: "acme", MaxSandboxes: 2, MaxMemoryMiB: 1024}},
		{[]string{"--sandboxes", "0"}, berth.Quota{Tenant: "acme", MaxMemoryMiB: 1024}},
	} {
		r := cli(append([]string{"tenants", "quota", "acme"}, step.flags...)...)
		var set berth.Quota
		if err := json.Unmarshal([]byte(r.stdout), &set); r.code != 0 || err != nil {
			t.Fatalf("quota %v: exit %d, %v: %s", step.flags, r.code, err, r.stderr)
		}
		if diff := cmp.Diff(step.want, set); diff != "" {
			t.Errorf("quota %v printed (-want +got):\n%s", step.flags, diff)
		}
		if diff := cmp.Diff(step.want, show().Quota); diff != "" {
			t.Errorf("quota %v then stored (-want +got):\n%s", step.flags, diff)
		}
	}
	// An unknown tenant has no quota to show: not_found (exit 2), never "unlimited".
	if r := cli("tenants", "quota", "nosuch"); r.code != exitInvalid {
		t.Errorf("tenants quota nosuch: exit %d, stdout %q, stderr %q; want %d (not_found)", r.code, r.stdout, r.stderr, exitInvalid)
	}
}
