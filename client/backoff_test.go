package client

import (
	"math"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestBackoff(t *testing.T) {
	const base, cap = 250 * time.Millisecond, 8 * time.Second
	tests := []struct {
		name      string
		attempt   int
		base, cap time.Duration
		want      time.Duration
	}{
		{"first failure is base", 0, base, cap, 250 * time.Millisecond},
		{"doubles", 1, base, cap, 500 * time.Millisecond},
		{"doubles again", 4, base, cap, 4 * time.Second},
		{"reaches cap", 5, base, cap, 8 * time.Second},
		{"stays at cap", 6, base, cap, 8 * time.Second},
		{"negative attempt counts as 0", -5, base, cap, 250 * time.Millisecond},
		{"base above cap is lowered", 0, time.Minute, cap, 8 * time.Second},
		{"zero base takes default", 0, 0, cap, DefaultBackoffBase},
		{"zero cap takes default", 10, base, 0, DefaultBackoffCap},
		{"negative both take defaults", 2, -1, -1, time.Second},
		{"not a power-of-two cap", 3, time.Second, 5 * time.Second, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Backoff(tt.attempt, tt.base, tt.cap); got != tt.want {
				t.Errorf("Backoff(%d, %v, %v) = %v, want %v", tt.attempt, tt.base, tt.cap, got, tt.want)
			}
		})
	}
}

// C04: the window for absurd attempt numbers stays in (0, cap]: no overflow to a negative
// or zero shift result, no panic.
func TestCase_C04_BackoffWindowNeverOverflows(t *testing.T) {
	limits := []struct{ base, cap time.Duration }{
		{250 * time.Millisecond, 8 * time.Second},
		{1, math.MaxInt64},
		{time.Second, time.Hour},
		{3, 7},
		{1<<62 + 1, math.MaxInt64}, // base·4 wraps around to 4 ns in int64
	}
	for _, l := range limits {
		for _, attempt := range []int{62, 63, 64, 65, 127, 1000, 10000, math.MaxInt, math.MinInt} {
			w := Backoff(attempt, l.base, l.cap)
			if w <= 0 || w > l.cap {
				t.Errorf("Backoff(%d, %v, %v) = %v, want in (0, %v]", attempt, l.base, l.cap, w, l.cap)
			}
			if want := backoffOracle(attempt, l.base, l.cap); w != want {
				t.Errorf("Backoff(%d, %v, %v) = %v, want %v", attempt, l.base, l.cap, w, want)
			}
		}
	}
}

// Property behind C04: for any attempt and positive limits the window is in (0, cap],
// never shrinks as attempts grow, and its jittered sleep stays in [0, window).
func TestBackoffProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := time.Duration(rapid.OneOf(
			rapid.Int64Range(1, math.MaxInt64),
			rapid.Int64Range(1, 1<<40),
		).Draw(t, "base"))
		cap := time.Duration(rapid.Int64Range(1, math.MaxInt64).Draw(t, "cap"))
		attempt := rapid.Int().Draw(t, "attempt")
		w := Backoff(attempt, base, cap)
		if w <= 0 || w > cap {
			t.Fatalf("Backoff(%d, %d, %d) = %d, want in (0, cap]", attempt, base, cap, w)
		}
		if want := backoffOracle(attempt, base, cap); w != want {
			t.Fatalf("Backoff(%d, %d, %d) = %d, want %d", attempt, base, cap, w, want)
		}
		if attempt < math.MaxInt {
			if next := Backoff(attempt+1, base, cap); next < w {
				t.Fatalf("window shrank: attempt %d → %d, %d → %d", attempt, w, attempt+1, next)
			}
		}
		r := rapid.Float64Range(0, 1).Draw(t, "r")
		if s := jitter(w, r); s < 0 || s >= w {
			t.Fatalf("jitter(%d, %v) = %d, want in [0, %d)", w, r, s, w)
		}
	})
}

