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
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
)

// BenchmarkHeartbeatFleet is the fleet half of issue 16, goal 2 without the creates: agents
// (BERTH_BENCH_FLEET_AGENTS, default 10,000; 10 held sandboxes each) heartbeat every
// BERTH_BENCH_FLEET_INTERVAL (default 10 s) for BERTH_BENCH_FLEET_SECONDS (default 60), to
// two server replicas over one PostgreSQL (internal/pgtest), half on each, open loop: each
// agent's heartbeats are due at its own phase of the interval, whatever the answers' speed;
// 128 senders work the due ones off. The first heartbeat of each agent is its whole list, the
// rest are deltas changing one sandbox (mode=delta), or every one is the whole list
// (mode=whole, agents of the previous release). It reports ingest/s, how late heartbeats
// left (p99), the process's and PostgreSQL's CPU per heartbeat, and how many agents went
// longer than StaleAfter (30 s) between two acknowledged heartbeats (stale-agents): any is
// an agent wrongly marked stale. Bounded: the run stops at its deadline; only 127.0.0.1.
//
//	go test ./server -run '^$' -bench BenchmarkHeartbeatFleet -benchtime 1x -timeout 30m
func BenchmarkHeartbeatFleet(b *testing.B) {
	for _, mode := range []string{"delta", "whole"} {
		b.Run("mode="+mode, func(b *testing.B) { benchFleet(b, mode == "delta") })
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func benchFleet(b *testing.B, delta bool) {
	const held, senders = 10, 128
	agents := envInt("BERTH_BENCH_FLEET_AGENTS", 10000)
	interval := time.Duration(envInt("BERTH_BENCH_FLEET_INTERVAL", 10)) * time.Second
	run := time.Duration(envInt("BERTH_BENCH_FLEET_SECONDS", 60)) * time.Second
	ctx := context.Background()
	url := pgtest.Start(b).NewDatabase(b)
	var urls []string
	for range 2 {
		st, err := postgres.Open(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		cfg := DefaultConfig()
		cfg.NodeToken = "node-token"
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		srv := httptest.NewServer(New(cfg, st).Handler())
		b.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: senders, MaxConnsPerHost: senders}
	b.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: interval}
	post := func(url, path, cred string, body []byte) (int, []byte, error) {
		req, _ := http.NewRequest(http.MethodPost, url+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+cred)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out, nil
	}
	type fleetAgent struct {
		id, cred, url string
		seq           int64
		acked, busy   bool
		last          time.Time // when the latest acknowledged heartbeat's answer came
		maxGap        time.Duration
	}
	fleet := make([]*fleetAgent, agents)
	{ // join in parallel: one credential per agent (TRUST-1)
		var wg sync.WaitGroup
		next := make(chan int)
		for range 16 {
			wg.Go(func() {
				for i := range next {
					a := &fleetAgent{id: fmt.Sprintf("fleet-%05d", i), url: urls[i%2]}
					code, out, err := post(a.url, "/v1/agents/join", "node-token", []byte(`{"agent_id":"`+a.id+`"}`))
					if err != nil || code != http.StatusCreated {
						b.Errorf("join %s: %d %s %v", a.id, code, out, err)
						continue
					}
					var c struct{ Credential string }
					if err := json.Unmarshal(out, &c); err != nil || c.Credential == "" {
						b.Errorf("join %s: %s", a.id, out)
						continue
					}
					a.cred = c.Credential
					fleet[i] = a
				}
			})
		}
		for i := range agents {
			next <- i
		}
		close(next)
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
	}
	body := func(a *fleetAgent) []byte {
		a.seq++
		var w bytes.Buffer
		fmt.Fprintf(&w, `{"agent_id":%q,"address":"http://127.0.0.1:1","status":"active","cpu_total":2,`+
			`"memory_mb_total":65536,"memory_admission":"committed","memory_mb_admittable":60000,"intake_open":true,`+
			`"version":"bench","boot_id":"b1","seq":%d`, a.id, a.seq)
		changed := int(a.seq % held)
		if delta && a.acked {
			fmt.Fprintf(&w, `,"delta":true,"base_seq":%d,"sandboxes":[{"id":"%s-%d","resident_mb":%d,"measured":true}]}`,
				a.seq-1, a.id, changed, 100+a.seq)
			return w.Bytes()
		}
		w.WriteString(`,"sandboxes":[`)
		for i := range held {
			if i > 0 {
				w.WriteByte(',')
			}
			resident := int64(100)
			if i == changed {
				resident += a.seq
			}
			fmt.Fprintf(&w, `{"id":"%s-%d","resident_mb":%d,"measured":true}`, a.id, i, resident)
		}
		w.WriteString(`]}`)
		return w.Bytes()
	}
	type due struct {
		a  *fleetAgent
		at time.Time
	}
	var (
		mu       sync.Mutex
		late     []time.Duration
		done     int
		failures int
		skipped  int
	)
	work := make(chan due, agents)
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			for d := range work {
				lateBy := time.Since(d.at)
				mu.Lock()
				hb := body(d.a)
				mu.Unlock()
				code, out, err := post(d.a.url, "/v1/agents/heartbeat", d.a.cred, hb)
				now := time.Now()
				mu.Lock()
				d.a.busy = false
				late = append(late, lateBy)
				if err != nil || code/100 != 2 || bytes.Contains(out, []byte("resync")) { // 204: a server before issue 16
					failures++
					d.a.acked = false
				} else {
					done++
					d.a.acked = true
					if !d.a.last.IsZero() {
						d.a.maxGap = max(d.a.maxGap, now.Sub(d.a.last))
					}
					d.a.last = now
				}
				mu.Unlock()
			}
		})
	}
	// Open loop: agent i's k-th heartbeat is due at start + i/agents·interval + k·interval.
	// An agent whose previous heartbeat is still queued or in flight skips that beat
	// (skipped), as a real agent's single heartbeat loop does.
	self0, pg0 := selfCPU(), postgresCPU()
	start := time.Now()
	b.ResetTimer()
	for k := 0; ; k++ {
		for i, a := range fleet {
			at := start.Add(time.Duration(k)*interval + time.Duration(i)*interval/time.Duration(agents))
			if at.Sub(start) >= run {
				goto drained
			}
			if d := time.Until(at); d > 0 {
				time.Sleep(d) // real: the open-loop schedule waits for each heartbeat's due time
			}
			mu.Lock()
			busy := a.busy
			a.busy = true
			if busy {
				skipped++
			}
			mu.Unlock()
			if !busy {
				work <- due{a: a, at: at}
			}
		}
	}
drained:
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	self1, pg1 := selfCPU(), postgresCPU()
	slices.Sort(late)
	stale := 0
	for _, a := range fleet {
		if a.maxGap > 30*time.Second || a.last.IsZero() || time.Since(a.last) > 30*time.Second {
			stale++
		}
	}
	n := max(done, 1)
	b.ReportMetric(float64(done)/elapsed.Seconds(), "ingest/s")
	b.ReportMetric(float64(failures), "failed")
	b.ReportMetric(float64(skipped), "skipped")
	if len(late) > 0 {
		b.ReportMetric(float64(late[len(late)*99/100].Milliseconds()), "late-p99-ms")
	}
	b.ReportMetric(float64(self1-self0)/float64(n)/1e6, "process-ms/hb")
	b.ReportMetric(float64(pg1-pg0)/float64(n)/1e6, "pg-ms/hb")
	b.ReportMetric(float64(pg1-pg0)/elapsed.Seconds()/1e9, "pg-cores")
	b.ReportMetric(float64(stale), "stale-agents")
}
