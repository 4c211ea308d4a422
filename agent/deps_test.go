package agent

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/deptest"
)

// TestAgentImportsNoDriver: one dependency direction for runtimes (AGT-3). Package agent
// defines Runtime and the drivers under agent/runtime/ (gvisor, process, noop and their
// helpers) implement it, importing agent; agent links none of them, directly or not.
// cmd/berth picks a driver and wires it.
func TestAgentImportsNoDriver(t *testing.T) {
	const drivers = "github.com/berth-dev/berth/agent/runtime/"
	for _, dep := range deptest.Deps(t, ".") {
		if strings.HasPrefix(dep, drivers) {
			t.Errorf("agent depends on %s; the drivers import agent, never the reverse", dep)
		}
	}
}
