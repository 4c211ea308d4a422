package admission

import "time"

// PressureGate is the hysteresis of ADM-8: intake closes as soon as memory pressure (PSI
// "some avg10", percent) goes above Close, and reopens only after it has stayed below Open
// for Hold. Between the two lines nothing changes, so a reading that hovers at the boundary
// cannot make intake chatter. Time is an input; the zero value is an open gate with no
// lines, so DefaultPressureGate gives the documented defaults.
type PressureGate struct {
	Close float64       // percent; above it intake closes (default 10)
	Open  float64       // percent; below it, for Hold, intake reopens (default 2)
	Hold  time.Duration // default 15 s

	closed     bool
	belowSince time.Time
}

// DefaultPressureGate returns the ADM-8 defaults: close above 10 %, reopen after 15 s
// below 2 %.
func DefaultPressureGate() PressureGate {
	return PressureGate{Close: 10, Open: 2, Hold: 15 * time.Second}
}

// Observe feeds one pressure reading taken at now and reports whether intake is open.
func (g *PressureGate) Observe(pressure float64, now time.Time) bool {
	if !g.closed {
		if g.Close > 0 && pressure > g.Close {
			g.closed, g.belowSince = true, time.Time{}
		}
		return !g.closed
	}
	if pressure >= g.Open {
		g.belowSince = time.Time{} // not calm yet: the hold starts over
		return false
	}
	if g.belowSince.IsZero() {
		g.belowSince = now
	}
	if now.Sub(g.belowSince) >= g.Hold {
		g.closed, g.belowSince = false, time.Time{}
	}
	return !g.closed
}

// Closed reports whether the gate is closed, without a new reading.
func (g *PressureGate) Closed() bool { return g.closed }
