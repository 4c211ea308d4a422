package main

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// guardFlagValues makes every float flag of every command in the tree refuse NaN and ±Inf as it
// parses, so such a value is a usage error (exit 2) before any command runs, like any value
// that does not parse. strconv.ParseFloat, under pflag's float flags, takes "NaN", "Inf" and
// "infinity", and a NaN passes every "x < 0" check a command makes of its flags: `berth plan
// --link-gbps NaN` printed "guests that leave in time -9223372036854775808 of 20".
//
// It makes every duration flag refuse a negative value the same way, but for a flag whose
// usage gives a negative value a meaning (it says "negative"): `berth server --stale-after
// -1s --lease-ephemeral -5s` started, each silently its default.
func guardFlagValues(root *cobra.Command) {
	wrap := func(f *pflag.Flag) {
		switch t := f.Value.Type(); {
		case t == "float64" || t == "float32":
			f.Value = finiteFloat{f.Value}
		case t == "duration" && !strings.Contains(f.Usage, "negative"):
			f.Value = nonNegativeDuration{f.Value}
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalNonPersistentFlags().VisitAll(wrap)
		c.PersistentFlags().VisitAll(wrap)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// finiteFloat is a float flag's value that refuses a number that is not finite.
type finiteFloat struct{ pflag.Value }

// errNotFinite words the refusal the way usageText shows a flag's error: `--link-gbps "NaN":
// want a finite number`.
var errNotFinite = errors.New("a finite number")

func (f finiteFloat) Set(s string) error {
	if x, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil && (math.IsNaN(x) || math.IsInf(x, 0)) {
		return errNotFinite
	}
	return f.Value.Set(s)
}

// nonNegativeDuration is a duration flag's value that refuses a negative duration.
type nonNegativeDuration struct{ pflag.Value }

// errNegative words the refusal as usageText shows it: `--stale-after "-1s": want a duration of
// 0 or more`.
var errNegative = errors.New("a duration of 0 or more")

func (d nonNegativeDuration) Set(s string) error {
	if x, err := time.ParseDuration(strings.TrimSpace(s)); err == nil && x < 0 {
		return errNegative
	}
	return d.Value.Set(s)
}
