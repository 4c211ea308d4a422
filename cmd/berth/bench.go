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
	"github.com/berth-dev/berth/client"
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
	Elapsed  time.Duration
	Attempts int
	Created  int
	ByCode   map[string]int
	Latency  []time.Duration // of successful creates, sorted
	// Outstanding and OutstandingM are the reservations (count, MiB) left when the creates
	// stopped; LedgerErr says why they are unknown (then both are 0): GET /v1/reservations
	// needs an admin key.
	Outstanding  int
	OutstandingM int64
	LedgerErr    error
	// AfterCleanup is the reservations left after deleting what was created (-1: no cleanup);
	// AfterCleanupErr says why it is unknown after a cleanup (then it is 0).
	AfterCleanup    int
	AfterCleanupErr error
}

func newBenchCreateCmd(cf *clientFlags) *cobra.Command {
	cfg := benchConfig{Clients: 32, Duration: 10 * time.Second, MaxCreates: 200000, Template: "shell", Cleanup: true}
	urls := ""
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Drive POST /v1/sandboxes with N concurrent clients for a bounded time; print creates/s, latency, refusals",
		Long: "Drive POST /v1/sandboxes with --clients clients, round-robin over --urls (default --url), until --duration\n" +
			"(at most 10m) or --max-creates attempts run out; print creates/s, latency and refusals by code.\n\n" +
			"Every URL must be http://HOST:PORT or https://HOST:PORT: a bad one is refused before anything is sent (exit 2).\n" +
			"The run stops early, prints the error instead of a report, and deletes what it created (--cleanup) when:\n" +
			"  - an attempt gets no answer (connection refused, DNS, timeout) from a URL that has not answered any attempt\n" +
			"    yet: the server cannot be reached (exit 3). Once a URL has answered, its transport failures are counted\n" +
			"    as \"refused transport\" and the run goes on;\n" +
			"  - the server refuses a create with a 4xx other than 429 (401 unauthorized, 403 forbidden or\n" +
			"    tenant_over_quota, 404 template_not_found, 400 invalid_request…): every further create would be refused\n" +
			"    the same way. Exit 2 for 400/404/413 (a flag to fix, such as --template), else 1.\n" +
			"A 429 or 503 refusal is counted, not a stop: it is what a load test measures.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if urls == "" {
				u, err := cf.serverURL()
				if err != nil {
					return err
				}
				urls = u
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

// check refuses a run that cannot work as asked, naming the flag: --clients outside
// 1–4096, a --duration not in (0, 10m], --max-creates below 1, and a --urls entry that is
// not http(s)://HOST[:PORT] (a *usageError, exit 2).
func (c benchConfig) check() error {
	if err := checkLoad(c.Clients, c.Duration); err != nil {
		return err
	}
	switch {
	case c.MaxCreates < 1:
		return badInput("--max-creates %d: want 1 or more", c.MaxCreates)
	case len(c.URLs) == 0:
		return badInput("--urls: want at least one server URL")
	}
	for _, u := range c.URLs {
		if err := checkServerURL("--urls", u); err != nil {
			return err
		}
	}
	return nil
}

// checkLoad refuses a load `bench create` and `bench fleet` cannot drive, naming the flag:
// --clients outside 1–4096 or a --duration not in (0, 10m] (a *usageError, exit 2).
func checkLoad(clients int, duration time.Duration) error {
	switch {
	case clients < 1 || clients > 4096:
		return badInput("--clients %d: want 1–4096", clients)
	case duration <= 0 || duration > 10*time.Minute:
		return badInput("--duration %s: want more than 0 and at most 10m", duration)
	}
	return nil
}

// runBenchCreate sends creates until the duration or the attempt bound runs out (both are
// enforced: the loop is bounded in count and time), then counts the ledger and cleans up.
//
// It stops early and returns an error (after the cleanup of what it created, without
// reading the ledger) when the run could only measure a mistake:
//   - an attempt to a URL that has answered no attempt yet gets no answer: the
//     *client.TransportError (unreachable, exit 3, for connection refused, DNS or a timeout);
//   - a create is refused with a 4xx other than 429: the server's *berth.Error (exitCode maps
//     its code: 2 for 400/404/413, else 1), or an error saying the answer was not Berth's.
//
// A transport failure from a URL that has answered before, a 429 or a 5xx is counted in
// ByCode and the run goes on. Invalid cfg is a *usageError (check). When ctx ends (an
// interrupt), the creates in flight finish (each bounded by the HTTP client's 30 s), what was
// created is still deleted, and the error says the run was interrupted, wrapping ctx's cause.
func runBenchCreate(ctx context.Context, cfg benchConfig) (benchResult, error) {
	if err := cfg.check(); err != nil {
		return benchResult{}, err
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: cfg.Clients * 2, MaxIdleConnsPerHost: cfg.Clients * 2, IdleConnTimeout: time.Minute,
	}}
	body, _ := json.Marshal(berth.CreateRequest{Template: cfg.Template, MemoryMiB: cfg.MemoryMiB})
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var (
		next     atomic.Int64
		mu       sync.Mutex
		res      = benchResult{ByCode: map[string]int{}, AfterCleanup: -1}
		created  []createdRef
		answered = map[string]bool{} // URLs that answered an attempt (any status)
		stopErr  error
	)
	stop := func(err error) { // with mu held
		if stopErr == nil {
			stopErr = err
			stopRun()
		}
	}
	deadline := time.Now().Add(cfg.Duration)
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.Clients {
		wg.Go(func() {
			for runCtx.Err() == nil && time.Now().Before(deadline) {
				n := next.Add(1)
				if n > int64(cfg.MaxCreates) {
					return
				}
				url := cfg.URLs[int(n)%len(cfg.URLs)]
				t0 := time.Now()
				// Not cancelled by a stop or an interrupt: a create cut off in flight may still
				// land on the server, unknown to the cleanup (found by an attack: Ctrl-C left
				// sandboxes running). hc's timeout bounds it.
				a := benchCreateOnce(context.WithoutCancel(runCtx), hc, url, cfg.Key, body)
				d := time.Since(t0)
				mu.Lock()
				res.Attempts++
				switch {
				case a.code == "":
					res.Created++
					res.Latency = append(res.Latency, d)
					created = append(created, createdRef{url, a.id})
				case a.code == "transport" && !answered[url]:
					stop(a.err)
				case a.status >= 400 && a.status < 500 && a.status != http.StatusTooManyRequests:
					stop(a.err)
				default:
					res.ByCode[a.code]++
				}
				if a.code != "transport" {
					answered[url] = true
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
	interrupted := ctx.Err() != nil
	report := stopErr == nil && !interrupted
	if report {
		res.Outstanding, res.OutstandingM, res.LedgerErr = benchLedger(ctx, hc, cfg.URLs[0], cfg.Key)
	}
	if cfg.Cleanup { // after an interrupt too: bounded by benchCleanupMax, not by ctx
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), benchCleanupMax)
		benchCleanup(cctx, hc, cfg.Key, created, cfg.Clients)
		cancel()
		if report {
			res.AfterCleanup, _, res.AfterCleanupErr = benchLedger(ctx, hc, cfg.URLs[0], cfg.Key)
		}
	}
	switch {
	case stopErr != nil:
		return res, stopErr
	case interrupted:
		what := "what it created was deleted"
		if !cfg.Cleanup {
			what = fmt.Sprintf("%d sandboxes it created are left (--cleanup=false)", res.Created)
		}
		return res, fmt.Errorf("bench create interrupted after %d attempts; %s: %w", res.Attempts, what, context.Cause(ctx))
	}
	return res, nil
}

type createdRef struct{ url, id string }

func randomKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// benchAttempt is one create's outcome: the sandbox id, or the error code ("transport" when
// no answer came) with the HTTP status (0 without an answer) and the error to report should
// the run stop on it.
type benchAttempt struct {
	id, code string
	status   int
	err      error
}

// benchCreateOnce sends one create to url.
func benchCreateOnce(ctx context.Context, hc *http.Client, url, key string, body []byte) benchAttempt {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/sandboxes", bytes.NewReader(body))
	if err != nil {
		return benchAttempt{code: "transport", err: err}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(berth.HeaderIdempotencyKey, randomKey())
	resp, err := hc.Do(req)
	if err != nil {
		return benchAttempt{code: "transport", err: &client.TransportError{Method: http.MethodPost, Path: "/v1/sandboxes", Server: url, Err: err}}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode == http.StatusCreated {
		var sb berth.Sandbox
		if json.Unmarshal(b, &sb) == nil {
			return benchAttempt{id: sb.ID}
		}
		return benchAttempt{code: "bad_body", status: resp.StatusCode,
			err: fmt.Errorf("POST %s/v1/sandboxes answered 201 with a body that is not a sandbox", url)}
	}
	if be := berthError(b); be != nil {
		return benchAttempt{code: be.Code, status: resp.StatusCode, err: be}
	}
	return benchAttempt{code: fmt.Sprintf("http_%d", resp.StatusCode), status: resp.StatusCode,
		err: fmt.Errorf("POST %s/v1/sandboxes answered HTTP %d without a Berth error: is it a Berth server?", url, resp.StatusCode)}
}

// berthError reads an answer's body as Berth's error body, or returns nil when it is not one.
func berthError(body []byte) *berth.Error {
	eb, ok := berth.ParseErrorBody(body)
	if !ok {
		return nil
	}
	return &berth.Error{Code: eb.Error.Code, Message: eb.Error.Message}
}

// benchLedger returns the number and MiB of outstanding reservations, or why they could not
// be read: no answer, or a refusal (GET /v1/reservations needs an admin key).
func benchLedger(ctx context.Context, hc *http.Client, url, key string) (int, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/reservations", nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("no answer from %s: %s", url, (&client.TransportError{Err: err}).Reason())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode != http.StatusOK {
		what := fmt.Sprintf("HTTP %d", resp.StatusCode)
		if be := berthError(b); be != nil {
			what = be.Code
		}
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			return 0, 0, fmt.Errorf("GET /v1/reservations answered %s: it needs an admin key", what)
		}
		return 0, 0, fmt.Errorf("GET /v1/reservations answered %s", what)
	}
	var out struct {
		Reservations []berth.Reservation `json:"reservations"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return 0, 0, errors.New("GET /v1/reservations answered a body that is not a list of reservations")
	}
	var mib int64
	for _, r := range out.Reservations {
		mib += r.MiB
	}
	return len(out.Reservations), mib, nil
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
	if r.LedgerErr != nil {
		fmt.Fprintf(tw, "outstanding reservations at stop\tunknown (%v)\n", r.LedgerErr)
	} else {
		fmt.Fprintf(tw, "outstanding reservations at stop\t%d (%d MiB)\n", r.Outstanding, r.OutstandingM)
	}
	switch {
	case r.AfterCleanupErr != nil:
		fmt.Fprintf(tw, "outstanding reservations after cleanup\tunknown (%v)\n", r.AfterCleanupErr)
	case r.AfterCleanup >= 0:
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
				return badInput("set --server and BERTH_NODE_TOKEN")
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
