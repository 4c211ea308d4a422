package sim

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/deptest"
)

// TestSimLinksOnlyTheSharedLogic: the simulator (SIM-1) calls the same pure code as the
// control plane (root, admission, placement, evacuate; the SDK's backoff is berth.Backoff)
// and links no other package of the project: not the client SDK, a store, the server or
// the agent (docs/ARCHITECTURE.md).
func TestSimLinksOnlyTheSharedLogic(t *testing.T) {
	const mod = "github.com/berth-dev/berth"
	allowed := map[string]bool{mod: true, mod + "/admission": true, mod + "/placement": true, mod + "/evacuate": true}
	for _, dep := range deptest.Deps(t, ".") {
		if (dep == mod || strings.HasPrefix(dep, mod+"/")) && !allowed[dep] {
			t.Errorf("sim depends on %s; it may import root, admission, placement and evacuate of this module", dep)
		}
	}
}
