package gvisor

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestTemplateRootGoneIsUnsupported: a start whose template root this host no longer has is
// this host's lack — unsupported, so the scheduler tries the next host — never
// invalid_request, which says the request is bad on every host (and is not retried
// elsewhere).
func TestTemplateRootGoneIsUnsupported(t *testing.T) {
	needRuntime(t) // skips without runsc or root
	root := t.TempDir()
	r, err := New(Config{Dir: t.TempDir(), Rootfs: map[string]string{"gone": root}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer r.Close()
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Start(ctx, Spec{ID: "gv-gone", Template: "gone", MemoryMiB: 256})
	if berth.ErrorCode(err) != berth.EUnsupported {
		r.Stop(ctx, "gv-gone")
		t.Fatalf("Start with its template root gone: %v; want unsupported", err)
	}
}
