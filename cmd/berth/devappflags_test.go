package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// TestDevTakesAppFlags (a new user's report, item 8): docs/API.md cites --app-wake-timeout,
// which `berth server` took and `berth dev` — where a first user tries apps — did not. Both
// take --app-wake-timeout and --app-start-timeout now, refuse a negative one before anything
// is written, and `berth dev --app-wake-timeout 1ms` holds a request to a hibernated app that
// long: 503 app_wake_timeout, not the 30 s default's answer.
func TestDevTakesAppFlags(t *testing.T) {
	t.Setenv("BERTH_NODE_TOKEN", strings.Repeat("t", 64))
	for _, cmd := range []string{"dev", "server"} {
		for _, flag := range []string{"--app-wake-timeout", "--app-start-timeout"} {
			data := filepath.Join(t.TempDir(), "data")
			var out, errOut bytes.Buffer
			// Bounded: a build that takes the value starts serving, and this ends it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := Main(ctx, []string{cmd, "--data", data, "--listen", "127.0.0.1:0", flag, "-1s"},
				strings.NewReader(""), &out, &errOut)
			cancel()
			// Exit 2 naming the flag (the flag guard refuses every negative duration).
			if exitCode(err) != exitInvalid || !strings.Contains(errorMessage(err), flag) {
				t.Errorf("berth %s %s -1s: %v; want exit 2 naming it", cmd, flag, err)
			}
			if _, err := os.Stat(data); !os.IsNotExist(err) {
				t.Errorf("berth %s %s -1s wrote into its data directory before refusing: %v", cmd, flag, err)
			}
		}
	}

	data := t.TempDir()
	args := []string{"dev", "--listen", "127.0.0.1:0", "--data", data, "--agents", "1", "--heartbeat-interval", "100ms",
		"--runtime", runtimeProcess, "--app-wake-timeout", "1ms"}
	if os.Geteuid() != 0 {
		args = append(args, "--insecure")
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := Main(ctx, args, strings.NewReader(""), pw, io.Discard)
		pw.CloseWithError(err)
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		go func() { _, _ = io.Copy(io.Discard, pr) }()
		if err := <-done; err != nil {
			t.Errorf("berth dev ended with %v", err)
		}
	})
	first, err := bufio.NewReader(pr).ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(first), "Berth dev is up at ")
	if err != nil || !ok {
		t.Fatalf("berth %v: %q, %v; want it up", args, first, err)
	}
	key, err := os.ReadFile(filepath.Join(data, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(url, strings.TrimSpace(string(key)))
	if _, err := c.CreateApp(ctx, berth.AppRequest{Name: "sleepy", AppSpec: appSpec("awake", 256), Desired: berth.DesireHibernated}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	code, _, body, ecode := getApp(t, url, "sleepy", "/")
	if code != http.StatusServiceUnavailable || ecode != berth.EWakeTimeout || time.Since(began) > 10*time.Second {
		t.Fatalf("request to the hibernated app under --app-wake-timeout 1ms: %d %s %q after %s; want 503 app_wake_timeout at once",
			code, ecode, body, time.Since(began))
	}
}
