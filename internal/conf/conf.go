// Package conf holds the one rule for configuration defaults shared by the server and the
// agent: a knob left at zero (or set negative) takes its documented default.
package conf

import "time"

// Or returns v when it is positive, else def.
func Or[T int | int64 | float64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
