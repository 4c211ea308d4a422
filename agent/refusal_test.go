package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestCreateBelowTheFloorIsTheRequestsFault: a create below berth.MinSandboxMiB, which no
// runtime starts, is refused as invalid_request before the runtime is asked — a code no
// host's quarantine counts (PLC-9) — while a start the runtime fails stays unavailable.
// Before, the runtime's failure at 1 MiB was unavailable on every host, and three tenant
// creates quarantined a whole gVisor fleet.
func TestCreateBelowTheFloorIsTheRequestsFault(t *testing.T) {
	starts := 0
	rt := &fakeRuntime{start: func(string) error { starts++; return nil }}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
	for _, mib := range []int64{1, berth.MinSandboxMiB - 1} {
		err := create(a, "tiny", mib)
		if berth.ErrorCode(err) != berth.EInvalidRequest {
			t.Fatalf("create of %d MiB: %v; want invalid_request", mib, err)
		}
	}
	if starts != 0 {
		t.Fatalf("the runtime was asked %d starts; want none", starts)
	}
	if err := create(a, "floor", berth.MinSandboxMiB); err != nil || starts != 1 {
		t.Fatalf("create at the floor: %v after %d starts; want it started", err, starts)
	}
}

// TestCreateKeepsTheRuntimesRefusal: a start the runtime refuses as invalid_request (the
// request is bad on any host) or unsupported (this host cannot) keeps that code, so the
// scheduler neither counts it toward this host's quarantine nor calls the host failing;
// any other runtime error is still the host's unavailable.
func TestCreateKeepsTheRuntimesRefusal(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"invalid", berth.Errorf(berth.EInvalidRequest, "memory must be positive"), berth.EInvalidRequest},
		{"unsupported", berth.Errorf(berth.EUnsupported, "template root unusable"), berth.EUnsupported},
		{"broken", errors.New("runsc: exited before its init was ready"), berth.EUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{start: func(string) error { return tc.err }}
			a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
			if err := create(a, "s1", 256); berth.ErrorCode(err) != tc.want {
				t.Fatalf("create: %v; want %s", err, tc.want)
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if len(a.guests) != 0 {
				t.Fatalf("guests after a refused start: %v; want none booked", a.guests)
			}
		})
	}
}

// TestVolumeOnAHostWithoutVolumesIsUnsupported: a volume create on an agent that keeps no
// volumes is this host's lack (unsupported: the next host is tried), not the request's fault
// (invalid_request, which says no host would take it).
func TestVolumeOnAHostWithoutVolumesIsUnsupported(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, &fakeRuntime{})
	err := a.Create(context.Background(), berth.AgentCreate{ID: "v1", MemoryMiB: 256, Stateful: true, Volume: "acme/data",
		ExpiresAt: time.Now().Add(time.Hour)})
	if berth.ErrorCode(err) != berth.EUnsupported {
		t.Fatalf("volume create on a host without volumes: %v; want unsupported", err)
	}
}

// TestWarmPoolBelowTheFloorRefused: a warm pool entry below berth.MinSandboxMiB is a bad
// configuration — no create may ask for that size, so its guests would never serve one.
func TestWarmPoolBelowTheFloorRefused(t *testing.T) {
	cfg := DefaultConfig()
	cfg.WarmPool = []WarmPoolEntry{{Template: "shell", MemoryMiB: 16, Size: 1}}
	if a, err := New(cfg, &fakeRuntime{}); berth.ErrorCode(err) != berth.EInvalidRequest {
		if a != nil {
			a.ln.Close()
		}
		t.Fatalf("New with a 16 MiB warm pool: %v; want invalid_request", err)
	}
}
