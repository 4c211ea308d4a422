package main

import (
	"context"
	"testing"
	"time"
)

// TestBenchCreate_BoundedAndClean: `berth bench create` stops at its attempt bound, counts
// what it created, and its cleanup leaves the ledger empty (LED-3).
func TestBenchCreate_BoundedAndClean(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.AgentMemoryMiB = 8192 })
	res, err := runBenchCreate(context.Background(), benchConfig{
		URLs: []string{st.URL}, Key: st.AdminKey, Clients: 4, Duration: 30 * time.Second,
		MaxCreates: 12, Template: "shell", Cleanup: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 12 || res.Created == 0 || len(res.Latency) != res.Created {
		t.Fatalf("result %+v: want exactly 12 attempts and some creates", res)
	}
	if res.AfterCleanup != 0 {
		t.Fatalf("reservations after cleanup = %d, want 0", res.AfterCleanup)
	}
	if _, err := runBenchCreate(context.Background(), benchConfig{URLs: []string{st.URL}, Clients: 0}); err == nil {
		t.Fatal("a bench with no clients must be refused")
	}
}
