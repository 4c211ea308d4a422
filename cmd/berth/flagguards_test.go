package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestFloatFlagsRefuseNonFinite (a new user's report: `berth plan --link-gbps NaN` exited 0
// and printed "guests that leave in time -9223372036854775808 of 20"): every float flag of
// every command — berth plan's, berth sim's, berth bench's, the server's — refuses NaN and
// ±Inf with exit 2 naming the flag, before the command runs, as `--link-gbps -1` is refused.
func TestFloatFlagsRefuseNonFinite(t *testing.T) {
	// A build that takes the value runs the command: keep what it could reach on this test's
	// own ground (a data directory, port 0, a server URL nothing listens on) and end it soon.
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	t.Setenv("BERTH_URL", "http://127.0.0.1:1")
	type flagOf struct {
		cmd  []string
		flag string
	}
	var floats []flagOf
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if typ := f.Value.Type(); typ == "float64" || typ == "float32" {
				cmd := path
				if c.Flags().Lookup("listen") != nil {
					cmd = append(slices.Clone(path), "--listen", "127.0.0.1:0")
				}
				if c.Flags().Lookup("data") != nil {
					cmd = append(slices.Clone(cmd), "--data", t.TempDir())
				}
				floats = append(floats, flagOf{cmd, f.Name})
			}
		})
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(newRootCmd(&clientFlags{}), nil)
	seen := map[string]bool{}
	for _, f := range floats {
		seen[f.cmd[0]+" --"+f.flag] = true
	}
	for _, must := range []string{"plan --link-gbps", "plan --memory-mb", "plan --interruption-rate", "sim --rate", "sim --pressure-knee", "sim --link-mbps"} {
		if !seen[must] {
			t.Fatalf("the walk found no float flag %q; found %v", must, seen)
		}
	}
	for _, f := range floats {
		for _, v := range []string{"NaN", "nan", "Inf", "+Inf", "-Inf", "infinity"} {
			args := append(append([]string(nil), f.cmd...), "--"+f.flag, v)
			var out, errOut bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := Main(ctx, args, strings.NewReader(""), &out, &errOut)
			cancel()
			msg := "no error"
			if err != nil {
				msg = errorMessage(err)
			}
			if exitCode(err) != exitInvalid || !strings.Contains(msg, "--"+f.flag+` "`+v+`": want a finite number`) || out.Len() != 0 {
				t.Errorf("berth %s: exit %d, %q, stdout %q; want exit 2 saying --%s wants a finite number, nothing printed",
					strings.Join(args, " "), exitCode(err), msg, out.String(), f.flag)
			}
		}
	}
	// Finite values still parse, and a knee outside (0, 1) is refused, not quietly replaced.
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"plan", "--link-gbps", "2.5"}, 0},
		{[]string{"plan", "--link-gbps", "1000000"}, 0}, // 1e300 is refused: TestPlanSimFlagsBounded
		{[]string{"sim", "--pressure-knee", "5"}, exitInvalid},
		{[]string{"sim", "--pressure-knee", "0"}, exitInvalid},
	} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), tc.args, strings.NewReader(""), &out, &errOut)
		if exitCode(err) != tc.code || tc.code == 0 && strings.Contains(out.String(), "-9223372036854775808") {
			t.Errorf("berth %v: exit %d (%v), want %d; stdout %q", tc.args, exitCode(err), err, tc.code, out.String())
		}
	}
}

// TestDurationFlagsRefuseNegative (a reviewer's report: `berth server --stale-after -1s
// --lease-ephemeral -5s` started, each setting silently its default): every duration flag
// of every command refuses a negative value with exit 2 naming the flag, before the command
// runs — but for a flag whose usage gives a negative value a meaning (sim's --cordon-delay).
func TestDurationFlagsRefuseNegative(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	t.Setenv("BERTH_URL", "http://127.0.0.1:1")
	seen := map[string]bool{}
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Value.Type() != "duration" {
				return
			}
			seen[path[0]+" --"+f.Name] = true
			args := append(slices.Clone(path), "--"+f.Name, "-1s")
			var out, errOut bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if strings.Contains(f.Usage, "negative") {
				if err := f.Value.Set("-1s"); err != nil {
					t.Errorf("berth %s --%s -1s: %v; its usage gives a negative value a meaning", strings.Join(path, " "), f.Name, err)
				}
				return
			}
			err := Main(ctx, args, strings.NewReader(""), &out, &errOut)
			msg := "no error"
			if err != nil {
				msg = errorMessage(err)
			}
			if exitCode(err) != exitInvalid || !strings.Contains(msg, "--"+f.Name+` "-1s": want a duration of 0 or more`) || out.Len() != 0 {
				t.Errorf("berth %s: exit %d, %q; want exit 2 saying --%s wants a duration of 0 or more", strings.Join(args, " "), exitCode(err), msg, f.Name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub, append(slices.Clone(path), sub.Name()))
		}
	}
	root := newRootCmd(&clientFlags{})
	guardFlagValues(root) // as execute does: the walk's own Set above meets the guarded values
	for _, sub := range root.Commands() {
		walk(sub, []string{sub.Name()})
	}
	for _, must := range []string{"server --stale-after", "server --lease-ephemeral", "server --reservation-ttl", "agent --soft-cordon", "dev --stale-after"} {
		if !seen[must] {
			t.Errorf("the walk found no duration flag %q", must)
		}
	}
}

