package gvisor

import (
	"context"
	"testing"

	"github.com/berth-dev/berth"
)

// BenchmarkExec measures one exec through a relay (runsc exec + the relay + the init).
func BenchmarkExec(b *testing.B) {
	r := needRuntime(b)
	ctx := context.Background()
	if err := r.Start(ctx, Spec{ID: "gv-bench", Template: "shell", MemoryMiB: 256}); err != nil {
		b.Fatal(err)
	}
	defer r.Stop(ctx, "gv-bench")
	for b.Loop() {
		if _, err := r.Exec(ctx, "gv-bench", berth.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStart measures a start and a stop of a shell sandbox.
func BenchmarkStart(b *testing.B) {
	r := needRuntime(b)
	ctx := context.Background()
	for b.Loop() {
		if err := r.Start(ctx, Spec{ID: "gv-bench-start", Template: "shell", MemoryMiB: 256}); err != nil {
			b.Fatal(err)
		}
		r.Stop(ctx, "gv-bench-start")
	}
}
