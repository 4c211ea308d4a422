package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/client"
)

// heldStdin is an exec's stdin of ~900 KB: two fit under a 2 MiB bound, three do not.
var heldStdin = strings.Repeat("a", 900_000)

// notUTF8Stdin is 400,000 bytes of 0xff, sent raw: a body of ~400 KB whose stdin decodes to
// 1.2 MB (each byte to U+FFFD, three bytes), which the replica holds and forwards.
var notUTF8Stdin = strings.Repeat("\xff", 400_000)

// heldBody is an exec request of `sh -c cmd` with heldStdin.
func heldBody(t *testing.T, cmd string) string {
	return execBodyRaw(t, cmd, heldStdin)
}

// execBodyRaw is an exec request of `sh -c cmd` whose stdin is the bytes of stdin as they
// are, unescaped: for ASCII letters the JSON a client sends, and for 0xff bytes a body that
// is not UTF-8, which the API takes (each such byte becomes U+FFFD).
func execBodyRaw(t *testing.T, cmd, stdin string) string {
	t.Helper()
	b, err := json.Marshal(berth.ExecRequest{Cmd: []string{"sh", "-c", cmd}})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(string(b), "}") + `,"stdin":"` + stdin + `"}`
}

// holdExecs starts n execs in sandbox id with key, each with stdin (raw), that run until
// /tmp/go exists in the sandbox, and returns once each has started (its marker file is
// there) — so each is in flight at the replica and the agent. The returned function writes
// /tmp/go and checks that each held exec then ends with 200.
func holdExecs(t *testing.T, st *devStack, key, id string, n int, stdin string) (finish func()) {
	t.Helper()
	codes := make(chan string, n)
	for i := range n {
		body := execBodyRaw(t, fmt.Sprintf("touch /tmp/started-%d; while [ ! -e /tmp/go ]; do sleep 0.05; done", i), stdin)
		go func() {
			code, _, b, err := post(st, key, "/v1/sandboxes/"+id+"/exec", body)
			codes <- fmt.Sprintf("%d %.200s %v", code, b, err)
		}()
	}
	c := client.New(st.URL, key)
	ctx := context.Background()
	released, ended := false, 0
	release := func() {
		if !released {
			released = true
			_ = c.WriteFile(ctx, id, "/tmp/go", nil)
		}
	}
	// Whatever happens, the held execs end before the stack does.
	t.Cleanup(func() {
		release()
		for ; ended < n; ended++ {
			<-codes
		}
	})
	waitFor(t, 60*time.Second, "held execs started", func() (bool, string) {
		for i := range n {
			if _, err := c.ReadFile(ctx, id, fmt.Sprintf("/tmp/started-%d", i)); err != nil {
				return false, err.Error()
			}
		}
		return true, ""
	})
	return func() {
		t.Helper()
		release()
		for ; ended < n; ended++ {
			if got := <-codes; !strings.HasPrefix(got, "200 ") {
				t.Errorf("a held exec ended with %s, want 200", got)
			}
		}
	}
}

// tenantWithSandbox makes tenant name, a key of it and a shell sandbox of it of memMiB MiB
// (0: the template's).
func tenantWithSandbox(t *testing.T, st *devStack, name string, memMiB int64) (key, id string) {
	t.Helper()
	ctx := context.Background()
	admin := adminClient(st)
	if _, err := admin.CreateTenant(ctx, name); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateAPIKey(ctx, name, berth.RoleTenant)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := client.New(st.URL, k.Key).CreateSandbox(ctx, berth.CreateRequest{Template: "shell", MemoryMiB: memMiB})
	if err != nil {
		t.Fatal(err)
	}
	return k.Key, sb.ID
}

// checkExecRefused posts an exec of `true` with stdin (raw) and wants 429 rate_limited,
// retryable, with a Retry-After and a message holding want.
func checkExecRefused(t *testing.T, st *devStack, key, id, stdin, want string) {
	t.Helper()
	code, h, b := rawPost(t, st, key, "/v1/sandboxes/"+id+"/exec", execBodyRaw(t, "true", stdin))
	var eb berth.ErrorBody
	_ = json.Unmarshal(b, &eb)
	if code != 429 || eb.Error.Code != berth.ERateLimited || !eb.Error.Retryable || h.Get("Retry-After") != "1" || !strings.Contains(eb.Error.Message, want) {
		t.Fatalf("one more large exec than fits: %d Retry-After %q %s; want 429 rate_limited, Retry-After 1, a message with %q",
			code, h.Get("Retry-After"), b, want)
	}
}

// TestExecsInFlightBoundedPerTenant: an exec holds its request (its stdin) until its command
// ends, so a burst of long execs with large stdin pinned memory in the replica without bound
// (150 execs of 900 KB: `berth dev` from 37 to 522 MB). With --tenant-exec-mb 2, a tenant's
// third ~900 KB exec while two run is 429 rate_limited with Retry-After — a small one still
// fits, another tenant is not affected, and once the two end the tenant's next one runs.
func TestExecsInFlightBoundedPerTenant(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.Bounds.TenantExecMiB = 2 })
	key, id := tenantWithSandbox(t, st, "burst", 0)
	finish := holdExecs(t, st, key, id, 2, heldStdin)
	checkExecRefused(t, st, key, id, heldStdin, `this one needs 878 KiB, over --tenant-exec-mb 2`)
	small, _ := json.Marshal(berth.ExecRequest{Cmd: []string{"true"}})
	if code, _, b := rawPost(t, st, key, "/v1/sandboxes/"+id+"/exec", string(small)); code != 200 {
		t.Errorf("a small exec beside the two held: %d %s, want 200 (the bound is bytes held, not a count)", code, b)
	}
	otherKey, otherID := tenantWithSandbox(t, st, "calm", 0)
	if code, _, b := rawPost(t, st, otherKey, "/v1/sandboxes/"+otherID+"/exec", heldBody(t, "true")); code != 200 {
		t.Errorf("another tenant's large exec: %d %.300s, want 200", code, b)
	}
	finish()
	if code, _, b := rawPost(t, st, key, "/v1/sandboxes/"+id+"/exec", heldBody(t, "true")); code != 200 {
		t.Errorf("a large exec after the held ones ended: %d %.300s, want 200", code, b)
	}
}

