package main

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// finiteFloats makes every float flag of every command in the tree refuse NaN and ±Inf as it
// parses, so such a value is a usage error (exit 2) before any command runs, like any value
// that does not parse. strconv.ParseFloat, under pflag's float flags, takes "NaN", "Inf" and
// "infinity", and a NaN passes every "x < 0" check a command makes of its flags: `berth plan
// --link-gbps NaN` printed "guests that leave in time -9223372036854775808 of 20".
func finiteFloats(root *cobra.Command) {
	wrap := func(f *pflag.Flag) {
		if t := f.Value.Type(); t == "float64" || t == "float32" {
			f.Value = finiteFloat{f.Value}
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
