package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartupRefusesNegativeBounds: `berth server` and `berth dev` refuse a negative tenant
// rate or burst, connection cap below -1, negative timeouts and a negative retention with an
// invalid_request naming the flag, before writing anything (and --tenant-exec-mb past 1 TiB,
// whose bytes would overflow) (a new user's trial found
// `--tenant-rate -5` silently meant "no limit").
func TestStartupRefusesNegativeBounds(t *testing.T) {
	t.Setenv("BERTH_NODE_TOKEN", strings.Repeat("t", 64))
	for _, flags := range [][]string{
		{"--tenant-rate", "-5"}, {"--tenant-burst", "-3"}, {"--max-conns", "-2"},
		{"--idle-timeout", "-1s"}, {"--body-timeout", "-1s"}, {"--body-min-rate", "-1"}, {"--retention", "-1h"},
		{"--app-wake-timeout", "-1s"}, {"--app-start-timeout", "-1s"},
		{"--tenant-exec-mb", "-1"}, {"--tenant-exec-mb", "1048577"}, {"--exec-inflight-mb", "-1"},
	} {
		for _, cmd := range []string{"server", "dev"} {
			t.Run(cmd+strings.Join(flags, "="), func(t *testing.T) {
				data := filepath.Join(t.TempDir(), "data")
				var out, errOut bytes.Buffer
				args := append([]string{cmd, "--data", data, "--listen", "127.0.0.1:0"}, flags...)
				// Bounded: a build that accepts the flags starts serving, and this ends it.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err := Main(ctx, args, strings.NewReader(""), &out, &errOut)
				// Exit 2 naming the flag: invalid_request from the command's own check, or a
				// usage error from the flag guard that refuses every negative duration.
				if exitCode(err) != exitInvalid || !strings.Contains(errorMessage(err), flags[0]) {
					t.Fatalf("berth %s %v: %v; want exit 2 naming %s", cmd, flags, err, flags[0])
				}
				if _, err := os.Stat(data); !os.IsNotExist(err) {
					t.Fatalf("berth %s %v wrote into its data directory before refusing: %v", cmd, flags, err)
				}
			})
		}
	}
}
