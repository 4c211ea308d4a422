package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/noop"
	"github.com/spf13/cobra"
)

func newBenchCmd(cf *clientFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Load tools for measuring the control plane (loopback and your own fleet only)"}
	cmd.AddCommand(newBenchCreateCmd(cf), newBenchAgentsCmd(), newBenchAppCmd(cf), newBenchFleetCmd())
	return cmd
}

// benchConfig drives `berth bench create`.
type benchConfig struct {
	URLs       []string
	Key        string
	Clients    int
	Duration   time.Duration
	MaxCreates int
	Template   string
	MemoryMiB  int64
	Cleanup    bool
	// AfterCreates, when set, runs when the creates stopped, before the ledger is read and
	// the cleanup deletes (bench fleet reads the store's round trips there).
	AfterCreates func()
}

// benchResult is what one run measured. Latencies are of single attempts (no client retry).
type benchResult struct {
	Elapsed      time.Duration
	Attempts     int
	Created      int
	ByCode       map[string]int
	Latency      []time.Duration // of successful creates, sorted
	Outstanding  int             // reservations left when the creates stopped
	OutstandingM int64
	AfterCleanup int // reservations left after deleting what was created (-1: no cleanup)
}

func newBenchCreateCmd(cf *clientFlags) *cobra.Command {
	cfg := benchConfig{Clients: 32, Duration: 10 * time.Second, MaxCreates: 200000, Template: "shell", Cleanup: true}
	urls := ""
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Drive POST /v1/sandboxes with N concurrent clients for a bounded time; print creates/s, latency, refusals",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if urls == "" {
				urls = cf.url
			}
			cfg.URLs = strings.Split(urls, ",")
			key, err := cf.resolveKey()
			if err != nil {
				return err
			}
			cfg.Key = key
			res, err := runBenchCreate(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			res.print(cmd.OutOrStdout(), cfg)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&urls, "urls", "", "comma-separated server replica URLs, used round-robin (default --url)")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long to send creates (at most 10m)")
	f.IntVar(&cfg.MaxCreates, "max-creates", cfg.MaxCreates, "stop after this many attempts")
	f.StringVar(&cfg.Template, "template", cfg.Template, "template to create")
	f.Int64Var(&cfg.MemoryMiB, "memory-mb", 0, "memory of each sandbox, MiB (default: the template's)")
	f.BoolVar(&cfg.Cleanup, "cleanup", cfg.Cleanup, "delete every created sandbox at the end")
	return cmd
}