// TestPlanSimFlagsBounded (`berth plan --link-gbps 1e300` printed "+Inf MiB/s"): every flag of
// plan and sim whose large finite values overflowed what the command prints refuses a value
// past its bound with exit 2 naming the flag and the bound, printing nothing, and takes the
// bound itself with every figure finite.
func TestPlanSimFlagsBounded(t *testing.T) {
	sim := []string{"sim", "--creates", "10", "--policies", "committed", "--lifetime", "1h"}
	for _, tc := range []struct {
		cmd       []string
		flag      string
		over, max string
	}{
		{[]string{"plan"}, "--link-gbps", "1e300", "1000000"},
		{[]string{"plan"}, "--memory-mb", "1e308", "1073741824"},
		{[]string{"plan", "--guests", "1000000"}, "--interruption-rate", "1e306", "3600"},
		{[]string{"plan", "--memory-mb", "1073741824", "--notice", "1ns"}, "--guests", "9223372036854775807", "1000000"},
		{sim, "--host-mb", "9223372036854775807", "1073741824"},
		{sim, "--headroom-mb", "32769", "32768"}, // at most --host-mb, 32768 by default
		{sim, "--lifetime-sigma", "1e300", "10"},
	} {
		t.Run(tc.cmd[0]+tc.flag, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := Main(context.Background(), append(slices.Clone(tc.cmd), tc.flag, tc.over), strings.NewReader(""), &out, &errOut)
			msg := errorMessage(err)
			if exitCode(err) != exitInvalid || !strings.Contains(msg, tc.flag+" ") || !strings.Contains(msg, "want at most "+tc.max) || out.Len() != 0 {
				t.Errorf("berth %v %s %s: exit %d, %q, stdout %q; want exit 2 naming %s and at most %s, nothing printed",
					tc.cmd, tc.flag, tc.over, exitCode(err), msg, out.String(), tc.flag, tc.max)
			}
			out.Reset()
			err = Main(context.Background(), append(slices.Clone(tc.cmd), tc.flag, tc.max), strings.NewReader(""), &out, &errOut)
			if err != nil || strings.Contains(out.String(), "Inf") || strings.Contains(out.String(), "-9223372036854775808") {
				t.Errorf("berth %v %s %s (the bound): %v; stdout:\n%s", tc.cmd, tc.flag, tc.max, err, out.String())
			}
		})
	}
}

// TestSimRateSpanBounded (`berth sim --rate 1e-300` put every create before the run): a rate
// whose --creates take more than 100 years on average is refused with exit 2, naming the flag
// as a person types it, and one inside the bound runs.
func TestSimRateSpanBounded(t *testing.T) {
	for _, tc := range []struct {
		rate string
		ok   bool
	}{{"1e-300", false}, {"0.000000001", false}, {"0.0000001", true}} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), []string{"sim", "--creates", "10", "--hosts", "2", "--policies", "committed", "--rate", tc.rate},
			strings.NewReader(""), &out, &errOut)
		msg := errorMessage(err)
		switch {
		case tc.ok && err != nil:
			t.Errorf("--rate %s (10 creates in 3 years): %v", tc.rate, err)
		case !tc.ok && (exitCode(err) != exitInvalid || !strings.Contains(msg, "--rate ") || !strings.Contains(msg, "100 years") ||
			strings.Contains(msg, "0.0000000000") || out.Len() != 0):
			t.Errorf("--rate %s: exit %d, %q, stdout %q; want exit 2 naming --rate and 100 years, nothing printed", tc.rate, exitCode(err), msg, out.String())
		}
	}
}