// TestExecsInFlightCountWhatTheReplicaHolds: the replica counts what it holds of an exec, not
// only its body (found by an attack: 64 execs of 1 MB of 0xff, each decoded to 3 MB, took a
// replica from 37 to 907 MB within a 64 MiB bound). Two execs of 400 KB of 0xff hold 2.4 MB
// once decoded — over a 2 MiB bound that their bodies alone (800 KB) would fit. And the
// replica's bound in all (--exec-inflight-mb) holds across tenants.
func TestExecsInFlightCountWhatTheReplicaHolds(t *testing.T) {
	t.Run("decoded", func(t *testing.T) {
		st := bootDev(t, func(c *devConfig) { c.Bounds.TenantExecMiB = 2 })
		key, id := tenantWithSandbox(t, st, "wide", 0)
		finish := holdExecs(t, st, key, id, 1, notUTF8Stdin)
		checkExecRefused(t, st, key, id, notUTF8Stdin, "over --tenant-exec-mb 2")
		finish()
	})
	t.Run("in all", func(t *testing.T) {
		st := bootDev(t, func(c *devConfig) {
			c.Bounds.TenantExecMiB, c.Bounds.ExecInflightMiB = 0, 2
			c.agentHook = func(_ int, a *agent.Config) { a.ExecInflightMiB = -1 } // the replica's is the one met
		})
		key, id := tenantWithSandbox(t, st, "one", 0)
		finish := holdExecs(t, st, key, id, 2, heldStdin)
		otherKey, otherID := tenantWithSandbox(t, st, "two", 0)
		checkExecRefused(t, st, otherKey, otherID, heldStdin, "this replica holds as many exec requests as it takes at once (--exec-inflight-mb 2)")
		finish()
	})
}

// TestExecsInFlightBoundedPerAgent: the agent bounds the exec requests it holds — in all
// (--exec-inflight-mb), whoever sends them, a host's own defence when many tenants or
// replicas send it long execs; and per sandbox, to 1/16 of its memory, since the sandbox's
// init holds each request several times over while it runs (a burst of 150 execs of 900 KB
// killed a 2 GiB gVisor sandbox; a 256 MiB one now takes 18 of them and refuses the rest).
// Its 429 reaches the caller as rate_limited with Retry-After, through the replica.
func TestExecsInFlightBoundedPerAgent(t *testing.T) {
	for _, tc := range []struct {
		name     string
		agentMiB int64 // --exec-inflight-mb
		sbMiB    int64 // the sandbox's memory
		held     int   // ~900 KB execs that fit
		want     string
	}{
		{"in all", 2, 0, 2, "agent dev-agent-1 holds as many exec requests as it takes at once (--exec-inflight-mb 2)"},
		{"per sandbox", 0, 64, 4, "over the 1/16 of its 64 MiB its host takes for it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := bootDev(t, func(c *devConfig) {
				c.Bounds.TenantExecMiB = 0 // no bound at the replica: the agent's is the one met
				c.agentHook = func(_ int, a *agent.Config) { a.ExecInflightMiB = tc.agentMiB }
			})
			key, id := tenantWithSandbox(t, st, "burst", tc.sbMiB)
			finish := holdExecs(t, st, key, id, tc.held, heldStdin)
			checkExecRefused(t, st, key, id, heldStdin, tc.want)
			finish()
			if code, _, b := rawPost(t, st, key, "/v1/sandboxes/"+id+"/exec", heldBody(t, "true")); code != 200 {
				t.Errorf("a large exec after the held ones ended: %d %.300s, want 200", code, b)
			}
		})
	}
}

// TestExecHoldsOnlyWhatRuns: the replica takes an exec's hold once its body is read and its
// sandbox found — found by an attack, the hold was taken from the Content-Length at once, so
// headers alone, for a sandbox that does not exist, filled the replica's bound and refused
// everyone's execs until the body timeout; and a request alone always fits a bound, even one
// whose decoded size is past it (the hold was taken in two steps, the second refused by the
// first).
func TestExecHoldsOnlyWhatRuns(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.Bounds.TenantExecMiB, c.Bounds.ExecInflightMiB = 1, 2 })
	key, id := tenantWithSandbox(t, st, "mine", 0)
	u := strings.TrimPrefix(st.URL, "http://")
	for i := range 3 { // 3 MiB of headers, over the replica's 2, for a sandbox nobody has
		c, err := net.Dial("tcp", u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/sandboxes/sb-nope-%d/exec HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: 1048576\r\n\r\n", i, u, st.AdminKey)
	}
	// A body whose stdin decodes to 1.2 MB, alone, over the tenant's 1 MiB: it runs.
	body := `{"cmd":["wc","-c"],"stdin":"` + notUTF8Stdin + `"}`
	code, _, b := rawPost(t, st, key, "/v1/sandboxes/"+id+"/exec", body)
	var res berth.ExecResult
	if code != 200 || json.Unmarshal(b, &res) != nil || strings.TrimSpace(res.Stdout) != "1200000" {
		t.Fatalf("an exec beside three header-only requests, alone over its tenant's bound: %d %.300s; want 200 and wc -c = 1200000", code, b)
	}
}