// runBenchCreate sends creates until the duration or the attempt bound runs out (both are
// enforced: the loop is bounded in count and time), then counts the ledger and cleans up.
func runBenchCreate(ctx context.Context, cfg benchConfig) (benchResult, error) {
	if cfg.Clients < 1 || cfg.Clients > 4096 || cfg.Duration <= 0 || cfg.Duration > 10*time.Minute || cfg.MaxCreates < 1 || len(cfg.URLs) == 0 {
		return benchResult{}, berth.Errorf(berth.EInvalidRequest, "need 1–4096 clients, a duration up to 10m, max-creates ≥ 1 and a URL")
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: cfg.Clients * 2, MaxIdleConnsPerHost: cfg.Clients * 2, IdleConnTimeout: time.Minute,
	}}
	body, _ := json.Marshal(berth.CreateRequest{Template: cfg.Template, MemoryMiB: cfg.MemoryMiB})
	var (
		next    atomic.Int64
		mu      sync.Mutex
		res     = benchResult{ByCode: map[string]int{}, AfterCleanup: -1}
		created []createdRef
	)
	deadline := time.Now().Add(cfg.Duration)
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.Clients {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				n := next.Add(1)
				if n > int64(cfg.MaxCreates) {
					return
				}
				url := cfg.URLs[int(n)%len(cfg.URLs)]
				t0 := time.Now()
				id, code := benchCreateOnce(ctx, hc, url, cfg.Key, body)
				d := time.Since(t0)
				mu.Lock()
				res.Attempts++
				if code == "" {
					res.Created++
					res.Latency = append(res.Latency, d)
					created = append(created, createdRef{url, id})
				} else {
					res.ByCode[code]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	slices.Sort(res.Latency)
	if cfg.AfterCreates != nil {
		cfg.AfterCreates()
	}
	res.Outstanding, res.OutstandingM = benchLedger(ctx, hc, cfg.URLs[0], cfg.Key)
	if cfg.Cleanup {
		cctx, cancel := context.WithTimeout(ctx, benchCleanupMax)
		benchCleanup(cctx, hc, cfg.Key, created, cfg.Clients)
		cancel()
		res.AfterCleanup, _ = benchLedger(ctx, hc, cfg.URLs[0], cfg.Key)
	}
	return res, nil
}

type createdRef struct{ url, id string }

func randomKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// benchCreateOnce sends one create and returns the sandbox id, or the error code ("transport"
// when no answer came).
func benchCreateOnce(ctx context.Context, hc *http.Client, url, key string, body []byte) (string, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/sandboxes", bytes.NewReader(body))
	if err != nil {
		return "", "transport"
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(berth.HeaderIdempotencyKey, randomKey())
	resp, err := hc.Do(req)
	if err != nil {
		return "", "transport"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode == http.StatusCreated {
		var sb berth.Sandbox
		if json.Unmarshal(b, &sb) == nil {
			return sb.ID, ""
		}
		return "", "bad_body"
	}
	var eb berth.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		return "", eb.Error.Code
	}
	return "", fmt.Sprintf("http_%d", resp.StatusCode)
}

// benchLedger returns the number and MiB of outstanding reservations (admin key needed).
func benchLedger(ctx context.Context, hc *http.Client, url, key string) (int, int64) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/reservations", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := hc.Do(req)
	if err != nil {
		return -1, 0
	}
	defer resp.Body.Close()
	var out struct {
		Reservations []berth.Reservation `json:"reservations"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
		return -1, 0
	}
	var mib int64
	for _, r := range out.Reservations {
		mib += r.MiB
	}
	return len(out.Reservations), mib
}

// benchCleanupMax bounds the clean-up's deletes; what is left after it stays (the report's
// ledger line after the clean-up shows it).
const benchCleanupMax = 2 * time.Minute

func benchCleanup(ctx context.Context, hc *http.Client, key string, created []createdRef, workers int) {
	ch := make(chan createdRef)
	var wg sync.WaitGroup
	for range min(workers, 64) {
		wg.Go(func() {
			for c := range ch {
				req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, c.url+"/v1/sandboxes/"+c.id, nil)
				req.Header.Set("Authorization", "Bearer "+key)
				if resp, err := hc.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}
	for _, c := range created {
		ch <- c
	}
	close(ch)
	wg.Wait()
}

func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

func (r benchResult) print(w io.Writer, cfg benchConfig) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "replicas\t%d\n", len(cfg.URLs))
	fmt.Fprintf(tw, "clients\t%d\n", cfg.Clients)
	fmt.Fprintf(tw, "elapsed\t%s\n", r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "attempts\t%d\n", r.Attempts)
	fmt.Fprintf(tw, "created\t%d\n", r.Created)
	fmt.Fprintf(tw, "creates/s\t%.0f\n", float64(r.Created)/r.Elapsed.Seconds())
	fmt.Fprintf(tw, "latency p50 / p90 / p99 / max\t%s / %s / %s / %s\n",
		pct(r.Latency, .5).Round(10*time.Microsecond), pct(r.Latency, .9).Round(10*time.Microsecond),
		pct(r.Latency, .99).Round(10*time.Microsecond), pct(r.Latency, 1).Round(10*time.Microsecond))
	codes := make([]string, 0, len(r.ByCode))
	for c := range r.ByCode {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	for _, c := range codes {
		fmt.Fprintf(tw, "refused %s\t%d\n", c, r.ByCode[c])
	}
	fmt.Fprintf(tw, "outstanding reservations at stop\t%d (%d MiB)\n", r.Outstanding, r.OutstandingM)
	if r.AfterCleanup >= 0 {
		fmt.Fprintf(tw, "outstanding reservations after cleanup\t%d\n", r.AfterCleanup)
	}
	_ = tw.Flush()
}

// newBenchAgentsCmd runs N agents with the no-op runtime in one process, for `bench create`.
func newBenchAgentsCmd() *cobra.Command {
	count, memMiB, prefix := 4, int64(1<<20), "noop-agent"
	var server string
	hb := time.Second
	cmd := &cobra.Command{
		Use:   "agents",
		Short: "Run N agents with the no-op benchmark runtime (runs nothing) until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token := os.Getenv("BERTH_NODE_TOKEN")
			if token == "" || server == "" {
				return errors.New("set --server and BERTH_NODE_TOKEN")
			}
			if count < 1 || count > 1000 {
				return berth.Errorf(berth.EInvalidRequest, "--count must be 1..1000")
			}
			log := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			var wg sync.WaitGroup
			for i := 1; i <= count; i++ {
				cfg := agent.DefaultConfig()
				cfg.ID = fmt.Sprintf("%s-%d", prefix, i)
				cfg.MemoryMiB, cfg.HeadroomMiB = memMiB, 0
				cfg.HeartbeatInterval = hb
				cfg.MaxStarts = 1024
				cfg.ServerURL, cfg.NodeToken, cfg.Logger = server, token, log
				a, err := agent.New(cfg, &noop.Runtime{})
				if err != nil {
					return err
				}
				wg.Go(func() { _ = a.Run(cmd.Context()) })
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d no-op agents heartbeating to %s\n", count, server)
			wg.Wait()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&server, "server", os.Getenv("BERTH_URL"), "server URL")
	f.IntVar(&count, "count", count, "number of agents")
	f.Int64Var(&memMiB, "memory-mb", memMiB, "memory budget of each agent, MiB")
	f.StringVar(&prefix, "prefix", prefix, "agent id prefix")
	f.DurationVar(&hb, "heartbeat-interval", hb, "heartbeat period")
	return cmd
}
