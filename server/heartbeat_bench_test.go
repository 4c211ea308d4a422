package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/cpustat"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
	"github.com/berth-dev/berth/store/sqlite"
)

// BenchmarkHeartbeat measures the server's CPU per heartbeat (issue 16, goal 2): a real
// server over real HTTP on 127.0.0.1, on SQLite (a file) and PostgreSQL (internal/pgtest),
// for one agent holding held=10, 100 and 1,000 running sandboxes, each heartbeat changing one
// sandbox's working set. "whole" posts the whole held list every time (every agent before
// issue 16, and an agent of that release after it); "delta" posts only the changed sandbox
// against the acknowledged seq. The bodies are encoded before the clock starts, so the
// process's CPU is the server's (and SQLite's); PostgreSQL's backends are measured apart.
//
//	go test ./server -run '^$' -bench BenchmarkHeartbeat -benchtime 300x -count 3
//
// Metrics: server-ms/op is this process's user+system CPU per heartbeat, pg-ms/op that of
// PostgreSQL's processes, and body-B the bytes posted per heartbeat. The file compiles
// against the tree before issue 16 too (it speaks raw JSON); there "delta" skips (400).
func BenchmarkHeartbeat(b *testing.B) {
	for _, db := range []string{"sqlite", "postgres"} {
		for _, held := range []int{10, 100, 1000} {
			for _, mode := range []string{"whole", "delta"} {
				b.Run(fmt.Sprintf("%s/held=%d/%s", db, held, mode), func(b *testing.B) {
					benchHeartbeat(b, db, held, mode == "delta")
				})
			}
		}
	}
}

func benchHeartbeat(b *testing.B, db string, held int, delta bool) {
	ctx := context.Background()
	var st berth.Store
	var err error
	var pgURL string
	if db == "sqlite" {
		st, err = sqlite.Open(ctx, filepath.Join(b.TempDir(), "berth.db"))
	} else {
		pgURL = pgtest.Start(b).NewDatabase(b)
		st, err = postgres.Open(ctx, pgURL)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	cfg := DefaultConfig()
	cfg.NodeToken = "node-token"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(New(cfg, st).Handler())
	b.Cleanup(srv.Close)
	cred := benchJoin(b, srv.URL, "a1")
	now := time.Now()
	for i := range held {
		sb := berth.Sandbox{ID: fmt.Sprintf("sb-%05d", i), Template: "python", Tenant: "acme", AgentID: "a1",
			State: berth.SandboxRunning, MemoryMiB: 256, VCPUs: 1, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := st.CreateSandbox(ctx, sb, "bench", now); err != nil {
			b.Fatal(err)
		}
	}
	head := `{"agent_id":"a1","address":"http://127.0.0.1:1","status":"active","cpu_total":2,` +
		`"memory_mb_total":1048576,"memory_admission":"committed","memory_mb_admittable":1000,` +
		`"intake_open":true,"version":"bench","boot_id":"b1","seq":`
	whole := func(seq int64) []byte {
		var w bytes.Buffer
		w.WriteString(head + strconv.FormatInt(seq, 10) + `,"sandboxes":[`)
		for i := range held {
			if i > 0 {
				w.WriteByte(',')
			}
			resident := int64(100)
			if int64(i) == seq%int64(held) {
				resident = 100 + seq // the one sandbox this heartbeat changes
			}
			fmt.Fprintf(&w, `{"id":"sb-%05d","resident_mb":%d,"measured":true}`, i, resident)
		}
		w.WriteString(`]}`)
		return w.Bytes()
	}
	deltaBody := func(seq int64) []byte {
		return fmt.Appendf(nil, `%s%d,"delta":true,"base_seq":%d,"sandboxes":[{"id":"sb-%05d","resident_mb":%d,"measured":true}]}`,
			head, seq, seq-1, seq%int64(held), 100+seq)
	}
	post := func(body []byte) (int, []byte) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/agents/heartbeat", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+cred)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	if code, out := post(whole(1)); code/100 != 2 {
		b.Fatalf("first heartbeat: %d %s", code, out)
	}
	if pgURL != "" {
		// A database in service has statistics (autovacuum): plan on them, not on an
		// empty table's guesses, and keep autovacuum's own analyze out of the measurement.
		c, err := pgx.Connect(ctx, pgURL)
		if err != nil {
			b.Fatal(err)
		}
		_, err = c.Exec(ctx, "ANALYZE")
		c.Close(ctx)
		if err != nil {
			b.Fatal(err)
		}
	}
	bodies := make([][]byte, b.N)
	for i := range bodies {
		if delta {
			bodies[i] = deltaBody(int64(i + 2))
		} else {
			bodies[i] = whole(int64(i + 2))
		}
	}
	if delta {
		if code, out := post(deltaBody(2)); code == http.StatusBadRequest {
			b.Skipf("this server takes no deltas: %s", out)
		} else if code != http.StatusOK || bytes.Contains(out, []byte("resync")) {
			b.Fatalf("delta: %d %s", code, out)
		}
		for i := range bodies { // seq 2 is spent: renumber from 3
			bodies[i] = deltaBody(int64(i + 3))
		}
	}
	var size int
	for _, body := range bodies {
		size += len(body)
	}
	time.Sleep(100 * time.Millisecond) // real: lets the first heartbeats' background AGT-6 round end before the clock starts
	self0, pg0 := selfCPU(), postgresCPU()
	b.ResetTimer()
	for _, body := range bodies {
		if code, out := post(body); code/100 != 2 || bytes.Contains(out, []byte("resync")) {
			b.Fatalf("heartbeat: %d %s", code, out)
		}
	}
	b.StopTimer()
	self1, pg1 := selfCPU(), postgresCPU()
	b.ReportMetric(float64(self1-self0)/float64(b.N)/1e6, "server-ms/op")
	if db == "postgres" {
		b.ReportMetric(float64(pg1-pg0)/float64(b.N)/1e6, "pg-ms/op")
	}
	b.ReportMetric(float64(size)/float64(b.N), "body-B")
}

// benchJoin gets agentID's credential (TRUST-1) with the node token.
func benchJoin(b *testing.B, baseURL, agentID string) string {
	req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/agents/join", strings.NewReader(`{"agent_id":"`+agentID+`"}`))
	req.Header.Set("Authorization", "Bearer node-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Credential string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Credential == "" {
		b.Fatalf("join %s: %d %v", agentID, resp.StatusCode, err)
	}
	return out.Credential
}

// selfCPU is this process's user+system CPU time in nanoseconds.
func selfCPU() int64 { return int64(cpustat.Self()) }

// postgresCPU sums the CPU time (ns) of the postgres servers this process started (each
// pgtest postmaster, a child of this process, with its backends); 0 when none.
func postgresCPU() int64 {
	pms, _ := cpustat.Children(os.Getpid(), "postgres")
	var sum int64
	for _, pm := range pms {
		d, _ := cpustat.Tree(pm)
		sum += int64(d)
	}
	return sum
}
