package evacuate

import (
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/deptest"
)

// TestEvacuateIsPure: the triage (SPOT-3) and `berth plan`'s arithmetic (PLAN-1) link nothing
// outside the standard library but the domain root: no object-store or cloud SDK
// (gocloud.dev, cloud.google.com, AWS, Azure); the snapshot store that needs them is package
// snapshot (docs/ARCHITECTURE.md).
func TestEvacuateIsPure(t *testing.T) {
	var extra []string
	for _, dep := range deptest.Deps(t, ".") {
		if dep == "github.com/berth-dev/berth" {
			continue
		}
		// Name each outside source once: "gocloud.dev/blob", "github.com/aws/aws-sdk-go-v2"…
		parts := strings.SplitN(dep, "/", 4)
		if src := strings.Join(parts[:min(len(parts), 3)], "/"); !slices.Contains(extra, src) {
			extra = append(extra, src)
		}
	}
	if len(extra) > 0 {
		t.Errorf("evacuate links %s; it may import the standard library and the root only", strings.Join(extra, ", "))
	}
}
