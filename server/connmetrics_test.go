package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
)

// TestStoreConnectionMetrics: a replica exports its store pool (berth_store_connections_max,
// _in_use, berth_store_connection_waits_total, _wait_seconds_total), and a store call that
// had to wait for a connection is counted. Real PostgreSQL with a pool of one connection: a
// heartbeat holds it, blocked on its agent's row, which the test locks from a connection of
// its own; a read waits for the pool meanwhile.
func TestStoreConnectionMetrics(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.Start(t).NewDatabase(t)
	u, err := url.Parse(dbURL)
	must(t, err)
	q := u.Query()
	q.Set("pool_max_conns", "1")
	u.RawQuery = q.Encode()
	st, err := postgres.Open(ctx, u.String())
	must(t, err)
	t.Cleanup(func() { st.Close() })
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(New(cfg, st).Handler())
	t.Cleanup(srv.Close)
	scrape := func() map[string]float64 {
		t.Helper()
		resp, err := http.Get(srv.URL + "/metrics")
		must(t, err)
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		must(t, err)
		out := map[string]float64{}
		for _, name := range []string{"berth_store_connections_max", "berth_store_connections_in_use",
			"berth_store_connection_waits_total", "berth_store_connection_wait_seconds_total"} {
			f, ok := fams[name]
			if !ok || len(f.GetMetric()) != 1 {
				t.Fatalf("/metrics lacks %s", name)
			}
			m := f.GetMetric()[0]
			if f.GetType() == dto.MetricType_COUNTER {
				out[name] = m.GetCounter().GetValue()
			} else {
				out[name] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	if m := scrape(); m["berth_store_connections_max"] != 1 {
		t.Fatalf("berth_store_connections_max = %v, want 1 (pool_max_conns)", m["berth_store_connections_max"])
	}

	hb := berth.Heartbeat{AgentID: "a1", Address: "http://127.0.0.1:1", Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096, CPUTotal: 2, BootID: "b1", Seq: 1}
	_, err = st.ApplyHeartbeat(ctx, hb, time.Now())
	must(t, err)
	before := st.ConnStats().Waits

	lock, err := pgx.Connect(ctx, dbURL)
	must(t, err)
	t.Cleanup(func() { lock.Close(context.Background()) })
	tx, err := lock.Begin(ctx)
	must(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM agents WHERE id = 'a1' FOR UPDATE`)
	must(t, err)
	done := make(chan error, 2)
	go func() {
		hb.Seq = 2
		_, err := st.ApplyHeartbeat(ctx, hb, time.Now())
		done <- err
	}()
	waitUntil(t, "the heartbeat to hold the pool's one connection", func() (bool, string) {
		return st.ConnStats().InUse == 1, fmt.Sprintf("%+v", st.ConnStats())
	})
	go func() {
		_, err := st.Sandbox(ctx, "sb-none")
		if err != nil && !strings.Contains(err.Error(), "not found") {
			done <- err
			return
		}
		done <- nil
	}()
	waitUntil(t, "the read to wait for a connection", func() (bool, string) {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "puddle/v2.(*Pool[...]).acquire"), "no goroutine in the pool's acquire"
	})
	must(t, tx.Rollback(ctx))
	for range 2 {
		must(t, <-done)
	}
	m := scrape()
	if got := st.ConnStats().Waits - before; got < 1 || m["berth_store_connection_waits_total"] < float64(before+1) ||
		m["berth_store_connection_wait_seconds_total"] <= 0 {
		t.Errorf("after a read waited for the pool's one connection: %d new waits, metrics %v; want ≥ 1 counted, with its wait", got, m)
	}
}
