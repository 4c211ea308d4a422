package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// TestPLC9_TinyMemoryNeverQuarantines (an attack on `berth dev` with gVisor, two agents): a
// tenant's create of 1 MiB failed to start on every host, each failure counted toward that
// host's quarantine (PLC-9), and three such creates took both hosts out of placement for every
// tenant; an app of 1 MiB kept them there. Now the tenant's tiny create and app are 400
// invalid_request naming the minimum, however often they are sent, no host counts a failure,
// and a sandbox at berth.MinSandboxMiB starts on the real runtime and runs python.
func TestPLC9_TinyMemoryNeverQuarantines(t *testing.T) {
	tinyMemoryNeverQuarantines(t, bootDev(t, func(c *devConfig) { c.Agents = 2 }))
}

// TestPLC9_TinyMemoryNeverQuarantinesGVisor is TestPLC9_TinyMemoryNeverQuarantines on the
// gVisor runtime, where the attack was found and whose floor is the higher one.
func TestPLC9_TinyMemoryNeverQuarantinesGVisor(t *testing.T) {
	tinyMemoryNeverQuarantines(t, bootGVisor(t, func(c *devConfig) { c.Agents = 2 }))
}

func tinyMemoryNeverQuarantines(t *testing.T, st *devStack) {
	ctx := context.Background()
	admin := adminClient(st)
	waitFor(t, 60*time.Second, "both agents registered", func() (bool, string) {
		as, err := admin.Agents(ctx)
		return err == nil && len(as) == 2, fmt.Sprintf("%d agents, %v", len(as), err)
	})
	if _, err := admin.CreateTenant(ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateAPIKey(ctx, "fz", berth.RoleTenant)
	if err != nil {
		t.Fatal(err)
	}
	tiny := []struct{ path, body string }{
		{"/v1/sandboxes", `{"template":"shell","memory_mb":1,"ttl_seconds":60}`},
		{"/v1/sandboxes", `{"template":"python","memory_mb":16,"ttl_seconds":60}`},
		{"/v1/apps", `{"name":"fz-tiny","template":"shell","memory_mb":1,"command":["sleep","1000"],"port":8080}`},
	}
	for range 4 {
		for _, r := range tiny {
			code, e := postAs(t, st, k.Key, r.path, r.body)
			if code != http.StatusBadRequest || e.Code != berth.EInvalidRequest || !strings.Contains(e.Message, "64") {
				t.Fatalf("POST %s %s: %d %+v; want 400 invalid_request naming the minimum of 64 MiB", r.path, r.body, code, e)
			}
		}
	}
	noneQuarantined(t, admin)
	tenant := client.New(st.URL, k.Key)
	for _, template := range []string{"shell", "python"} {
		sb, err := tenant.CreateSandbox(ctx, berth.CreateRequest{Template: template, MemoryMiB: berth.MinSandboxMiB, TTLSeconds: 60})
		if err != nil || sb.MemoryMiB != berth.MinSandboxMiB {
			t.Fatalf("%s at the floor: %+v, %v; want a %d MiB sandbox", template, sb, err, berth.MinSandboxMiB)
		}
		res, err := tenant.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"python3", "-c", "print(2+2)"}})
		if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "4" {
			t.Fatalf("python in a %d MiB %s sandbox: %+v, %v", berth.MinSandboxMiB, template, res, err)
		}
		if err := tenant.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	noneQuarantined(t, admin)
	if apps, err := tenant.Apps(ctx); err != nil || len(apps) != 0 {
		t.Fatalf("apps %+v, %v; want none written", apps, err)
	}
}

// postAs posts body to path with key, without any client retry, and returns the status and
// the error body (zero on success).
func postAs(t *testing.T, st *devStack, key, path, body string) (int, berth.ErrorDetail) {
	t.Helper()
	code, _, b := rawPost(t, st, key, path, body)
	var eb berth.ErrorBody
	_ = json.Unmarshal(b, &eb)
	return code, eb.Error
}

// noneQuarantined fails the test if any agent counts a failed create or is quarantined.
func noneQuarantined(t *testing.T, admin *client.Client) {
	t.Helper()
	as, err := admin.Agents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a.CreateFailures != 0 || !a.QuarantinedUntil.IsZero() || a.Status == berth.AgentQuarantined {
			t.Fatalf("agent %s: %d create failures, quarantined until %v, status %s; want none", a.AgentID, a.CreateFailures, a.QuarantinedUntil, a.Status)
		}
	}
}
