package admission

import (
	"testing"
	"time"
)

// TestADM8_PressureGateDoesNotChatter feeds an oscillating series around the close line:
// intake closes once, stays closed while readings swing across the close line, and reopens
// only after the hold time spent below the open line.
func TestADM8_PressureGateDoesNotChatter(t *testing.T) {
	g := DefaultPressureGate()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	closes, opens := 0, 0
	open := true
	step := func(i int, p float64) {
		now := t0.Add(time.Duration(i) * time.Second)
		was := open
		open = g.Observe(p, now)
		switch {
		case was && !open:
			closes++
		case !was && open:
			opens++
		}
	}
	i := 0
	for ; i < 60; i++ { // oscillate 9 % ↔ 11 % around the 10 % close line
		step(i, 10+float64(1-2*(i%2)))
	}
	if closes != 1 || opens != 0 || open {
		t.Fatalf("oscillating around the close line: %d closes, %d opens, open=%v; want 1 close and no reopen", closes, opens, open)
	}
	for j := 0; j < 10; j, i = j+1, i+1 { // calm, but only for 10 s
		step(i, 1)
	}
	step(i, 3) // a reading above the open line restarts the hold
	i++
	if open {
		t.Fatal("reopened before the hold time below the open line")
	}
	readings := 0
	for !open && readings < 100 {
		step(i, 1)
		i++
		readings++
	}
	// The first calm reading starts the hold; 15 s later (the 16th, one per second) reopens.
	if !open || readings != 16 || opens != 1 || closes != 1 {
		t.Fatalf("reopened after %d calm readings (open=%v, %d opens, %d closes); want at the 16th, once", readings, open, opens, closes)
	}
}
