package agent

import "slices"

// What the external tests (process_test.go) borrow from the tests inside: they drive the
// agent over the real process runtime, which imports this package, so they cannot live in
// it.
var (
	Call    = call
	ErrorOf = errorOf
)

// TestToken is the node token of the test agents.
const TestToken = testToken

// CloseListener closes the internal API listener New opened, for an agent whose Run never
// ran (Run closes it on its way out).
func CloseListener(a *Agent) { a.ln.Close() }

// CloseAppConns closes the app transport's idle connections into sandboxes, as Run does on
// its way out.
func CloseAppConns(a *Agent) { a.appTransport.CloseIdleConnections() }

// WarmReady returns the runtime ids of a's started warm guests of template, sorted.
func WarmReady(a *Agent, template string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id, w := range a.warm.guests {
		if w.started && w.entry.Template == template {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// RuntimeID returns the runtime id sandbox id runs as (itself unless the pool served it).
func RuntimeID(a *Agent, id string) string { return a.warm.ids.of(id) }
