package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// C01: a Retry-After HTTP-date is honoured to the second, a past date means retry at once,
// and a date beyond the deadline ends the call without sleeping.
func TestCase_C01_RetryAfterHTTPDate(t *testing.T) {
	ctx := context.Background()
	created := reply{status: 201, body: sandboxJSON}
	inSeven := func() string { return time.Now().Add(7 * time.Second).UTC().Format(http.TimeFormat) }

	t.Run("7 s ahead, read against the server's Date", func(t *testing.T) {
		srv, s := newScripted(t, refusal(inSeven()), created)
		// The client's clock is years off: only the Date header can give the right wait.
		clk := newFakeClock(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
		sb, err := New(srv.URL, "k", WithClock(clk)).CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
		if err != nil {
			t.Fatalf("CreateSandbox: %v", err)
		}
		if diff := cmp.Diff(sandboxWant, sb); diff != "" {
			t.Errorf("sandbox (-want +got):\n%s", diff)
		}
		checkSevenSeconds(t, clk.Sleeps())
		if n := len(s.Seen()); n != 2 {
			t.Errorf("server saw %d requests, want 2", n)
		}
	})

	t.Run("7 s ahead, no Date header: read against the client's clock", func(t *testing.T) {
		noDate := refusal(inSeven())
		noDate.header["Date"] = ""
		srv, _ := newScripted(t, noDate, created)
		clk := newFakeClock(time.Now())
		if _, err := New(srv.URL, "k", WithClock(clk)).CreateSandbox(ctx, berth.CreateRequest{Template: "python"}); err != nil {
			t.Fatalf("CreateSandbox: %v", err)
		}
		checkSevenSeconds(t, clk.Sleeps())
	})

	t.Run("1 h in the past: retry at once", func(t *testing.T) {
		past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
		srv, s := newScripted(t, refusal(past), created)
		clk := newFakeClock(time.Now())
		if _, err := New(srv.URL, "k", WithClock(clk)).CreateSandbox(ctx, berth.CreateRequest{Template: "python"}); err != nil {
			t.Fatalf("CreateSandbox: %v", err)
		}
		if diff := cmp.Diff([]time.Duration{0}, clk.Sleeps()); diff != "" {
			t.Errorf("sleeps (-want +got):\n%s", diff)
		}
		if n := len(s.Seen()); n != 2 {
			t.Errorf("server saw %d requests, want 2", n)
		}
	})

	t.Run("past dates forever: never two immediate retries in a row", func(t *testing.T) {
		past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
		srv, _ := newScripted(t, refusal(past))
		clk := newFakeClock(time.Now())
		c := New(srv.URL, "k", WithClock(clk), WithRand(half), WithDeadline(2*time.Second))
		_, err := c.Sandbox(ctx, "sb-1")
		if !IsCapacityUnavailable(err) {
			t.Fatalf("err = %v, want CapacityUnavailable", err)
		}
		// at once, jitter(window 0.5 s), at once, jitter(window 2 s), at once; the next
		// jittered wait (window 8 s → 4 s) would pass the deadline.
		want := []time.Duration{0, 250 * time.Millisecond, 0, time.Second, 0}
		if diff := cmp.Diff(want, clk.Sleeps()); diff != "" {
			t.Errorf("sleeps (-want +got):\n%s", diff)
		}
	})

	t.Run("7 s ahead but the deadline is 5 s: stop without sleeping", func(t *testing.T) {
		srv, s := newScripted(t, refusal(inSeven()))
		clk := newFakeClock(time.Now())
		c := New(srv.URL, "k", WithClock(clk), WithDeadline(5*time.Second))
		_, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
		var cu *CapacityUnavailable
		if !errors.As(err, &cu) {
			t.Fatalf("err = %v, want *CapacityUnavailable", err)
		}
		if cu.Attempts != 1 || cu.Elapsed != 0 || cu.LastCode != berth.ENoCapacity {
			t.Errorf("got %+v, want 1 attempt, 0 elapsed, last code no_capacity", cu)
		}
		if len(clk.Sleeps()) != 0 || len(s.Seen()) != 1 {
			t.Errorf("sleeps %v, requests %d; want none and 1", clk.Sleeps(), len(s.Seen()))
		}
	})

	t.Run("repeated 7 s dates: the sleeps never add up past the deadline", func(t *testing.T) {
		srv, s := newScripted(t, refusal(inSeven()))
		clk := newFakeClock(time.Now())
		c := New(srv.URL, "k", WithClock(clk), WithDeadline(30*time.Second))
		_, err := c.Sandbox(ctx, "sb-1")
		var cu *CapacityUnavailable
		if !errors.As(err, &cu) {
			t.Fatalf("err = %v, want *CapacityUnavailable", err)
		}
		var total time.Duration
		for _, d := range clk.Sleeps() {
			total += d
		}
		if total > 30*time.Second || total < 20*time.Second {
			t.Errorf("slept %v in all (%v), want within [20 s, 30 s]", total, clk.Sleeps())
		}
		if cu.Elapsed != total || cu.Attempts != len(s.Seen()) || cu.Attempts != len(clk.Sleeps())+1 {
			t.Errorf("got %+v after sleeps %v and %d requests", cu, clk.Sleeps(), len(s.Seen()))
		}
	})
}

// checkSevenSeconds checks one sleep of 7 s give or take the date's 1 s resolution.
func checkSevenSeconds(t *testing.T, sleeps []time.Duration) {
	t.Helper()
	if len(sleeps) != 1 || sleeps[0] < 6*time.Second || sleeps[0] > 8*time.Second {
		t.Errorf("sleeps = %v, want one of about 7 s (6–8 s)", sleeps)
	}
}

// C02: a negative, garbage or unparseable Retry-After is treated as absent: the wait is the
// jittered one (exactly half the first window with the fixed source), never years. (A huge
// but well-formed one is a real hint past the deadline: C30.)
func TestCase_C02_BadRetryAfterFallsBackToJitter(t *testing.T) {
	for _, v := range []string{"-3", "soon", "1.5", "+5", "1e9", "Fri, 32 Dec 2030 23:59:59 GMT"} {
		t.Run(v, func(t *testing.T) {
			srv, _ := newScripted(t, refusal(v), reply{status: 201, body: sandboxJSON})
			clk := newFakeClock(time.Now())
			c := New(srv.URL, "k", WithClock(clk), WithRand(half))
			if _, err := c.CreateSandbox(context.Background(), berth.CreateRequest{Template: "python"}); err != nil {
				t.Fatalf("CreateSandbox: %v", err)
			}
			want := []time.Duration{DefaultBackoffBase / 2}
			if diff := cmp.Diff(want, clk.Sleeps()); diff != "" {
				t.Errorf("sleeps (-want +got):\n%s", diff)
			}
		})
	}
}

// C05: 50 clients refused at the same instant, without Retry-After, do not come back as one
// wave: with the real random source their first waits spread over the window.
func TestCase_C05_SimultaneousRefusalsSpreadOut(t *testing.T) {
	srv, s := newScripted(t, refusal(""))
	const n = 50
	errStop := errors.New("stop after the first wait")
	waits := make([]time.Duration, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		clk := newFakeClock(time.Now())
		clk.onSleep = func(_ context.Context, d time.Duration) error {
			waits[i] = d
			return errStop
		}
		c := New(srv.URL, "k", WithClock(clk)) // default math/rand/v2 source
		wg.Go(func() {
			<-start
			if _, err := c.CreateSandbox(context.Background(), berth.CreateRequest{Template: "python"}); !errors.Is(err, errStop) {
				t.Errorf("client %d: err = %v, want the fake clock's stop", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if got := len(s.Seen()); got != n {
		t.Fatalf("server saw %d requests, want %d", got, n)
	}
	if p := spreadProblems(waits, Backoff(0, DefaultBackoffBase, DefaultBackoffCap)); len(p) > 0 {
		t.Errorf("first waits %v are not spread over the window: %v", waits, p)
	}
}

// spreadProblems says why waits (n ≥ 50 samples) do not look spread over [0, window). Each
// bound fails for truly uniform samples with probability below 1e-7:
// at least 6 of 10 buckets used, no bucket with more than 40 %, and max−min ≥ window/2.
func spreadProblems(waits []time.Duration, window time.Duration) []string {
	var problems []string
	var buckets [10]int
	for _, w := range waits {
		if w < 0 || w >= window {
			problems = append(problems, fmt.Sprintf("wait %v outside [0, %v)", w, window))
			continue
		}
		buckets[int(int64(w)*10/int64(window))]++
	}
	used := 0
	for _, b := range buckets {
		if b > 0 {
			used++
		}
	}
	if used < 6 {
		problems = append(problems, fmt.Sprintf("only %d of 10 buckets used: %v", used, buckets))
	}
	if m := slices.Max(buckets[:]); m*10 > len(waits)*4 {
		problems = append(problems, fmt.Sprintf("%d of %d waits in one bucket: %v", m, len(waits), buckets))
	}
	if spread := slices.Max(waits) - slices.Min(waits); spread < window/2 {
		problems = append(problems, fmt.Sprintf("spread %v below half the window %v", spread, window))
	}
	return problems
}

// The C05 check must be able to fail: one wave, a narrow band and an evenly spread set.
func TestSpreadProblems(t *testing.T) {
	const window = 250 * time.Millisecond
	wave := slices.Repeat([]time.Duration{window / 2}, 50)
	band := make([]time.Duration, 50)
	even := make([]time.Duration, 50)
	for i := range 50 {
		band[i] = window/2 + time.Duration(i)*time.Millisecond/2
		even[i] = time.Duration(i) * window / 50
	}
	if p := spreadProblems(wave, window); len(p) == 0 {
		t.Errorf("one wave reported as spread")
	}
	if p := spreadProblems(band, window); len(p) == 0 {
		t.Errorf("a 25 ms band reported as spread")
	}
	if p := spreadProblems(even, window); len(p) != 0 {
		t.Errorf("an even spread reported as a wave: %v", p)
	}
}

// C30: a Retry-After that ends past the caller's deadline ends the call at once with
// ErrCapacityUnavailable, whatever its size: one attempt, no sleep, no jittered hammering,
// no overflow (SDK-1, SDK-2). Hints that end within the deadline are still slept out.
func TestCase_C30_RetryAfterPastTheDeadline(t *testing.T) {
	ctx := context.Background()
	const deadline = 90 * time.Second
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	dated := func(v string) reply { // a refusal whose Date header is the fake clock's now
		r := refusal(v)
		r.header["Date"] = now.Format(http.TimeFormat)
		return r
	}
	for _, v := range []string{
		"86400", "86401", "20251231", "91",
		"99999999999999999999",           // twenty nines
		"9223372037",                     // one second more than a time.Duration holds
		"000000000000000000000000000091", // leading zeros do not make it long
		"999999999999999999999999999999999999999999999999999999999999",
		now.Add(91 * time.Second).Format(http.TimeFormat),
		"Fri, 31 Dec 9999 23:59:59 GMT",
	} {
		t.Run("gives up: "+v, func(t *testing.T) {
			srv, s := newScripted(t, dated(v)) // refuses every attempt the same way
			clk := newFakeClock(now)
			c := New(srv.URL, "k", WithClock(clk), WithRand(half), WithDeadline(deadline))
			_, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
			if !errors.Is(err, ErrCapacityUnavailable) {
				t.Fatalf("err = %v, want ErrCapacityUnavailable", err)
			}
			var cu *CapacityUnavailable
			if !errors.As(err, &cu) {
				t.Fatalf("errors.As(%v, *CapacityUnavailable) failed", err)
			}
			got := struct {
				Attempts, Requests, Sleeps int
				Elapsed                    time.Duration
				LastCode                   string
				HintPastDeadline           bool
			}{cu.Attempts, len(s.Seen()), len(clk.Sleeps()), cu.Elapsed, cu.LastCode, cu.RetryAfter > deadline}
			want := got
			want.Attempts, want.Requests, want.Sleeps, want.Elapsed, want.LastCode, want.HintPastDeadline = 1, 1, 0, 0, berth.ENoCapacity, true
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if !strings.Contains(err.Error(), "Retry-After") {
				t.Errorf("message %q does not give the server's Retry-After", err)
			}
		})
	}

	// Hints that end within the deadline are honoured as before: exactly that long, then the
	// next attempt, which succeeds.
	for _, tt := range []struct {
		v    string
		want []time.Duration
	}{
		{"0", []time.Duration{0}},
		{"7", []time.Duration{7 * time.Second}},
		{"007", []time.Duration{7 * time.Second}},
		{"90", []time.Duration{90 * time.Second}}, // ends at the deadline, not past it
		{now.Add(30 * time.Second).Format(http.TimeFormat), []time.Duration{30 * time.Second}},
		{"soon", []time.Duration{DefaultBackoffBase / 2}}, // unparseable: jitter (C02)
	} {
		t.Run("honoured: "+tt.v, func(t *testing.T) {
			srv, s := newScripted(t, dated(tt.v), reply{status: 201, body: sandboxJSON})
			clk := newFakeClock(now)
			c := New(srv.URL, "k", WithClock(clk), WithRand(half), WithDeadline(deadline))
			if _, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"}); err != nil {
				t.Fatalf("CreateSandbox: %v", err)
			}
			if diff := cmp.Diff(tt.want, clk.Sleeps()); diff != "" {
				t.Errorf("sleeps (-want +got):\n%s", diff)
			}
			if n := len(s.Seen()); n != 2 {
				t.Errorf("server saw %d requests, want 2", n)
			}
		})
	}
}
