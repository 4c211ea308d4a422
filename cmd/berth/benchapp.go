package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// benchAppConfig drives `berth bench app`.
type benchAppConfig struct {
	URL, App string
	Requests int
	Clients  int
	Wakes    int // hibernate → first request rounds measured before the requests
}

// benchAppResult is what one run measured: the wake latencies (hibernated app → its first
// answer) and the latencies of requests to the running app through Berth, both sorted.
type benchAppResult struct {
	Wakes    []time.Duration
	Latency  []time.Duration
	Failed   int
	Elapsed  time.Duration
	LastFail string
}

func newBenchAppCmd(cf *clientFlags) *cobra.Command {
	cfg := benchAppConfig{Requests: 2000, Clients: 8, Wakes: 5}
	cmd := &cobra.Command{
		Use:   "app NAME",
		Short: "Measure an app through Berth: wake latency from hibernated, then request latency and rate (APP-1)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			cfg.URL, cfg.App = cf.url, args[0]
			res, err := runBenchApp(cmd.Context(), c, cfg)
			if err != nil {
				return err
			}
			res.print(cmd.OutOrStdout(), cfg)
			return nil
		},
	}
	cmd.Flags().IntVar(&cfg.Requests, "requests", cfg.Requests, "GET requests to the running app (1..1,000,000)")
	cmd.Flags().IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients (1..1024)")
	cmd.Flags().IntVar(&cfg.Wakes, "wakes", cfg.Wakes, "hibernate-then-request rounds to time first (0..100)")
	return cmd
}

// runBenchApp measures cfg.App: Wakes rounds of hibernate, wait until hibernated, time one
// GET (held while the app wakes); then Requests GETs of / from Clients workers. Every loop
// is bounded in count and by a 10-minute overall deadline.
func runBenchApp(ctx context.Context, c *client.Client, cfg benchAppConfig) (benchAppResult, error) {
	var res benchAppResult
	switch {
	case cfg.Requests < 1 || cfg.Requests > 1_000_000:
		return res, berth.Errorf(berth.EInvalidRequest, "--requests must be 1..1000000")
	case cfg.Clients < 1 || cfg.Clients > 1024:
		return res, berth.Errorf(berth.EInvalidRequest, "--clients must be 1..1024")
	case cfg.Wakes < 0 || cfg.Wakes > 100:
		return res, berth.Errorf(berth.EInvalidRequest, "--wakes must be 0..100")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	target := strings.TrimRight(cfg.URL, "/") + "/apps/" + cfg.App + "/"
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Clients}}
	get := func() (time.Duration, error) {
		start := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return 0, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: %s", target, resp.Status)
		}
		return time.Since(start), nil
	}
	if _, err := c.App(ctx, cfg.App); err != nil {
		return res, err
	}
	for range cfg.Wakes {
		if _, err := c.SetApp(ctx, cfg.App, "hibernate"); err != nil {
			return res, err
		}
		for a, err := c.App(ctx, cfg.App); err != nil || a.State != berth.AppHibernated; a, err = c.App(ctx, cfg.App) {
			if err != nil {
				return res, err
			}
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		d, err := get()
		if err != nil {
			return res, fmt.Errorf("wake: %w", err)
		}
		res.Wakes = append(res.Wakes, d)
	}
	if _, err := get(); err != nil { // make sure it runs (and warm the connection pool)
		return res, err
	}
	jobs := make(chan struct{}, cfg.Requests)
	for range cfg.Requests {
		jobs <- struct{}{}
	}
	close(jobs)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.Clients {
		wg.Go(func() {
			for range jobs {
				d, err := get()
				mu.Lock()
				if err != nil {
					res.Failed++
					res.LastFail = err.Error()
				} else {
					res.Latency = append(res.Latency, d)
				}
				mu.Unlock()
				if ctx.Err() != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	slices.Sort(res.Wakes)
	slices.Sort(res.Latency)
	return res, nil
}

func (r benchAppResult) print(w io.Writer, cfg benchAppConfig) {
	if len(r.Wakes) > 0 {
		fmt.Fprintf(w, "wake (hibernated → first answer), %d rounds: min %v  p50 %v  max %v\n", len(r.Wakes),
			r.Wakes[0].Round(time.Millisecond), pct(r.Wakes, 0.5).Round(time.Millisecond), r.Wakes[len(r.Wakes)-1].Round(time.Millisecond))
	}
	rate := float64(len(r.Latency)) / r.Elapsed.Seconds()
	fmt.Fprintf(w, "requests: %d ok, %d failed, %d clients, %.0f req/s; latency p50 %v  p99 %v  max %v\n",
		len(r.Latency), r.Failed, cfg.Clients, rate, pct(r.Latency, 0.5).Round(time.Microsecond),
		pct(r.Latency, 0.99).Round(time.Microsecond), pct(r.Latency, 1).Round(time.Microsecond))
	if r.Failed > 0 {
		fmt.Fprintf(w, "last failure: %s\n", r.LastFail)
	}
}
