package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCase_C31_StartupRefusesATTLShorterThanTwoHeartbeats: `berth server` and `berth dev` with the
// case's settings (reservation TTL 3 s, heartbeats every 20 s) stop at startup with an error
// naming both flags, before writing anything into the data directory.
func TestCase_C31_StartupRefusesATTLShorterThanTwoHeartbeats(t *testing.T) {
	t.Setenv("BERTH_NODE_TOKEN", "node-token")
	for _, cmd := range []string{"server", "dev"} {
		t.Run(cmd, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			var out, errOut bytes.Buffer
			err := Main(context.Background(), []string{cmd, "--data", data, "--listen", "127.0.0.1:0",
				"--reservation-ttl", "3s", "--heartbeat-interval", "20s"}, strings.NewReader(""), &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), "--reservation-ttl (3s)") || !strings.Contains(err.Error(), "--heartbeat-interval (20s)") {
				t.Fatalf("berth %s with TTL 3s, heartbeat 20s: %v; want an error naming --reservation-ttl and --heartbeat-interval", cmd, err)
			}
			if _, err := os.Stat(data); !os.IsNotExist(err) {
				entries, _ := os.ReadDir(data)
				t.Fatalf("berth %s wrote into its data directory before refusing: %v %v", cmd, entries, err)
			}
		})
	}
}
