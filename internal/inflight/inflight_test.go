package inflight

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestTakeBounds: a key holds up to its bound, the sum up to its own; a refusal holds
// nothing; release frees exactly once; a request alone always fits.
func TestTakeBounds(t *testing.T) {
	b := New(15)
	r1, ok := b.Take("a", 6, 10)
	if !ok {
		t.Fatal("first 6 under a: refused")
	}
	if _, ok := b.Take("a", 5, 10); ok {
		t.Fatal("6+5 under a's bound of 10: taken")
	}
	r2, ok := b.Take("a", 4, 10)
	if !ok {
		t.Fatal("6+4 under a: refused at exactly the bound")
	}
	if _, ok := b.Take("b", 6, 10); ok {
		t.Fatal("10 held + 6 past the sum's bound of 15: taken")
	}
	r3, ok := b.Take("b", 5, 10)
	if !ok {
		t.Fatal("b's 5 to exactly the sum's bound: refused")
	}
	if a, all := b.Held("a"), b.sum; a != 10 || all != 15 {
		t.Fatalf("held a=%d all=%d, want 10 and 15", a, all)
	}
	r1()
	r1() // a second call frees nothing more
	if a, all := b.Held("a"), b.sum; a != 4 || all != 9 {
		t.Fatalf("after one release (twice): a=%d all=%d, want 4 and 9", a, all)
	}
	r2()
	r3()
	if b.sum != 0 || len(b.held) != 0 {
		t.Fatalf("all released: sum %d, %d keys kept", b.sum, len(b.held))
	}
	big, ok := b.Take("a", 100, 10)
	if !ok {
		t.Fatal("a request larger than every bound, alone: refused (it could never run)")
	}
	if _, ok := b.Take("c", 1, 10); ok {
		t.Fatal("the sum is past its bound: a second request taken")
	}
	big()
	if _, ok := b.Take("c", -5, 10); !ok {
		t.Fatal("a negative size (counted as 0) refused")
	}
}

// TestNoBound: bounds of 0 or less, and a nil Bytes, refuse nothing.
func TestNoBound(t *testing.T) {
	for _, b := range []*Bytes{New(0), New(-1), nil} {
		for range 100 {
			if _, ok := b.Take("k", 1<<40, 0); !ok {
				t.Fatalf("%+v refused", b)
			}
		}
	}
}

// TestConcurrentTakes: under -race, many goroutines taking and releasing never let the sum
// pass its bound nor a key its own, and everything is given back.
func TestConcurrentTakes(t *testing.T) {
	b := New(100)
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak, peakKey := int64(0), int64(0)
	for g := range 16 {
		wg.Go(func() {
			key := string(rune('a' + g%4))
			for i := range 500 {
				release, ok := b.Take(key, int64(1+(g+i)%30), 40)
				if !ok {
					continue
				}
				k := b.Held(key)
				b.mu.Lock()
				all := b.sum
				b.mu.Unlock()
				mu.Lock()
				peak, peakKey = max(peak, all), max(peakKey, k)
				mu.Unlock()
				release()
			}
		})
	}
	wg.Wait()
	if b.sum != 0 || peak > 100 || peakKey > 40 {
		t.Fatalf("after every release: sum %d (want 0); peak sum %d (bound 100), peak per key %d (bound 40)", b.sum, peak, peakKey)
	}
}

// TestMiB: a bound in MiB saturates instead of overflowing into a negative (no) bound.
func TestMiB(t *testing.T) {
	for in, want := range map[int64]int64{0: 0, -1: -1 << 20, 256: 256 << 20, 1 << 62: 1 << 50} {
		if got := MiB(in); got != want {
			t.Errorf("MiB(%d) = %d, want %d", in, got, want)
		}
	}
}

// TestSlots: n at once; one more waits its wait and gets ErrNoSlot, or ctx's error when ctx
// ends first; a slot given back serves the next.
func TestSlots(t *testing.T) {
	s := NewSlots(1)
	release, err := s.Take(context.Background(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Take(context.Background(), time.Millisecond); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("a second take with the one slot held: %v, want ErrNoSlot", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("a take on an ended context: %v, want context.Canceled", err)
	}
	release()
	if _, err := s.Take(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("a take after the slot came back: %v", err)
	}
}
