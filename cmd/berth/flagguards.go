package main

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/berth-dev/berth"
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

// upTo is a numeric flag's value and the most a command takes of it (max, in unit), for
// checkUpTo. Whole-number flags are given as float64: every bound here is far below 2^53.
type upTo struct {
	flag  string // "--link-gbps"
	value float64
	max   float64
	unit  string // "Gbps", "MiB"; "" for a count
}

// checkUpTo refuses the first value above its bound as invalid_request (exit 2) naming the
// flag, the way plan and sim refuse their other out-of-range flags. The guard above lets every
// finite number through, and a large one can still overflow what a command prints: `berth
// plan --link-gbps 1e300` printed "+Inf MiB/s".
func checkUpTo(bounds ...upTo) error {
	for _, b := range bounds {
		if b.value > b.max {
			unit := ""
			if b.unit != "" {
				unit = " " + b.unit
			}
			return berth.Errorf(berth.EInvalidRequest, "%s %s: want at most %s%s", b.flag, number(b.value), number(b.max), unit)
		}
	}
	return nil
}

// number writes x as a person types it: digits from 0.0001 to 2^53, where a float64 holds every
// whole number ("1000001", "2.5"), an exponent outside ("1e+300", "9.223372036854776e+18",
// "1e-300").
func number(x float64) string {
	if a := math.Abs(x); a < 1<<53 && (a >= 1e-4 || a == 0) {
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}