// backoffOracle is min(cap, base·2^attempt) in exact arithmetic, for positive base ≤ cap.
func backoffOracle(attempt int, base, cap time.Duration) time.Duration {
	base = min(base, cap)
	if attempt < 0 {
		attempt = 0
	}
	if attempt > 200 { // 2^200 ns is past any Duration
		return cap
	}
	w := new(big.Int).Lsh(big.NewInt(int64(base)), uint(attempt))
	if w.Cmp(big.NewInt(int64(cap))) > 0 {
		return cap
	}
	return time.Duration(w.Int64())
}

func TestJitterClampsAFaultySource(t *testing.T) {
	const w = 8 * time.Second
	for _, r := range []float64{0, 0.5, 0.9999999999999999, 1, 2, -1, math.NaN(), math.Inf(1), math.Inf(-1)} {
		if s := jitter(w, r); s < 0 || s >= w {
			t.Errorf("jitter(%v, %v) = %v, want in [0, %v)", w, r, s, w)
		}
	}
	if s := jitter(w, 0.5); s != 4*time.Second {
		t.Errorf("jitter(%v, 0.5) = %v, want 4s", w, s)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		name   string
		v      string
		want   time.Duration
		wantOK bool
	}{
		{"delta seconds", "7", 7 * time.Second, true},
		{"zero means at once", "0", 0, true},
		{"leading zeros", "007", 7 * time.Second, true},
		{"surrounding space", " 5 ", 5 * time.Second, true},
		{"a day", "86400", 24 * time.Hour, true},
		{"C30 over a day is still seconds", "86401", 86401 * time.Second, true},
		{"C30 a date-like number is seconds", "20251231", 20251231 * time.Second, true},
		{"the longest Duration in whole seconds", "9223372036", 9223372036 * time.Second, true},
		{"C30 one more saturates", "9223372037", maxRetryAfter, true},
		{"C30 twenty nines saturate", "99999999999999999999", maxRetryAfter, true},
		{"C30 sixty digits saturate", strings.Repeat("9", 60), maxRetryAfter, true},
		{"leading zeros do not count", strings.Repeat("0", 40) + "91", 91 * time.Second, true},
		{"C02 negative", "-3", 0, false},
		{"plus sign", "+5", 0, false},
		{"fraction", "1.5", 0, false},
		{"exponent", "1e9", 0, false},
		{"garbage", "soon", 0, false},
		{"empty", "", 0, false},
		{"C01 date 7 s ahead", date(7 * time.Second), 7 * time.Second, true},
		{"C01 date 1 h ago", date(-time.Hour), 0, true},
		{"date now", date(0), 0, true},
		{"RFC 850 date", now.Add(30 * time.Second).Format(time.RFC850), 30 * time.Second, true},
		{"ANSI C date", now.Add(30 * time.Second).Format(time.ANSIC), 30 * time.Second, true},
		{"C30 date years ahead", "Fri, 31 Dec 9999 23:59:59 GMT", maxRetryAfter, true},
		{"unparseable date", "Fri, 32 Dec 2030 23:59:59 GMT", 0, false},
		{"date long ago", "Mon, 01 Jan 0001 00:00:00 GMT", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tt.v, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.v, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestRetryAfterHeaderReadsDateAgainstServerDate(t *testing.T) {
	server := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	local := server.Add(-time.Hour) // the client's clock lags the server's by an hour
	h := http.Header{}
	h.Set("Retry-After", server.Add(7*time.Second).Format(http.TimeFormat))
	h.Set("Date", server.Format(http.TimeFormat))
	if got, ok := retryAfterHeader(h, local); got != 7*time.Second || !ok {
		t.Errorf("with Date: got %v, %v; want 7s, true", got, ok)
	}
	h.Del("Date")
	if got, ok := retryAfterHeader(h, server.Add(-3*time.Second)); got != 10*time.Second || !ok {
		t.Errorf("without Date: got %v, %v; want 10s, true", got, ok)
	}
}
