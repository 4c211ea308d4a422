package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// testPinVolume: the first pin of a tenant's volume name wins and later pins learn its
// host; names are per tenant; an unknown volume is ErrNotFound (POOL-2).
func testPinVolume(t *testing.T, s berth.Store) {
	ctx := t.Context()
	if _, err := s.Volume(ctx, "acme", "pgdata"); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("unknown volume: %v", err)
	}
	v, err := s.PinVolume(ctx, berth.Volume{Tenant: "acme", Name: "pgdata", AgentID: "a1"}, "test", T0)
	if err != nil || v.AgentID != "a1" || !v.CreatedAt.Equal(T0) {
		t.Fatalf("first pin: %+v, %v", v, err)
	}
	v, err = s.PinVolume(ctx, berth.Volume{Tenant: "acme", Name: "pgdata", AgentID: "a2"}, "test", at(time.Second))
	if err != nil || v.AgentID != "a1" {
		t.Fatalf("second pin: %+v, %v; want the first host", v, err)
	}
	if v, err := s.PinVolume(ctx, berth.Volume{Tenant: "other", Name: "pgdata", AgentID: "a2"}, "test", T0); err != nil || v.AgentID != "a2" {
		t.Fatalf("another tenant's volume of the same name: %+v, %v", v, err)
	}
	if got, err := s.Volume(ctx, "acme", "pgdata"); err != nil || got.AgentID != "a1" {
		t.Fatalf("Volume: %+v, %v", got, err)
	}
	evs, err := s.Events(ctx, berth.EventFilter{Entity: "volume/"})
	if err != nil || len(evs) != 2 {
		t.Fatalf("volume events: %+v, %v; want one per pin that happened", evs, err)
	}
}
