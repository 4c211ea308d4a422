package main

import (
	"bufio"
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
// take --app-wake-timeout and --app-start-timeout now (a negative one is refused before
// anything is written: TestStartupRefusesNegativeBounds), and `berth dev --app-wake-timeout
// 1ms` holds a request to a hibernated app that long: 503 app_wake_timeout, not the 30 s
// default's answer.
func TestDevTakesAppFlags(t *testing.T) {
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
